"""dictionary_learning folders (``ae.pt`` + ``config.json``), computed as its ``load_dictionary``
loads them and its dictionaries' ``encode`` and ``decode`` compute.

``config.json``'s ``trainer.dict_class`` names the class; ``ae.pt`` is its state dict:

- ``AutoEncoder``: ``bias``, ``encoder.weight [d_sae d_in]``, ``encoder.bias``,
  ``decoder.weight [d_in d_sae]``; ``f = ReLU(enc(x - bias))``, ``x_hat = dec(f) + bias``.
  ``from_pretrained`` rescales a decoder whose columns are not unit norm (unless
  ``torch.allclose`` to 1): ``dec /= |dec_j|``, ``enc_j *= |dec_j|``, ``enc.bias_j *= |dec_j|``;
  interp does the same, so its features are the library's;
- ``AutoEncoderNew``: ``f = ReLU(enc(x))``, ``x_hat = dec(f)`` (the decoder has a bias);
- ``GatedAutoEncoder``: ``decoder_bias``, ``encoder.weight``, ``r_mag``, ``gate_bias``,
  ``mag_bias``, ``decoder.weight``; ``e = enc(x - decoder_bias)``,
  ``f = (e + gate_bias > 0) * ReLU(exp(r_mag) e + mag_bias)``;
- ``JumpReluAutoEncoder``: ``W_enc``, ``b_enc``, ``W_dec``, ``b_dec``, ``threshold``;
  ``pre = x W_enc + b_enc``, ``f = ReLU(pre * (pre > threshold))`` (no ``b_dec`` subtracted);
- ``AutoEncoderTopK``: ``encoder``, ``decoder.weight``, ``b_dec``, ``k``, ``threshold``;
  ``f`` = the ``k`` largest of ``ReLU(enc(x - b_dec))`` (its ``threshold`` unused by default);
- ``BatchTopKSAE`` and ``MatryoshkaBatchTopKSAE``: inference uses the learned scalar
  ``threshold``: ``f = a * (a > threshold)`` with ``a = ReLU(pre)``, a JumpReLU with one
  threshold for every feature (a Matryoshka SAE's groups are all active after loading).

Every dictionary decodes ``f W_dec + b_dec``. The hook: ``trainer.submodule_name``
(``resid_post_layer_3``, ``mlp_out_layer_3``, ``attn_out_layer_3``), else ``trainer.layer``'s
residual stream after the layer (``blocks.L.hook_resid_post``, as the library's
``get_submodule`` reads it), else ``hook_name=``.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch

from interp.dictionaries.files import check_names
from interp.foundation.fallbacks import warn_fallback
from interp.saes.sae import SAE

logger = logging.getLogger(__name__)

__all__ = ["CLASSES", "read_dictionary_learning"]

CLASSES = (  # the dictionary classes interp computes
    "AutoEncoder", "AutoEncoderNew", "GatedAutoEncoder", "JumpReluAutoEncoder",
    "AutoEncoderTopK", "BatchTopKSAE", "MatryoshkaBatchTopKSAE",
)  # fmt: skip
SUBMODULE = re.compile(r"^(resid_post|resid_pre|resid_out|mlp_out|attn_out)_layer_?(\d+)$")
SITES = {"resid_post": "hook_resid_post", "resid_out": "hook_resid_post",
         "resid_pre": "hook_resid_pre", "mlp_out": "hook_mlp_out",
         "attn_out": "hook_attn_out"}  # fmt: skip
KEYS = {  # the state dict each class saves (its parameters and buffers)
    "AutoEncoder": {"bias", "encoder.weight", "encoder.bias", "decoder.weight"},
    "AutoEncoderNew": {"encoder.weight", "encoder.bias", "decoder.weight", "decoder.bias"},
    "GatedAutoEncoder": {"decoder_bias", "encoder.weight", "r_mag", "gate_bias", "mag_bias",
                         "decoder.weight"},
    "JumpReluAutoEncoder": {"W_enc", "b_enc", "W_dec", "b_dec", "threshold"},
    "AutoEncoderTopK": {"k", "threshold", "decoder.weight", "encoder.weight", "encoder.bias",
                        "b_dec"},
    "BatchTopKSAE": {"k", "threshold", "decoder.weight", "encoder.weight", "encoder.bias",
                     "b_dec"},
    "MatryoshkaBatchTopKSAE": {"k", "threshold", "group_sizes", "W_enc", "b_enc", "W_dec",
                               "b_dec"},
}  # fmt: skip


def _hook(trainer: dict) -> str | None:
    found = SUBMODULE.match(str(trainer.get("submodule_name") or ""))
    if found:
        return f"blocks.{int(found.group(2))}.{SITES[found.group(1)]}"
    if trainer.get("submodule_name") is None and trainer.get("layer") is not None:
        return f"blocks.{int(trainer['layer'])}.hook_resid_post"
    return None


def _load(path: Path) -> dict[str, torch.Tensor]:
    try:  # memory-mapped: the tensors become the SAE's parameters without a second copy
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except torch.OutOfMemoryError:
        raise
    except RuntimeError:  # a file in torch's legacy (non-zip) format cannot be mapped
        warn_fallback(
            logger,
            "dictionary_learning:mmap",
            "%s cannot be memory-mapped (torch's legacy format?): reading it into memory",
            path,
        )
        return torch.load(path, map_location="cpu", weights_only=True)


def read_dictionary_learning(folder: Path, config: dict, hook_name: str | None) -> SAE:
    """An :class:`SAE` from a dictionary_learning folder (the module docstring)."""
    trainer = config.get("trainer") or {}
    cls = trainer.get("dict_class")
    if cls not in CLASSES:
        raise ValueError(f"trainer.dict_class={cls!r}: interp computes {', '.join(CLASSES)}")
    hook = hook_name or _hook(trainer)
    if hook is None:
        raise ValueError(
            f"trainer.submodule_name={trainer.get('submodule_name')!r} is not a hook interp "
            "knows (resid_post_layer_N, mlp_out_layer_N, attn_out_layer_N); pass hook_name="
        )
    sd = _load(folder / "ae.pt")
    check_names(sd, KEYS[cls], f"ae.pt does not hold a {cls}:")
    if "k" in sd and trainer.get("k") is not None and int(sd["k"]) != int(trainer["k"]):
        raise ValueError(f"config.json says k={trainer['k']} but ae.pt holds k={int(sd['k'])}")
    common = {"hook_name": hook, "cfg": config, "source": "dictionary_learning"}
    if cls in ("JumpReluAutoEncoder", "MatryoshkaBatchTopKSAE"):
        W_enc, b_enc, W_dec, b_dec = sd["W_enc"], sd["b_enc"], sd["W_dec"], sd["b_dec"]
    elif cls == "GatedAutoEncoder":
        gate = {"b_gate": sd["gate_bias"], "r_mag": sd["r_mag"], "b_mag": sd["mag_bias"]}
        W_enc, W_dec, b_dec = sd["encoder.weight"].T, sd["decoder.weight"].T, sd["decoder_bias"]
        return SAE(W_enc, None, W_dec, b_dec, architecture="gated", gate=gate,
                   apply_b_dec_to_input=True, **common)  # fmt: skip
    else:
        W_enc, b_enc, W_dec = sd["encoder.weight"].T, sd["encoder.bias"], sd["decoder.weight"].T
        b_dec = {"AutoEncoder": "bias", "AutoEncoderNew": "decoder.bias"}.get(cls, "b_dec")
        b_dec = sd[b_dec]
    if cls == "AutoEncoder":
        _normalize_decoder(W_enc, b_enc, W_dec)
    if cls == "AutoEncoderTopK":
        return SAE(W_enc, b_enc, W_dec, b_dec, architecture="topk", k=int(sd["k"]),
                   apply_b_dec_to_input=True, **common)  # fmt: skip
    if cls in ("BatchTopKSAE", "MatryoshkaBatchTopKSAE", "JumpReluAutoEncoder"):
        threshold = sd["threshold"]
        threshold = threshold.expand(W_enc.shape[1]) if threshold.ndim == 0 else threshold
        return SAE(W_enc, b_enc, W_dec, b_dec, architecture="jumprelu", threshold=threshold,
                   apply_b_dec_to_input=cls != "JumpReluAutoEncoder", **common)  # fmt: skip
    return SAE(W_enc, b_enc, W_dec, b_dec, apply_b_dec_to_input=cls == "AutoEncoder", **common)


@torch.no_grad()
def _normalize_decoder(W_enc, b_enc, W_dec) -> None:
    """``AutoEncoder.normalize_decoder``, in place, on the transposed views of its weights."""
    norms = torch.norm(W_dec.T, dim=0)  # the library's torch.norm(decoder.weight, dim=0)
    if torch.allclose(norms, torch.ones_like(norms)):
        return
    W_dec.T.div_(norms)  # decoder.weight.data /= norms
    W_enc.T.mul_(norms[:, None])  # encoder.weight.data *= norms[:, None]
    b_enc.mul_(norms)
