"""The sparsify and dictionary_learning side of bench_saes.py: run with a Python that has
eai-sparsify and dictionary-learning (not interp).

Builds each SAE with the library's own class, fills its parameters with seeded random
numbers, saves it as the library saves it (``SparseCoder.save_to_disk``; ``torch.save`` of
the state dict plus the trainer's ``config.json``), loads it back with the library's loader
(``SparseCoder.load_from_disk``, ``load_dictionary``) and writes the input, the library's
features and output to the folder.

    python benchmarks/formats_side.py OUT_DIR D_IN D_SAE BATCH [sparsify|dictionary_learning]

With a library named, only that library's cases are built (a Python that has only it).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import torch
from safetensors.torch import save_file

K = 32
DICTIONARIES = ("AutoEncoder", "AutoEncoderNew", "GatedAutoEncoder", "JumpReluAutoEncoder",
                "AutoEncoderTopK", "BatchTopKSAE", "MatryoshkaBatchTopKSAE")  # fmt: skip


def fill(module, g: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            scale = p.shape[-1] ** -0.5 if p.ndim == 2 else 0.3
            p.copy_(torch.randn(p.shape, generator=g) * scale)
            if name.endswith("threshold"):
                p.abs_()


def sparsify_cases(out: Path, d_in: int, d_sae: int, x: torch.Tensor) -> None:
    from sparsify import SparseCoder, SparseCoderConfig

    for name, transcode, skip in (("layers.6", False, False), ("layers.6.mlp", True, True),
                                  ("layers.7", False, True)):  # fmt: skip
        cfg = SparseCoderConfig(num_latents=d_sae, k=K, transcode=transcode, skip_connection=skip)
        coder = SparseCoder(d_in, cfg)
        fill(coder, torch.Generator().manual_seed(len(name)))
        folder = out / "sparsify" / name
        coder.save_to_disk(folder)
        coder = SparseCoder.load_from_disk(folder)
        with torch.no_grad():
            top_acts, top_indices, _ = coder.encode(x)
            f = torch.zeros(x.shape[0], d_sae).scatter_(-1, top_indices, top_acts)
            y = coder(x).sae_out
        save_file({"x": x, "features": f, "output": y}, str(folder / "ref_outputs.safetensors"))


def dictionary_cases(out: Path, d_in: int, d_sae: int, x: torch.Tensor) -> None:
    # dictionary_learning.utils imports nnsight's LanguageModel (unused here) at import time
    sys.modules.setdefault("nnsight", types.SimpleNamespace(LanguageModel=object))
    from dictionary_learning import dictionary as d
    from dictionary_learning.trainers import batch_top_k, matryoshka_batch_top_k, top_k
    from dictionary_learning.utils import load_dictionary

    classes = {"AutoEncoder": d.AutoEncoder, "AutoEncoderNew": d.AutoEncoderNew,
               "GatedAutoEncoder": d.GatedAutoEncoder, "JumpReluAutoEncoder":
               d.JumpReluAutoEncoder, "AutoEncoderTopK": top_k.AutoEncoderTopK,
               "BatchTopKSAE": batch_top_k.BatchTopKSAE, "MatryoshkaBatchTopKSAE":
               matryoshka_batch_top_k.MatryoshkaBatchTopKSAE}  # fmt: skip
    for seed, name in enumerate(DICTIONARIES):
        cls = classes[name]
        if name == "MatryoshkaBatchTopKSAE":
            ae = cls(d_in, d_sae, K, [d_sae // 4, d_sae - d_sae // 4])
        elif "TopK" in name:
            ae = cls(d_in, d_sae, K)
        else:
            ae = cls(d_in, d_sae)
        fill(ae, torch.Generator().manual_seed(seed))
        if "BatchTopK" in name:
            ae.threshold.fill_(0.05)
        folder = out / "dictionary_learning" / name
        folder.mkdir(parents=True)
        torch.save({k: v.cpu() for k, v in ae.state_dict().items()}, folder / "ae.pt")
        trainer = {"dict_class": name, "activation_dim": d_in, "dict_size": d_sae, "layer": 6,
                   "lm_name": "gpt2", "submodule_name": "resid_post_layer_6"}  # fmt: skip
        if "TopK" in name:
            trainer["k"] = K
        config = {"trainer": trainer, "buffer": {"ctx_len": 128}}
        (folder / "config.json").write_text(json.dumps(config, indent=4))
        loaded, _ = load_dictionary(str(folder), "cpu")
        with torch.no_grad():
            f = loaded.encode(x)
            y = loaded.decode(f)
        save_file({"x": x, "features": f, "output": y}, str(folder / "ref_outputs.safetensors"))


def main(out: str, d_in: str, d_sae: str, batch: str, which: str = "both") -> None:
    if which not in ("both", "sparsify", "dictionary_learning"):
        raise SystemExit(f"formats_side.py: {which!r} is not sparsify or dictionary_learning")
    torch.set_num_threads(1)
    x = torch.randn(int(batch), int(d_in), generator=torch.Generator().manual_seed(1)) * 1.5
    if which in ("both", "sparsify"):
        sparsify_cases(Path(out), int(d_in), int(d_sae), x)
    if which in ("both", "dictionary_learning"):
        dictionary_cases(Path(out), int(d_in), int(d_sae), x)


if __name__ == "__main__":
    main(*sys.argv[1:6])
