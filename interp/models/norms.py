"""The normalisation layers of a TransformerBridge, read as the maps they compute.

- LayerNorm: ``y = (x - mean(x)) / s * w + b`` with ``s = sqrt(mean((x - mean x)^2) + eps)``.
- RMSNorm (Llama, Qwen, Mistral, Gemma): ``y = x / s * w`` with ``s = sqrt(mean(x^2) + eps)``:
  no centring and no bias. Gemma stores the weight as an offset from one: ``y = x / s * (1 + w)``.

With the scale ``s`` *frozen* at its value in a run, both are affine in ``x``; that is what makes
an exact direct logit attribution possible. These helpers give the effective weight and bias
(the ``1 + w`` offset resolved, zeros for what a norm does not have) in float64, so that callers
never special-case an architecture.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

__all__ = [
    "POST_NORMS",
    "effective_bias",
    "effective_weight",
    "freeze",
    "is_rms",
    "normalise",
    "param",
    "post_norm",
    "qkv_weights",
    "check_qkv_input",
    "soft_cap",
]

# Gemma 2's blocks normalise each sublayer's output before adding it to the residual stream
POST_NORMS = {"attn": "ln1_post", "mlp": "ln2_post"}


def is_rms(norm) -> bool:
    """True for an RMSNorm (no centring, no bias), False for a LayerNorm."""
    return bool(getattr(norm, "uses_rms_norm", False))


def _d_model(norm, fallback: int | None) -> int:
    d_model = getattr(getattr(norm, "config", None), "d_model", None) or fallback
    if d_model is None:
        raise ValueError("cannot tell this normalisation layer's width; pass d_model")
    return int(d_model)


def effective_weight(norm, d_model: int | None = None) -> Float[Tensor, " d_model"]:
    """The multiplier applied after normalising: ``w``, ``1 + w`` (Gemma), or ones."""
    weight = getattr(norm, "weight", None)
    if weight is None:  # LNPre / RMSPre: normalisation only
        return torch.ones(_d_model(norm, d_model), dtype=torch.float64)
    weight = weight.detach().double().cpu()
    return 1.0 + weight if getattr(norm, "uses_weight_offset", False) else weight


def effective_bias(norm, d_model: int | None = None) -> Float[Tensor, " d_model"]:
    """The bias added after the weight; zeros for RMSNorm (which adds none even if it has one)."""
    bias = None if is_rms(norm) else getattr(norm, "bias", None)
    if bias is None:
        return torch.zeros(_d_model(norm, d_model), dtype=torch.float64)
    return bias.detach().double().cpu()


def normalise(
    norm, x: Float[Tensor, "... d_model"], scale: float | Tensor
) -> Float[Tensor, "... d_model"]:
    """``x`` normalised with a given (frozen) scale: centred first for a LayerNorm."""
    x = x.double()
    return (x if is_rms(norm) else x - x.mean(-1, keepdim=True)) / scale


def freeze(
    norm, vectors: Float[Tensor, "... d_model"], scale: float | Tensor
) -> Float[Tensor, "... d_model"]:
    """The linear part of ``norm`` with its scale frozen, applied to each vector (no bias):
    summing the results of a decomposition gives the norm's output minus its bias."""
    weight = effective_weight(norm, vectors.shape[-1]).to(vectors.device)
    return normalise(norm, vectors, scale) * weight


def post_norm(model, layer: int, sublayer: str):
    """The norm applied to ``sublayer``'s (``"attn"`` or ``"mlp"``) output before it is added
    to the residual stream (Gemma 2), or None where the output is added as it is."""
    return getattr(model.blocks[layer], POST_NORMS[sublayer], None)


def param(model, name: str) -> Tensor | None:
    """A stacked weight such as ``b_O`` in float64 on cpu, or None where the checkpoint has no
    such parameter (bias-free projections: TransformerLens raises AttributeError)."""
    try:
        value = getattr(model, name)
    except AttributeError:
        return None
    return None if value is None else value.detach().double().cpu()


def qkv_weights(model, which: str) -> tuple[Tensor, Tensor | None]:
    """``W_Q/K/V`` ``[layer head d_model d_head]`` (keys and values per key/value head under
    grouped-query attention) and the bias, None for bias-free models (Llama, Mistral, Gemma)."""
    W = getattr(model, f"W_{which.upper()}")
    try:
        b = getattr(model, f"b_{which.upper()}")
    except AttributeError:  # the bridge raises for a bias the checkpoint does not have
        b = None
    return W, b


QKV_ATOL = 1e-4  # float32: our ln1(x) W + b against the model's own hook_q/k/v


def check_qkv_input(
    act: Float[Tensor, "batch pos head d_head"],
    normed: Float[Tensor, "batch pos d_model"],
    weights: tuple[Tensor, Tensor | None],
    layer: int,
    head: int,
    which: str,
    refusal: str,
) -> None:
    """Raise a RuntimeError (ending in ``refusal``, what is not supported) where head ``head``'s
    ``hook_q/k/v`` is not ``normed W + b``: an analysis that moves a head's input through
    ``ln1`` and its own product relies on it. ``weights``: :func:`qkv_weights`' pair."""
    W, b = weights
    ours = normed @ W[layer, head] + (0.0 if b is None else b[layer, head])
    gap = float((ours - act[:, :, head]).abs().max())
    if gap > QKV_ATOL * max(1.0, float(act[:, :, head].abs().max())):
        raise RuntimeError(
            f"blocks.{layer}.attn.hook_{which} is not ln1(x) W_{which.upper()} + "
            f"b_{which.upper()} on this model (off by {gap:.2e}); {refusal}"
        )


def soft_cap(model) -> float | None:
    """The final logit soft-cap ``c`` (logits are ``c * tanh(raw / c)``), or None."""
    cap = getattr(model.cfg, "output_logits_soft_cap", None)
    return float(cap) if cap is not None and float(cap) > 0 else None
