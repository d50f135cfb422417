"""The SAELens side of bench_saes.py: run with a Python that has sae-lens 6 (not interp).

For each case of the JSON given, builds the SAE with SAELens's own classes, fills its
parameters with seeded random numbers, saves it with ``save_model`` (plus
``activation_scaler.json`` for ``expected_average_only_in``, as SAELens's trainer saves a
checkpoint), loads it back with ``SAE.load_from_disk`` (``TrainingSAE`` for ``batchtopk``,
which SAELens has only as a training SAE), and writes the input, SAELens's features and
output, and the median seconds of ``encode`` to the case's folder.

    python benchmarks/saelens_side.py CASES.json OUT_DIR [build|time|readback]

``time`` loads the folders built before and only times ``encode`` again, so that the caller
can alternate rounds of SAELens and interp (load on a shared machine hits both alike).
``readback`` loads each case's ``interp_saved`` folder (interp's ``SAE.save`` of the case, which
experiments/parity.py writes) with SAELens's ``load_from_disk`` and writes its features and
output of the same input to ``interp_saved/saelens_readback.safetensors``, or SAELens's error
to ``interp_saved/saelens_readback_error.txt``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
from sae_lens.saes.sae import SAE, TrainingSAE
from safetensors.torch import save_file

SCALES = {"W_enc": None, "W_dec": None, "W_skip": None, "threshold": 0.3, "r_mag": 0.2}


def fill(sae, g: torch.Generator) -> None:
    """Seeded random parameters: matrices scaled by 1/sqrt(rows), vectors by 0.3."""
    with torch.no_grad():
        for name, p in sae.named_parameters():
            if name == "threshold":
                p.copy_(torch.rand(p.shape, generator=g) * 0.3)
            elif p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[0] ** -0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * SCALES.get(name, 0.3))


def time_again(cases: list[dict], out: str) -> None:
    for case in cases:
        folder = Path(out) / case["name"]
        cls = TrainingSAE if case["training"] else SAE
        loaded = cls.load_from_disk(str(folder))
        if case.get("scale") is not None:
            loaded.fold_activation_norm_scaling_factor(case["scale"])
        x = torch.randn(case["x_shape"], generator=torch.Generator().manual_seed(1)) * 1.5
        times = []
        with torch.no_grad():
            loaded.encode(x)
            for _ in range(case["repeat"]):
                start = time.perf_counter()
                loaded.encode(x)
                times.append(time.perf_counter() - start)
        seconds = {"encode_s": statistics.median(times)}
        (folder / "saelens_time.json").write_text(json.dumps(seconds))


def read_back(cases: list[dict], out: str) -> None:
    for case in cases:
        folder = Path(out) / case["name"] / "interp_saved"
        cls = TrainingSAE if case["training"] else SAE
        x = torch.randn(case["x_shape"], generator=torch.Generator().manual_seed(1)) * 1.5
        try:
            loaded = cls.load_from_disk(str(folder))
            loaded.eval()
            with torch.no_grad():
                f = loaded.encode(x)
                out_ = (
                    loaded.forward(x) if "skip" in case["cfg"]["architecture"] else loaded.decode(f)
                )
        except Exception as error:  # the caller reports what SAELens refused
            (folder / "saelens_readback_error.txt").write_text(f"{type(error).__name__}: {error}")
            continue
        save_file({"features": f.contiguous(), "output": out_.contiguous()},
                  str(folder / "saelens_readback.safetensors"))  # fmt: skip


def main(cases_path: str, out: str, mode: str = "build") -> None:
    torch.set_num_threads(1)
    cases = json.loads(Path(cases_path).read_text())
    if mode == "time":
        return time_again(cases, out)
    if mode == "readback":
        return read_back(cases, out)
    for case in cases:
        folder = Path(out) / case["name"]
        cls = TrainingSAE if case["training"] else SAE
        sae = cls.from_dict(case["cfg"])
        fill(sae, torch.Generator().manual_seed(case["seed"]))
        if case["training"] and hasattr(sae, "topk_threshold"):
            sae.topk_threshold = torch.tensor(0.1, dtype=torch.double)
        sae.save_model(str(folder))
        if case.get("scale") is not None:
            (folder / "activation_scaler.json").write_text(
                json.dumps({"scaling_factor": case["scale"]})
            )
        loaded = cls.load_from_disk(str(folder))
        if case.get("scale") is not None:  # what from_pretrained does with a known factor
            loaded.fold_activation_norm_scaling_factor(case["scale"])
        loaded.eval()
        x = torch.randn(case["x_shape"], generator=torch.Generator().manual_seed(1)) * 1.5
        with torch.no_grad():
            f = loaded.encode(x)
            out_ = loaded.forward(x) if "skip" in case["cfg"]["architecture"] else loaded.decode(f)
            times = []
            for _ in range(case["repeat"]):
                start = time.perf_counter()
                loaded.encode(x)
                times.append(time.perf_counter() - start)
        save_file({"x": x, "features": f.contiguous(), "output": out_.contiguous()},
                  str(folder / "saelens_outputs.safetensors"))  # fmt: skip
        seconds = {"encode_s": statistics.median(times)}
        (folder / "saelens_time.json").write_text(json.dumps(seconds))


if __name__ == "__main__":
    main(*sys.argv[1:4])
