"""The weights every circuit is built from, with LayerNorm folded in (the per-head products are
in :mod:`interp.circuits.products`).

A head reads the residual stream through a LayerNorm: ``LN(x) = (x - mean x) / scale * w + b``.
The weight-level view ("A Mathematical Framework for Transformer Circuits") wants linear maps,
so :func:`circuit_weights` folds everything linear about the LayerNorm into the weights that read
from it (``fold_ln=True``, the default)::

    W_Q' = P diag(w) W_Q        b_Q' = b_Q + b W_Q        (same for K and V)
    W_U' = P diag(w_f) W_U  with its mean over the vocabulary removed

where ``P = I - 11ᵀ/d_model`` is the centring LayerNorm applies. On the LN-normalised residual
(``blocks.L.ln1.hook_normalized``, already centred and divided by its scale) the folded weights
are *exact*: ``hook_normalized @ W_Q' + b_Q'`` is the model's query. The one thing no weight can
hold is the division by the per-token scale; circuits that start at the embeddings
(``interp.circuits.full``) leave it out, which is the usual approximation. Removing the
vocabulary mean of ``W_U`` drops a constant per logit row that softmax never sees.

These are the same weights TransformerLens's ``fold_ln`` + ``center_writing_weights`` +
``center_unembed`` produce (tests/circuits/test_circuits.py checks them against
``enable_compatibility_mode()``), except that the centring sits on the reading side, so the
per-head outputs ``z @ W_O`` stay the model's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from interp.models.offload import materialized

__all__ = ["CircuitWeights", "as_weights", "circuit_weights"]


@dataclass(frozen=True, eq=False)
class CircuitWeights:
    """Attention, embedding and unembedding weights as the circuits use them.

    Build from a model with :func:`circuit_weights`, or directly from tensors (benchmarks,
    synthetic experiments). ``W_U`` is stored as given; the effective unembedding is
    ``unembed_in @ W_U`` with, if ``center_unembed``, its mean over the vocabulary removed. It is
    applied through :meth:`unembed_times`, :meth:`logits_from` and :meth:`unembed_cols`, so that
    a ``d_model x d_vocab`` copy is never made.
    """

    W_E: Float[Tensor, "d_vocab d_model"]
    W_Q: Float[Tensor, "layer head d_model d_head"]
    W_K: Float[Tensor, "layer head d_model d_head"]
    W_V: Float[Tensor, "layer head d_model d_head"]
    W_O: Float[Tensor, "layer head d_head d_model"]
    b_Q: Float[Tensor, "layer head d_head"]
    b_K: Float[Tensor, "layer head d_head"]
    b_V: Float[Tensor, "layer head d_head"]
    W_U: Float[Tensor, "d_model d_vocab"]
    unembed_in: Float[Tensor, "d_model d_model"] | None = None  # None: the identity
    center_unembed: bool = False
    attn_scale: float = 1.0  # scores = q·k / attn_scale
    ln_folded: bool = False  # True when built with fold_ln=True (reads hook_normalized)
    rotary: bool = False  # rotary positions: QK through weights ignores the rotation
    tokenizer: Any = field(default=None, repr=False)
    # grouped-query attention: W_K/W_V/b_K/b_V above are expanded to one per query head; query
    # head h reads key/value head h // (n_heads // n_kv_heads). None: one per query head.
    n_kv_heads: int | None = None
    # Gemma 2 caps attention scores, cap * tanh(score / cap); None: no cap. The QK circuit is
    # the bilinear form before the cap.
    attn_soft_cap: float | None = None

    def __post_init__(self) -> None:
        n_layers, n_heads, d_model, d_head = self.W_Q.shape
        expected = {
            "W_E": (self.d_vocab, d_model),
            "W_K": (n_layers, n_heads, d_model, d_head),
            "W_V": (n_layers, n_heads, d_model, d_head),
            "W_O": (n_layers, n_heads, d_head, d_model),
            "b_Q": (n_layers, n_heads, d_head),
            "b_K": (n_layers, n_heads, d_head),
            "b_V": (n_layers, n_heads, d_head),
            "W_U": (d_model, self.d_vocab),
        }
        if self.unembed_in is not None:
            expected["unembed_in"] = (d_model, d_model)
        for name, shape in expected.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ValueError(
                    f"{name} has shape {got} but W_Q {tuple(self.W_Q.shape)} and W_E "
                    f"{tuple(self.W_E.shape)} need {shape}"
                )
        if not self.attn_scale > 0:
            raise ValueError(f"attn_scale must be positive, got {self.attn_scale}")
        if self.n_kv_heads is not None and (self.n_kv_heads < 1 or n_heads % self.n_kv_heads):
            raise ValueError(
                f"n_kv_heads must divide the {n_heads} query heads, got {self.n_kv_heads}"
            )

    def __repr__(self) -> str:
        kv = "" if self.n_kv_heads is None else f", n_kv_heads={self.n_kv_heads}"
        return (
            f"CircuitWeights(layers={self.n_layers}, heads={self.n_heads}, "
            f"d_model={self.d_model}, d_head={self.d_head}, d_vocab={self.d_vocab}{kv}, "
            f"dtype={str(self.W_Q.dtype).removeprefix('torch.')}, "
            f"ln_folded={self.ln_folded}, center_unembed={self.center_unembed}, "
            f"rotary={self.rotary})"
        )

    def kv_head(self, head: int | Tensor) -> int | Tensor:
        """The key/value head that query head ``head`` reads (itself without GQA)."""
        return head if self.n_kv_heads is None else head // (self.n_heads // self.n_kv_heads)

    n_layers = property(lambda self: self.W_Q.shape[0])
    n_heads = property(lambda self: self.W_Q.shape[1])
    d_model = property(lambda self: self.W_Q.shape[2])
    d_head = property(lambda self: self.W_Q.shape[3])
    d_vocab = property(lambda self: self.W_E.shape[0])

    @cached_property
    def _unembed_mean(self) -> Float[Tensor, " d_model"] | None:
        return self.W_U.mean(dim=1) if self.center_unembed else None

    def _pre(self, x: Float[Tensor, "n d_model"]) -> Float[Tensor, "n d_model"]:
        return x if self.unembed_in is None else x @ self.unembed_in

    def logits_from(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_vocab"]:
        """``x @ W_U_effective``: residual directions to logits (one row per direction)."""
        pre = self._pre(x)
        logits = pre @ self.W_U
        if self._unembed_mean is not None:
            logits = logits - (pre @ self._unembed_mean)[..., None]
        return logits

    def unembed_times(self, y: Float[Tensor, "d_vocab k"]) -> Float[Tensor, "d_model k"]:
        """``W_U_effective @ y`` without forming ``W_U_effective``."""
        out = self.W_U @ y
        if self._unembed_mean is not None:
            out = out - self._unembed_mean[:, None] * y.sum(dim=0)[None, :]
        return out if self.unembed_in is None else self.unembed_in @ out

    def unembed_cols(self, cols: Tensor | slice = slice(None)) -> Float[Tensor, "d_model n"]:
        """Columns of ``W_U_effective`` (all of them by default: a ``d_model x d_vocab`` copy)."""
        out = self.W_U[:, cols]
        if self._unembed_mean is not None:
            out = out - self._unembed_mean[:, None]
        return out if self.unembed_in is None else self.unembed_in @ out


def _norm_affine(norm, d_model: int, like: Tensor) -> tuple[Tensor, Tensor, bool]:
    """``(weight, bias, centres)`` of a normalisation module; identity for none / param-free."""
    ones, zeros = torch.ones(d_model, dtype=like.dtype), torch.zeros(d_model, dtype=like.dtype)
    ones, zeros = ones.to(like.device), zeros.to(like.device)
    if norm is None or isinstance(norm, torch.nn.Identity):
        return ones, zeros, False
    centres = not getattr(norm, "uses_rms_norm", False)
    component = getattr(norm, "original_component", None)
    if type(norm).__name__ in ("LayerNormPreBridge", "RMSNormPreBridge") or component is None:
        return ones, zeros, centres
    weight = getattr(component, "weight", None)
    bias = getattr(component, "bias", None)
    weight = ones if weight is None else weight.detach().to(like)
    if getattr(norm, "uses_weight_offset", False):
        weight = 1.0 + weight
    bias = zeros if bias is None or not centres else bias.detach().to(like)
    return weight, bias, centres


def _fold_read(
    W: Float[Tensor, "head d_model d_head"],
    b: Float[Tensor, "head d_head"],
    ln_w: Tensor,
    ln_b: Tensor,
    centres: bool,
) -> tuple[Tensor, Tensor]:
    b_folded = b + torch.einsum("m,hmd->hd", ln_b, W)  # the LN bias passes through W
    W_folded = ln_w[:, None] * W
    if centres:  # P @ W: the LN centres its input, so a reader never sees the mean direction
        W_folded = W_folded - W_folded.mean(dim=-2, keepdim=True)
    return W_folded, b_folded


def _attn_scale(cfg) -> float:
    if getattr(cfg, "use_attn_scale", True) is False:
        return 1.0
    scale = getattr(cfg, "attn_scale", -1.0)
    return float(scale) if scale and scale > 0 else math.sqrt(cfg.d_head)


def _soft_cap(cfg) -> float | None:
    cap = getattr(cfg, "attn_scores_soft_cap", None)
    return float(cap) if cap is not None and cap > 0 else None


def _expand_kv(w: Tensor, n_heads: int) -> Tensor:
    """Grouped-query attention: query head h reads key/value head h // group."""
    return w if w.shape[1] == n_heads else w.repeat_interleave(n_heads // w.shape[1], dim=1)


def _bias(model, name: str, W_Q: Tensor) -> Float[Tensor, "layer head d_head"]:
    """A stacked attention bias, zeros for bias-free projections."""
    try:
        bias = getattr(model, name)
    except AttributeError:  # TransformerLens raises for checkpoints without this parameter
        bias = None
    if bias is None:
        return torch.zeros(W_Q.shape[:2] + W_Q.shape[3:], dtype=W_Q.dtype, device=W_Q.device)
    return _expand_kv(bias.detach().to(W_Q.dtype), W_Q.shape[1])


def circuit_weights(model, *, fold_ln: bool = True) -> CircuitWeights:
    """Read a TransformerBridge's weights (detached, float32 or wider) for circuit analysis.

    ``fold_ln=True`` folds each LayerNorm into the weights that read from it (see the module
    docstring); ``fold_ln=False`` returns the weights as stored. The model is not modified.
    """
    if isinstance(model, CircuitWeights):
        return model
    cfg = model.cfg
    n_heads = int(cfg.n_heads)
    # an offloaded model's weights are loaded while they are read (all of them, at once)
    with torch.no_grad(), materialized(model):
        ref = model.W_Q.detach()
        dtype = ref.dtype if ref.dtype in (torch.float32, torch.float64) else torch.float32

        def get(name: str) -> Tensor:
            return _expand_kv(getattr(model, name).detach().to(dtype), n_heads)

        n_kv = int(model.W_K.shape[1])
        W_Q, W_K, W_V, W_O = get("W_Q"), get("W_K"), get("W_V"), model.W_O.detach().to(dtype)
        b_Q, b_K, b_V = (_bias(model, name, W_Q) for name in ("b_Q", "b_K", "b_V"))
        W_E, W_U = model.W_E.detach().to(dtype), model.W_U.detach().to(dtype)
        unembed_in, center_unembed = None, False
        if fold_ln and getattr(cfg, "normalization_type", None) is not None:
            d_model = W_E.shape[1]
            Qs, Ks, Vs, bQs, bKs, bVs = [], [], [], [], [], []
            for layer in range(W_Q.shape[0]):
                ln_w, ln_b, centres = _norm_affine(
                    getattr(model.blocks[layer], "ln1", None), d_model, W_E
                )
                for W, b, Ws, bs in ((W_Q, b_Q, Qs, bQs), (W_K, b_K, Ks, bKs), (W_V, b_V, Vs, bVs)):
                    W_f, b_f = _fold_read(W[layer], b[layer], ln_w, ln_b, centres)
                    Ws.append(W_f)
                    bs.append(b_f)
            W_Q, W_K, W_V = torch.stack(Qs), torch.stack(Ks), torch.stack(Vs)
            b_Q, b_K, b_V = torch.stack(bQs), torch.stack(bKs), torch.stack(bVs)
            lnf_w, _, centres = _norm_affine(getattr(model, "ln_final", None), d_model, W_E)
            unembed_in = torch.diag(lnf_w)
            if centres:
                unembed_in = unembed_in - unembed_in.mean(dim=0, keepdim=True)
            center_unembed = True
    return CircuitWeights(
        W_E=W_E,
        W_Q=W_Q,
        W_K=W_K,
        W_V=W_V,
        W_O=W_O,
        b_Q=b_Q,
        b_K=b_K,
        b_V=b_V,
        W_U=W_U,
        unembed_in=unembed_in,
        center_unembed=center_unembed,
        attn_scale=_attn_scale(cfg),
        ln_folded=bool(fold_ln),
        rotary=getattr(cfg, "positional_embedding_type", "") == "rotary",
        tokenizer=getattr(model, "tokenizer", None),
        n_kv_heads=None if n_kv == n_heads else n_kv,
        attn_soft_cap=_soft_cap(cfg),
    )


def as_weights(model, fold_ln: bool | None) -> CircuitWeights:
    """A model or CircuitWeights as CircuitWeights; ``fold_ln=None`` means True for a model."""
    if isinstance(model, CircuitWeights):
        if fold_ln is not None and fold_ln != model.ln_folded:
            raise ValueError(
                f"these CircuitWeights were built with fold_ln={model.ln_folded}; "
                f"build them with circuit_weights(model, fold_ln={fold_ln}) or "
                "leave fold_ln unset"
            )
        return model
    return circuit_weights(model, fold_ln=True if fold_ln is None else fold_ln)
