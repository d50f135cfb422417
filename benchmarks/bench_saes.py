"""interp's SAEs against SAELens itself, and the memory of loading a wide SAE.

1. With ``--saelens-python`` (a Python with sae-lens 6, e.g. a separate venv: SAELens pins
   TransformerLens < 4), ``benchmarks/saelens_side.py`` builds a random SAE of each
   architecture and flag with SAELens's own classes, saves it, loads it back and records its
   ``encode`` / ``decode`` of a batch and the time of ``encode``; interp then loads the same
   folder with ``load_sae`` and reports the largest difference of features and outputs, and
   the time of its own ``encode`` on the same batch (both on one thread; medians over
   ``--rounds`` rounds that alternate SAELens's process and interp's).
2. With ``--formats-python`` (a Python with eai-sparsify and dictionary-learning),
   ``benchmarks/formats_side.py`` does the same with those libraries' own classes, savers and
   loaders (``SparseCoder``, ``load_dictionary``), and interp reports the largest differences.
3. Peak memory of ``load_sae`` for a 16k- and a 131k-feature SAE on d_model 768, each in a
   fresh process: the RSS growth right after ``load_sae`` (the parameters are the
   memory-mapped safetensors file, read on first use) and the peak RSS growth once a first
   ``sae(x)`` has read every weight, against the weights' bytes (target <= 1.2x).

    python benchmarks/bench_saes.py [--saelens-python PATH] [--formats-python PATH]
        [--d-sae 4096] [--batch 256] [--widths 16384 131072]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import time_side_by_side  # noqa: E402

HOOK, OUT, Z = "blocks.6.hook_resid_pre", "blocks.6.hook_mlp_out", "blocks.6.attn.hook_z"


def cases(d_in: int, d_sae: int, batch: int, repeat: int) -> list[dict]:
    """(name, SAELens architecture, config keys, training SAE?, scaling factor)."""
    table = [
        ("standard", "standard", {}, False, None),
        ("standard, apply_b_dec_to_input false", "standard", {"apply_b_dec_to_input": False},
         False, None),
        ("gated", "gated", {}, False, None),
        ("jumprelu", "jumprelu", {}, False, None),
        ("topk", "topk", {"k": 32}, False, None),
        ("topk, rescale_acts_by_decoder_norm", "topk",
         {"k": 32, "rescale_acts_by_decoder_norm": True}, False, None),
        ("batchtopk (training SAE)", "batchtopk", {"k": 32}, True, None),
        ("batchtopk, rescale_acts_by_decoder_norm", "batchtopk",
         {"k": 32, "rescale_acts_by_decoder_norm": True}, True, None),
        ("constant_norm_rescale", "standard", {"normalize_activations": "constant_norm_rescale"},
         False, None),
        ("layer_norm, jumprelu", "jumprelu", {"normalize_activations": "layer_norm"}, False,
         None),
        ("layer_norm, topk", "topk", {"k": 32, "normalize_activations": "layer_norm"}, False,
         None),
        ("expected_average_only_in", "standard",
         {"normalize_activations": "expected_average_only_in"}, False, 0.37),
        ("hook_z", "standard", {"reshape_activations": "hook_z"}, False, None),
        ("transcoder", "transcoder", {}, False, None),
        ("skip_transcoder", "skip_transcoder", {}, False, None),
        ("jumprelu_transcoder", "jumprelu_transcoder", {}, False, None),
        ("jumprelu_skip_transcoder", "jumprelu_skip_transcoder", {}, False, None),
    ]  # fmt: skip
    out = []
    for seed, (name, arch, extra, training, scale) in enumerate(table):
        hook = Z if "hook_z" in name else HOOK
        meta = {"hook_name": hook} | ({"hook_name_out": OUT} if "transcoder" in arch else {})
        cfg = {"architecture": arch, "d_in": d_in, "d_sae": d_sae, "metadata": meta, **extra}
        if "transcoder" in arch:
            cfg |= {"d_out": d_in, "apply_b_dec_to_input": False}
        x_shape = [batch, 12, d_in // 12] if hook == Z else [batch, d_in]
        folder = "".join(c if c.isalnum() else "_" for c in name)
        out.append({"name": folder, "label": name, "cfg": cfg, "training": training,
                    "scale": scale, "seed": seed, "x_shape": x_shape,
                    "repeat": repeat})  # fmt: skip
    return out


def compare(
    saelens_python: str, d_in: int, d_sae: int, batch: int, repeat: int, rounds: int
) -> list[dict]:
    import statistics

    import torch
    from safetensors.torch import load_file

    from interp import load_sae

    torch.set_num_threads(1)
    side = str(ROOT / "benchmarks" / "saelens_side.py")
    rows, ours, theirs = [], {}, {}
    with tempfile.TemporaryDirectory(prefix="interp-bench-saes-") as scratch:
        spec = Path(scratch) / "cases.json"
        todo = cases(d_in, d_sae, batch, repeat)
        spec.write_text(json.dumps(todo))
        subprocess.run([saelens_python, side, str(spec), scratch], check=True)
        saes = {case["name"]: load_sae(Path(scratch) / case["name"]) for case in todo}
        for round_ in range(rounds):  # SAELens's process and interp's, alternately
            if round_:
                subprocess.run([saelens_python, side, str(spec), scratch, "time"], check=True)
            for case in todo:
                folder = Path(scratch) / case["name"]
                time_file = json.loads((folder / "saelens_time.json").read_text())
                theirs.setdefault(case["name"], []).append(time_file["encode_s"])
                x = load_file(str(folder / "saelens_outputs.safetensors"))["x"]
                encode = {"interp": lambda s=saes[case["name"]], x=x: s.encode(x)}
                with torch.no_grad():
                    seconds = time_side_by_side(encode, repeat=repeat)["interp"]
                ours.setdefault(case["name"], []).append(seconds)
        for case in todo:
            folder = Path(scratch) / case["name"]
            ref = load_file(str(folder / "saelens_outputs.safetensors"))
            sae, x = saes[case["name"]], ref["x"]
            with torch.no_grad():
                f = sae.encode(x)
                out = sae(x) if sae.W_skip is not None else sae.decode(f, x)
            rows.append({
                "case": case["label"],
                "features max |diff|": float((f - ref["features"]).abs().max()),
                "output max |diff|": float((out - ref["output"]).abs().max()),
                "features equal": bool(torch.equal(f, ref["features"])),
                "interp encode ms": 1e3 * statistics.median(ours[case["name"]]),
                "SAELens encode ms": 1e3 * statistics.median(theirs[case["name"]]),
            })  # fmt: skip
    return rows


def compare_formats(formats_python: str, d_in: int, d_sae: int, batch: int) -> list[dict]:
    """sparsify's and dictionary_learning's own classes and loaders against ``load_sae``."""
    import torch
    from safetensors.torch import load_file

    from interp import load_sae

    rows = []
    with tempfile.TemporaryDirectory(prefix="interp-bench-formats-") as scratch:
        side = str(ROOT / "benchmarks" / "formats_side.py")
        subprocess.run([formats_python, side, scratch, str(d_in), str(d_sae), str(batch)],
                       check=True, capture_output=True)  # fmt: skip
        for folder in sorted(Path(scratch).glob("*/*")):
            ref = load_file(str(folder / "ref_outputs.safetensors"))
            sae = load_sae(folder)
            with torch.no_grad():
                f, out = sae.encode(ref["x"]), sae(ref["x"])
            rows.append({
                "format": folder.parent.name, "case": folder.name,
                "features max |diff|": float((f - ref["features"]).abs().max()),
                "output max |diff|": float((out - ref["output"]).abs().max()),
                "largest |output|": float(ref["output"].abs().max()),
            })  # fmt: skip
    return rows


PEAK = """
import sys, torch
torch.set_num_threads(1)
import interp.saes.loading, interp.saes.saelens, safetensors.torch  # imports before measuring
from interp import load_sae
def status(key):
    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
    return int(line.split()[1]) * 1024
before = status("VmRSS")
sae = load_sae(sys.argv[1])
loaded = status("VmRSS")
with torch.no_grad():
    sae(torch.randn(8, sae.d_in))  # a first encode and decode read every weight
weights = sum(p.numel() * p.element_size() for p in sae.parameters())
print(before, loaded, status("VmHWM"), weights)
"""


def load_memory(d_in: int, widths: list[int]) -> list[dict]:
    """Peak RSS growth of ``load_sae`` in a fresh process, per width."""
    import torch
    from safetensors.torch import save_file

    rows = []
    for d_sae in widths:
        with tempfile.TemporaryDirectory(prefix="interp-bench-sae-mem-") as folder:
            g = torch.Generator().manual_seed(0)
            weights = {
                "W_enc": torch.randn(d_in, d_sae, generator=g),
                "b_enc": torch.zeros(d_sae),
                "W_dec": torch.randn(d_sae, d_in, generator=g),
                "b_dec": torch.zeros(d_in),
            }
            save_file(weights, f"{folder}/sae_weights.safetensors")
            cfg = {"architecture": "standard", "d_in": d_in, "d_sae": d_sae, "dtype": "float32",
                   "metadata": {"hook_name": HOOK, "sae_lens_version": "6.54.12"}}  # fmt: skip
            Path(folder, "cfg.json").write_text(json.dumps(cfg))
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            done = subprocess.run([sys.executable, "-c", PEAK, folder], env=env, check=True,
                                  capture_output=True, text=True)  # fmt: skip
            before, loaded, peak, weights = (int(v) for v in done.stdout.split()[-4:])
            rows.append({"d_sae": d_sae, "weights MB": weights / 2**20,
                         "RSS growth after load_sae MB": (loaded - before) / 2**20,
                         "peak growth with a first forward MB": (peak - before) / 2**20,
                         "peak / weights": (peak - before) / weights})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--saelens-python", default=os.environ.get("INTERP_SAELENS_PYTHON"))
    parser.add_argument("--formats-python", default=os.environ.get("INTERP_FORMATS_PYTHON"))
    parser.add_argument("--d-in", type=int, default=768)
    parser.add_argument("--d-sae", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--widths", type=int, nargs="*", default=[16384, 131072])
    args = parser.parse_args()
    import pandas as pd

    if args.saelens_python:
        rows = compare(args.saelens_python, args.d_in, args.d_sae, args.batch, args.repeat,
                       args.rounds)  # fmt: skip
        print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    else:
        print("no --saelens-python (or INTERP_SAELENS_PYTHON): the comparison with SAELens is "
              "skipped")  # fmt: skip
    if args.formats_python:
        rows = compare_formats(args.formats_python, args.d_in, args.d_sae, args.batch)
        print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    if args.widths:
        rows = load_memory(args.d_in, args.widths)
        print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    main()
