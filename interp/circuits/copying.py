"""Copying scores: does attending to a token raise that same token's logit?

The full OV circuit ``W_E W_V W_O W_U`` maps "the head attends to token t" to a change of every
logit. A copying head has mostly positive eigenvalues; the paper ("A Mathematical Framework for
Transformer Circuits") summarises them as ``Σλ / Σ|λ|`` in ``[-1, 1]`` (real for a real matrix,
whose complex eigenvalues come in conjugate pairs).

The vocab x vocab matrix has rank ``d_head``; its non-zero eigenvalues are those of the
``d_head x d_head`` matrix ``W_O (W_U W_E) W_V`` (``AB`` and ``BA`` share them), and
``W_U W_E`` is one ``d_model x d_model`` product for all heads. For GPT-2 small that is ~60
GFLOP in total instead of 144 eigendecompositions of a 50,257² matrix (10 GB each).

A head whose eigenvalues are all numerically zero (a pruned head, one with exactly-zero
``W_V`` or ``W_O``, or one whose output the final LayerNorm centres away) has no copying score:
it is reported as NaN with ``undefined=True``, never as a score. Heads whose small matrix is
itself numerically zero never reach the eigenvalue solver, and a head the solver cannot
handle is reported as undefined rather than failing the whole table. With grouped-query
attention every query head has its own score; ``kv_head`` names the value head it shares.
"""

from __future__ import annotations

import logging

import pandas as pd
import torch
from jaxtyping import Complex, Float
from torch import Tensor
from transformer_lens.FactoredMatrix import FactoredMatrix

from interp.circuits.full import full_ov_circuit, materialize
from interp.circuits.tolerances import ZERO_RTOL, negligible
from interp.circuits.weights import CircuitWeights, as_weights
from interp.foundation.fallbacks import warn_fallback

__all__ = ["ZERO_RTOL", "negligible", "ov_eigenvalues", "copying_scores", "copying_scores_dense"]

logger = logging.getLogger(__name__)


def _ov_inner(
    w: CircuitWeights,
) -> tuple[Float[Tensor, "layer head d_head d_head"], Float[Tensor, "layer head"]]:
    """``W_O (W_U W_E) W_V`` per head, and the norm bound that says what "zero" is."""
    M = w.unembed_times(w.W_E)  # [d_model d_model]: W_U_effective @ W_E, once for all heads
    inner = (w.W_O @ M) @ w.W_V
    bound = w.W_O.flatten(-2).norm(dim=-1) * M.norm() * w.W_V.flatten(-2).norm(dim=-1)
    return inner, bound


def ov_eigenvalues(model, *, fold_ln: bool | None = None) -> Complex[Tensor, "layer head d_head"]:
    """Non-zero eigenvalues of every head's full OV circuit (complex128), via the small matrix.

    A head the eigenvalue solver fails on (or with non-finite weights) gets NaN eigenvalues.
    """
    w = as_weights(model, fold_ln)
    with torch.no_grad():
        inner, _ = _ov_inner(w)
        skip = torch.zeros(inner.shape[:2], dtype=torch.bool, device=inner.device)
        eig, failed = _safe_eigvals(inner, skip)
        return eig.masked_fill(failed[..., None], complex(float("nan"), float("nan")))


def _safe_eigvals(
    mats: Float[Tensor, "layer head n n"], skip: Tensor
) -> tuple[Complex[Tensor, "layer head n"], Tensor]:
    """Eigenvalues of every matrix not in ``skip``; ``failed`` marks where LAPACK gave up.

    Skipped (numerically-zero) matrices get eigenvalues 0 without calling the solver; if the
    batched call fails, each matrix is retried alone so one bad head cannot sink the table.
    """
    mats = mats.double().masked_fill(skip[..., None, None], 0.0)
    failed = torch.zeros_like(skip)
    finite = torch.isfinite(mats).flatten(-2).all(dim=-1)
    failed |= ~finite
    mats = mats.masked_fill(~finite[..., None, None], 0.0)
    try:
        return torch.linalg.eigvals(mats), failed
    except torch.linalg.LinAlgError:  # did not converge (out of memory is raised)
        warn_fallback(
            logger,
            "copying:eigvals",
            "copying scores: the batched eigenvalue solver did not converge; solving each "
            "head's matrix alone (slower), heads that still fail are marked undefined",
        )
        eig = torch.zeros(mats.shape[:-1], dtype=torch.complex128, device=mats.device)
        for index in (~skip & ~failed).nonzero().tolist():
            try:
                eig[tuple(index)] = torch.linalg.eigvals(mats[tuple(index)])
            except torch.linalg.LinAlgError:
                failed[tuple(index)] = True
        return eig, failed


def _frame(scores: Tensor, undefined: Tensor, w: CircuitWeights | None = None) -> pd.DataFrame:
    n_layers, n_heads = scores.shape
    scores, undefined = scores.cpu(), undefined.cpu()
    heads = torch.arange(n_heads).repeat(n_layers)
    df = pd.DataFrame(
        {
            "layer": torch.arange(n_layers).repeat_interleave(n_heads).tolist(),
            "head": heads.tolist(),
            "copying_score": scores.masked_fill(undefined, float("nan")).flatten().tolist(),
            "undefined": undefined.flatten().tolist(),
            "kv_head": (heads if w is None else w.kv_head(heads)).tolist(),
        }
    )
    if undefined.any():
        flagged = df[df["undefined"]]
        names = ", ".join(
            f"L{lay}H{h}" for lay, h in zip(flagged["layer"], flagged["head"], strict=True)
        )
        logger.warning("copying score undefined (all OV eigenvalues numerically zero): %s", names)
    return df


def copying_scores(model, *, fold_ln: bool | None = None) -> pd.DataFrame:
    """``Σλ / Σ|λ|`` of every head's full OV circuit, from ``d_head x d_head`` eigenproblems.

    Returns columns ``layer, head, copying_score, undefined, kv_head`` (``kv_head``: the
    key/value head a grouped-query head shares; equal to ``head`` otherwise). ``model`` is a
    TransformerBridge or :class:`~interp.circuits.weights.CircuitWeights`; ``fold_ln`` as in
    ``circuit_weights``.
    """
    w = as_weights(model, fold_ln)
    with torch.no_grad():
        inner, bound = _ov_inner(w)
        bound = bound.double()
        zero = (inner.double().flatten(-2).norm(dim=-1) <= ZERO_RTOL * bound) | negligible(bound)
        eig, failed = _safe_eigvals(inner, zero)
    abs_sum = eig.abs().sum(dim=-1)
    undefined = zero | failed | ~(abs_sum > ZERO_RTOL * bound)
    ratio = eig.sum(dim=-1).real / abs_sum.masked_fill(undefined, 1.0)
    return _frame(ratio.float(), undefined, w)


def copying_scores_dense(
    model, *, fold_ln: bool | None = None, max_bytes: int | None = None
) -> pd.DataFrame:
    """Reference: eigenvalues of each materialised ``d_vocab x d_vocab`` full OV circuit.

    Float64, one head at a time, memory-guarded (``max_bytes`` as in ``materialize``); only for
    small vocabularies. Numerically-zero heads are flagged with the same rule as the fast path.
    """
    w = as_weights(model, fold_ln)
    _, bound = _ov_inner(w)
    bound = bound.double().cpu()  # the table is assembled on the CPU, whatever the device
    scores = torch.zeros(w.n_layers, w.n_heads, dtype=torch.float64)
    abs_sums = torch.zeros_like(scores)
    with torch.no_grad():
        for layer in range(w.n_layers):
            for head in range(w.n_heads):
                ov = full_ov_circuit(w, layer, head)
                ov64 = FactoredMatrix(ov.A.double(), ov.B.double())
                dense = materialize(ov64, max_bytes=max_bytes)
                skip = torch.zeros(1, 1, dtype=torch.bool, device=dense.device)
                eig, failed = _safe_eigvals(dense[None, None], skip)
                abs_sums[layer, head] = float("nan") if failed.any() else float(eig.abs().sum())
                scores[layer, head] = float(eig.sum().real) / abs_sums[layer, head]
    # NaN (the solver failed) counts as undefined too
    undefined = ~(abs_sums > ZERO_RTOL * bound) | negligible(bound)
    return _frame(scores.float(), undefined, w)
