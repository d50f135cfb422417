"""The QK and OV products of :class:`~interp.circuits.weights.CircuitWeights`, and the attention
scores and head outputs they reproduce from weights alone (checked against cached runs in
tests/circuits/test_circuits.py)."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens.FactoredMatrix import FactoredMatrix

from interp.circuits.weights import as_weights

__all__ = [
    "qk_circuit",
    "ov_circuit",
    "attention_scores_from_weights",
    "head_outputs_from_weights",
]


def _with_bias_row(W: Tensor, b: Tensor) -> Tensor:
    return torch.cat([W, b[..., None, :]], dim=-2)  # reads [x, 1]: the bias is the last row


def qk_circuit(model, *, fold_ln: bool | None = None, with_bias: bool = False) -> FactoredMatrix:
    """Every head's QK circuit ``W_Q W_Kᵀ`` as a ``FactoredMatrix [layer head d_model d_model]``.

    Scores are ``x @ QK @ xᵀ / attn_scale`` for ``x`` what the head reads (``hook_normalized``
    with ``fold_ln=True``, the LayerNorm's output with ``fold_ln=False``). ``with_bias=True``
    appends the biases as a last row and column, ``[layer head d_model+1 d_model+1]``, acting on
    ``[x, 1]``: then the bilinear form is the model's scores exactly (non-rotary models).
    """
    w = as_weights(model, fold_ln)
    W_Q, W_K = (
        (_with_bias_row(w.W_Q, w.b_Q), _with_bias_row(w.W_K, w.b_K))
        if with_bias
        else (w.W_Q, w.W_K)
    )
    return FactoredMatrix(W_Q, W_K.transpose(-2, -1))


def ov_circuit(model, *, fold_ln: bool | None = None, with_bias: bool = False) -> FactoredMatrix:
    """Every head's OV circuit ``W_V W_O`` as a ``FactoredMatrix [layer head d_model d_model]``.

    A head's output at a position is ``pattern @ (x @ OV)``; ``with_bias=True`` adds ``b_V`` as
    a last row (``[layer head d_model+1 d_model]`` acting on ``[x, 1]``). ``b_O`` is per layer,
    not per head, and is left out, as in ``run_cached(..., head_outputs=True)``.
    """
    w = as_weights(model, fold_ln)
    W_V = _with_bias_row(w.W_V, w.b_V) if with_bias else w.W_V
    return FactoredMatrix(W_V, w.W_O)


def _augment(x: Tensor) -> Tensor:
    return torch.cat([x, torch.ones_like(x[..., :1])], dim=-1)


def attention_scores_from_weights(
    model,
    layer: int,
    resid_in: Float[Tensor, "batch pos d_model"],
    *,
    fold_ln: bool | None = None,
    ignore_rotary: bool = False,
) -> Float[Tensor, "batch head q_pos k_pos"]:
    """Attention scores of every head in ``layer`` from the QK circuit with biases (unmasked).

    ``resid_in`` is what the heads read: ``blocks.L.ln1.hook_normalized`` with ``fold_ln=True``
    (the default), the LayerNorm's output with ``fold_ln=False``. Entries with ``k_pos > q_pos``
    are the bilinear form, not the model's (masked) scores. Rotary models rotate queries and keys
    by their positions, which no weight matrix holds: the result equals the model's scores only
    where ``q_pos == k_pos``, so it is refused unless ``ignore_rotary=True``. A model that
    soft-caps its scores (Gemma 2) gets the cap applied, as the model does.
    """
    w = as_weights(model, fold_ln)
    if w.rotary and not ignore_rotary:
        raise ValueError(
            "this model has rotary positions: scores through the weights match the "
            "model's only where q_pos == k_pos; pass ignore_rotary=True for that "
            "position-free bilinear form"
        )
    qk = qk_circuit(w, with_bias=True)[layer]  # [head d_model+1 d_model+1]
    x = _augment(resid_in.to(w.W_Q.dtype))
    left = torch.einsum("bqm,hmd->bhqd", x, qk.A)
    right = torch.einsum("hdm,bkm->bhdk", qk.B, x)
    scores = left @ right / w.attn_scale
    if w.attn_soft_cap is not None:  # Gemma 2 caps the product: cap * tanh(score / cap)
        scores = w.attn_soft_cap * torch.tanh(scores / w.attn_soft_cap)
    return scores


def head_outputs_from_weights(
    model,
    layer: int,
    resid_in: Float[Tensor, "batch pos d_model"],
    pattern: Float[Tensor, "batch head q_pos k_pos"],
    *,
    fold_ln: bool | None = None,
) -> Float[Tensor, "batch pos head d_model"]:
    """Each head's write to the residual stream, ``pattern @ ([x, 1] @ OV_with_bias)``.

    Holds for rotary models too: the rotation touches queries and keys, not values.
    """
    w = as_weights(model, fold_ln)
    ov = ov_circuit(w, with_bias=True)[layer]
    values = torch.einsum("bkm,hmd->bhkd", _augment(resid_in.to(w.W_V.dtype)), ov.A)
    z = pattern.to(values.dtype) @ values  # [batch head q_pos d_head]
    return torch.einsum("bhqd,hdm->bqhm", z, ov.B)
