"""Gemma Scope folders (``params.npz``), computed as Google DeepMind's tutorial computes them.

``params.npz`` holds ``W_enc [d_model d_sae]``, ``W_dec [d_sae d_model]``, ``b_enc``,
``threshold [d_sae]`` and ``b_dec [d_model]`` (float32). The tutorial's ``JumpReLUSAE``:
``pre = x W_enc + b_enc``, ``f = (pre > threshold) * ReLU(pre)``, ``x_hat = f W_dec + b_dec``
(no ``b_dec`` subtracted from the input). The hook comes from the path, as the published
repositories lay it out (``google/gemma-scope-2b-pt-res/layer_20/width_16k/average_l0_71``):
``-res`` reads ``blocks.{layer}.hook_resid_post``, ``-mlp`` ``blocks.{layer}.hook_mlp_out``,
``-att`` ``blocks.{layer}.attn.hook_z`` (the heads flattened); ``hook_name=`` names it for a
folder whose path does not say it. The ``embedding`` SAEs (trained on the embedding before
Gemma's ``sqrt(d_model)`` scale) are refused.
"""

from __future__ import annotations

import re
from pathlib import Path

from interp.dictionaries.files import check_names, read_tensors
from interp.saes.sae import SAE

__all__ = ["gemmascope_hook", "read_gemmascope"]

SITES = {"res": "hook_resid_post", "mlp": "hook_mlp_out", "att": "attn.hook_z"}
KEYS = ("W_enc", "W_dec", "b_enc", "b_dec", "threshold")


def gemmascope_hook(path: str | Path) -> str | None:
    """The hook a Gemma Scope SAE reads, from its path (``.../gemma-scope-2b-pt-res/layer_20
    /...``), or None when the path does not say."""
    text = Path(path).as_posix()
    layer = re.search(r"(?:^|/)layer_(\d+)(?:/|$)", text)
    site = re.search(r"gemma-scope-[^/]*?-(res|mlp|att)(?:-[^/]*)?(?:/|$)", text)
    if layer is None or site is None:
        return None
    return f"blocks.{int(layer.group(1))}.{SITES[site.group(1)]}"


def read_gemmascope(folder: Path, hook_name: str | None) -> SAE:
    """A JumpReLU :class:`SAE` from a Gemma Scope ``params.npz`` (the module docstring)."""
    if any(part.startswith("embedding") for part in folder.parts) and hook_name is None:
        raise ValueError(
            "a Gemma Scope embedding SAE reads the embedding before Gemma's sqrt(d_model) "
            "scale, which interp does not splice; pass hook_name= if you know its hook"
        )
    hook = hook_name or gemmascope_hook(folder.resolve())
    if hook is None:
        raise ValueError(
            "the path does not say which hook this Gemma Scope SAE reads (no "
            "gemma-scope-*-res|mlp|att/layer_N in it); pass hook_name="
        )
    raw = read_tensors(folder / "params.npz")
    names = {("W_" + k[2:] if k.startswith("w_") else k): k for k in raw}
    check_names(names, KEYS, "params.npz", unknown=", which interp does not know")
    tensors = {k: raw[names[k]] for k in KEYS}
    return SAE(
        tensors["W_enc"], tensors["b_enc"], tensors["W_dec"], tensors["b_dec"],
        architecture="jumprelu", hook_name=hook, threshold=tensors["threshold"],
        apply_b_dec_to_input=False,
        reshape_activations="hook_z" if hook.endswith("attn.hook_z") else "none",
        cfg={"format": "gemmascope"}, source="gemmascope",
    )  # fmt: skip
