"""EleutherAI sparsify folders (``cfg.json`` + ``sae.safetensors``), computed as sparsify does.

sparsify's ``SparseCoder`` saves ``encoder.weight [d_sae d_in]``, ``encoder.bias [d_sae]``,
``W_dec [d_sae d_in]``, ``b_dec [d_in]`` and, with ``skip_connection``, ``W_skip [d_in d_in]``,
in the dtype it trained in; ``cfg.json`` holds its ``SparseCoderConfig`` plus ``d_in``.
``encode``: ``x - b_dec`` (not for a transcoder), ``ReLU(x W^T + b)``, then the ``k`` largest
(``torch.topk``); ``decode``: ``f W_dec + b_dec``, plus ``x W_skip^T`` with a skip connection.
Published repositories keep one folder per hookpoint, named after the module of the
Hugging Face model (``layers.6``, ``layers.6.mlp``, ``h.6`` for GPT-2); :func:`sparsify_hooks`
maps it onto the bridge's hooks: a layer's output is ``blocks.L.hook_resid_post``, its MLP's
``hook_mlp_out``, its attention's ``hook_attn_out``; a transcoder reads that module's input
(``hook_resid_pre``, ``mlp.hook_in``, ``attn.hook_in``) and writes its output.
"""

from __future__ import annotations

import re
from pathlib import Path

from interp.dictionaries.files import check_names, read_tensors
from interp.saes.sae import SAE

__all__ = ["read_sparsify", "sparsify_hooks"]

HOOKPOINT = re.compile(
    r"^(?:(?:model|transformer|gpt_neox|base_model\.model)\.)?(?:layers|h)\.(\d+)"
    r"(?:\.(mlp|self_attn|attn|attention))?$"
)
EMBEDDINGS = ("embed_tokens", "wte", "embed_in")
# module -> (what an SAE reads / a transcoder writes, what a transcoder reads)
SITES = {
    None: ("hook_resid_post", "hook_resid_pre"),
    "mlp": ("hook_mlp_out", "mlp.hook_in"),
    "attn": ("hook_attn_out", "attn.hook_in"),
}
TRAINING_ONLY = ("expansion_factor", "normalize_decoder", "num_latents", "multi_topk",
                 "activation", "k", "skip_connection", "transcode", "d_in", "signed")  # fmt: skip


def sparsify_hooks(hookpoint: str, *, transcode: bool) -> tuple[str, str | None] | None:
    """``(hook read, hook written)`` for a sparsify hookpoint (the written hook None for an
    SAE, which writes what it reads), or None when the name is not one interp knows."""
    if hookpoint in EMBEDDINGS and not transcode:
        return "hook_embed", None
    found = HOOKPOINT.match(hookpoint)
    if found is None:
        return None
    layer, module = int(found.group(1)), found.group(2)
    out, into = SITES[None if module is None else "mlp" if module == "mlp" else "attn"]
    if transcode:
        return f"blocks.{layer}.{into}", f"blocks.{layer}.{out}"
    return f"blocks.{layer}.{out}", None


def read_sparsify(folder: Path, cfg: dict, hook_name: str | None) -> SAE:
    """A TopK :class:`SAE` (or transcoder) from a sparsify folder (the module docstring)."""
    activation = cfg.get("activation", "topk")
    if activation != "topk":
        raise ValueError(f"activation={activation!r}: interp computes sparsify's topk only")
    if cfg.get("signed", False):
        raise ValueError("signed=True: interp does not compute sparsify's signed activations")
    unknown = sorted(set(cfg) - set(TRAINING_ONLY))
    if unknown:
        raise ValueError(f"cfg.json has {', '.join(unknown)}, which interp does not know")
    transcode = bool(cfg.get("transcode", False))
    hooks = sparsify_hooks(folder.name, transcode=transcode)
    if hook_name is None and hooks is None:
        raise ValueError(
            f"the hookpoint {folder.name!r} is not one interp maps onto the model's hooks "
            "(layers.N[.mlp|.self_attn], h.N[...], embed_tokens); pass hook_name="
        )
    if transcode and hooks is None:
        raise ValueError("a sparsify transcoder needs a known hookpoint folder name")
    tensors = read_tensors(folder / "sae.safetensors")
    needed = {"encoder.weight", "encoder.bias", "W_dec", "b_dec"}
    needed |= {"W_skip"} if cfg.get("skip_connection", False) else set()
    check_names(tensors, needed, "sae.safetensors")
    d_sae, d_in = tensors["encoder.weight"].shape
    expected = cfg.get("num_latents") or d_in * cfg.get("expansion_factor", 32)
    if int(cfg.get("d_in", d_in)) != d_in or int(expected) != d_sae:
        raise ValueError(
            f"cfg.json says d_in={cfg.get('d_in')}, {expected} latents; the encoder is "
            f"{d_sae}x{d_in}"
        )
    read, written = (hook_name, None) if hooks is None else hooks
    return SAE(
        tensors["encoder.weight"].T, tensors["encoder.bias"], tensors["W_dec"], tensors["b_dec"],
        architecture="topk", hook_name=hook_name or read, k=int(cfg.get("k", 32)),
        apply_b_dec_to_input=not transcode, output_hook_name=written,
        W_skip=tensors.get("W_skip"), cfg={**cfg, "hookpoint": folder.name}, source="sparsify",
    )  # fmt: skip
