"""Q-, K- and V-composition scores between heads of different layers, and a random baseline.

A head writes ``x W_OV`` into the residual stream; a later head reads it into its queries
(Q-composition: ``W_OV W_QK``), keys (K-composition: ``W_OV W_QKᵀ``) or values
(V-composition: ``W_OV W_OV'``). The paper's score ("A Mathematical Framework for Transformer
Circuits") is ``||W_A W_B||_F / (||W_A||_F ||W_B||_F)`` (TransformerLens
``all_composition_scores`` uses the same, row-vector convention as here).

Each side is a rank-``d_head`` product of two factors. With ``W_A = A1 A2`` and
``A1ᵀA1 = L Lᵀ`` (a ``d_head x d_head`` Cholesky factor), ``||W_A X|| = ||Lᵀ A2 X||``;
likewise on the right. So every score
is the Frobenius norm of a ``d_head x d_head`` product of ``d_head x d_model`` and
``d_model x d_head`` matrices, computed one source layer at a time as one matrix product
against all later heads; no ``d_model x d_model`` matrix is formed.

Scores are small even for unrelated heads: random matrices of the same shapes score about
``1/sqrt(d_model)``-ish, not 0. :func:`composition_baseline` samples that level (Gaussian
factors, seeded); read a score against it, not against zero.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from interp.circuits.copying import ZERO_RTOL, negligible
from interp.circuits.weights import CircuitWeights, as_weights

__all__ = [
    "KINDS",
    "composition_scores",
    "composition_scores_dense",
    "composition_baseline",
    "BASELINE_SAMPLES",
]

logger = logging.getLogger(__name__)

KINDS = ("Q", "K", "V")  # which input of the later head the earlier head writes into
COLUMNS = [
    "kind",
    "src_layer",
    "src_head",
    "dst_layer",
    "dst_head",
    "score",
    "baseline",
    "undefined",
    "src_kv_head",
    "dst_kv_head",
]
BASELINE_SAMPLES = 200  # std of the mean ~ std/14: three digits at GPT-2 small's shapes


def _right_factors(w: CircuitWeights, kind: str) -> tuple[Tensor, Tensor]:
    """The later head's matrix that an earlier head's output is multiplied into."""
    if kind == "Q":  # the output is part of the query: x_src W_OV W_Q W_Kᵀ x_keyᵀ
        return w.W_Q, w.W_K.transpose(-2, -1)
    if kind == "K":  # the output is part of the key: x_query W_QK (x_src W_OV)ᵀ
        return w.W_K, w.W_Q.transpose(-2, -1)
    return w.W_V, w.W_O  # the output is moved again: x_src W_OV W_OV'


def _gram_root(G: Float[Tensor, "... d_head d_head"]) -> Float[Tensor, "... d_head d_head"]:
    """``L`` with ``L Lᵀ == G`` for PSD ``G`` (float64 Cholesky; eigh where it is singular).

    Cholesky rather than QR of the tall factor: batched LAPACK QR/eigh of 144 small matrices
    takes seconds on a busy 2-core machine, Cholesky milliseconds.
    """
    G64 = G.double()
    root, info = torch.linalg.cholesky_ex(G64)
    singular = info > 0
    if singular.any():  # a rank-deficient head (e.g. zeroed): any square root will do
        lam, vec = torch.linalg.eigh(G64[singular])
        root[singular] = vec * lam.clamp(min=0).sqrt()[..., None, :]
    return root.to(G.dtype)


def _reduce_left(
    A1: Float[Tensor, "... d_model d_head"], A2: Float[Tensor, "... d_head d_model"]
) -> Float[Tensor, "... d_head d_model"]:
    """``C`` with ``||A1 A2 X||_F == ||C X||_F`` for every X: ``C = Lᵀ A2``, ``A1ᵀA1 = L Lᵀ``."""
    return _gram_root(A1.transpose(-2, -1) @ A1).transpose(-2, -1) @ A2


def _reduce_right(
    B1: Float[Tensor, "... d_model d_head"], B2: Float[Tensor, "... d_head d_model"]
) -> Float[Tensor, "... d_model d_head"]:
    """``D`` with ``||X B1 B2||_F == ||X D||_F`` for every X: ``D = B1 L``, ``B2 B2ᵀ = L Lᵀ``."""
    return B1 @ _gram_root(B2 @ B2.transpose(-2, -1))


def _undefined(reduced: Tensor, F1: Tensor, F2: Tensor) -> Tensor:
    """Heads whose product is numerically zero relative to its factors, or whose factors are
    negligible next to the model's other heads (no score exists)."""
    bound = F1.flatten(-2).norm(dim=-1) * F2.flatten(-2).norm(dim=-1)
    return (reduced.flatten(-2).norm(dim=-1) <= ZERO_RTOL * bound) | negligible(bound)


def composition_baseline(
    d_model: int, d_head: int, *, n_samples: int = BASELINE_SAMPLES, seed: int = 0
) -> tuple[float, float]:
    """Mean and std of the composition score of random rank-``d_head`` products.

    Both sides are ``G1 G2`` with Gaussian ``G1 [d_model d_head]``, ``G2 [d_head d_model]``
    (the score is scale-free, so the variance does not matter), ``n_samples`` pairs drawn from
    a generator seeded with ``seed``. The same shapes serve Q-, K- and V-composition.
    """
    if n_samples < 2:
        raise ValueError(f"n_samples must be at least 2 to give a spread, got {n_samples}")
    gen = torch.Generator().manual_seed(seed)

    def draw(*shape: int) -> Tensor:
        return torch.randn(n_samples, *shape, generator=gen)

    C = _reduce_left(draw(d_model, d_head), draw(d_head, d_model))
    D = _reduce_right(draw(d_model, d_head), draw(d_head, d_model))
    scores = (C @ D).flatten(-2).norm(dim=-1) / (
        C.flatten(-2).norm(dim=-1) * D.flatten(-2).norm(dim=-1)
    )
    return float(scores.mean()), float(scores.std())


def _kinds(kind: str | Sequence[str]) -> list[str]:
    kinds = [kind] if kind in KINDS else list(kind)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"kind must be one of {KINDS} (or a sequence of them), got {kind!r}")
    return kinds


def _frame(
    kind: str,
    scores: Float[Tensor, "layer head layer head"],
    baseline: float,
    undefined: Tensor,
    w: CircuitWeights,
) -> pd.DataFrame:
    """Long format, only pairs with src_layer < dst_layer; undefined pairs hold NaN."""
    L, H = scores.shape[:2]
    grid = torch.stack(
        torch.meshgrid(
            torch.arange(L), torch.arange(H), torch.arange(L), torch.arange(H), indexing="ij"
        ),
        dim=-1,
    ).reshape(-1, 4)
    keep = grid[:, 0] < grid[:, 2]
    undefined = undefined.expand(L, H, L, H).reshape(-1).cpu()[keep]
    grid = grid[keep]
    values = scores.reshape(-1).cpu()[keep].double().masked_fill(undefined, float("nan"))
    return pd.DataFrame(
        {
            "kind": kind,
            "src_layer": grid[:, 0].numpy(),
            "src_head": grid[:, 1].numpy(),
            "dst_layer": grid[:, 2].numpy(),
            "dst_head": grid[:, 3].numpy(),
            "score": values.numpy(),
            "baseline": baseline,
            "undefined": undefined.numpy(),
            "src_kv_head": w.kv_head(grid[:, 1]).numpy(),
            "dst_kv_head": w.kv_head(grid[:, 3]).numpy(),
        },
        columns=COLUMNS,
    )


def composition_scores(
    model,
    kind: str | Sequence[str] = "K",
    *,
    fold_ln: bool | None = None,
    baseline_samples: int = BASELINE_SAMPLES,
    seed: int = 0,
) -> pd.DataFrame:
    """Composition scores of every earlier-layer head into every later-layer head.

    ``kind`` is ``"Q"``, ``"K"``, ``"V"`` or a sequence of them. Returns columns ``kind,
    src_layer, src_head, dst_layer, dst_head, score, baseline, undefined, src_kv_head,
    dst_kv_head``; ``baseline`` is :func:`composition_baseline`'s mean for these shapes. A pair
    with a numerically-zero side (e.g. a pruned head, exactly-zero ``W_V``/``W_O`` or
    ``W_Q``/``W_K``) has score NaN and ``undefined=True``. ``*_kv_head``: the key/value head a
    grouped-query head shares (equal to the head otherwise). ``fold_ln`` as in
    ``circuit_weights``: the later head reads through its LayerNorm's weight and centring.
    """
    kinds = _kinds(kind)
    w = as_weights(model, fold_ln)
    L, H, d, r = w.W_Q.shape
    baseline, _ = composition_baseline(d, r, n_samples=baseline_samples, seed=seed)
    frames = []
    with torch.no_grad():
        C = _reduce_left(w.W_V, w.W_O)  # [L H r d]: every source head's W_OV
        C_undef = _undefined(C, w.W_V, w.W_O)
        C_norm = C.flatten(-2).norm(dim=-1)
        for k in kinds:
            B1, B2 = _right_factors(w, k)
            D = _reduce_right(B1, B2)  # [L H d r]
            D_undef = _undefined(D, B1, B2)
            D_norm = D.flatten(-2).norm(dim=-1)
            D_flat = D.permute(2, 0, 1, 3).reshape(d, L * H * r)
            scores = torch.full((L, H, L, H), float("nan"), dtype=C.dtype)
            for src in range(L - 1):
                n_later = L - src - 1
                prod = C[src].reshape(H * r, d) @ D_flat[:, (src + 1) * H * r :]
                num = prod.view(H, r, n_later, H, r).pow(2).sum(dim=(1, 4)).sqrt()
                scores[src, :, src + 1 :] = num / (
                    C_norm[src][:, None, None] * D_norm[src + 1 :][None]
                )
            bad = C_undef[:, :, None, None] | D_undef[None, None]
            frame = _frame(k, scores, baseline, bad, w)
            if frame["undefined"].any():
                logger.warning(
                    "%s-composition undefined for %d head pairs (a numerically-zero circuit)",
                    k,
                    int(frame["undefined"].sum()),
                )
            frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def composition_scores_dense(
    model,
    kind: str | Sequence[str] = "K",
    *,
    fold_ln: bool | None = None,
    baseline_samples: int = BASELINE_SAMPLES,
    seed: int = 0,
) -> pd.DataFrame:
    """Reference: the same scores from materialised ``d_model x d_model`` matrices (float64).

    Holds ``2 * layer * head`` such matrices and does ``d_model³`` work per pair: small models.
    """
    kinds = _kinds(kind)
    w = as_weights(model, fold_ln)
    L, H, d, r = w.W_Q.shape
    baseline, _ = composition_baseline(d, r, n_samples=baseline_samples, seed=seed)
    OV = w.W_V.double() @ w.W_O.double()
    right = {"Q": w.W_Q.double() @ w.W_K.double().transpose(-2, -1)}
    right["K"] = right["Q"].transpose(-2, -1)
    right["V"] = OV
    OV_undef = _undefined(OV, w.W_V.double(), w.W_O.double())
    right_undef = {
        k: _undefined(right[k], *(f.double() for f in _right_factors(w, k))) for k in kinds
    }
    frames = []
    for k in kinds:
        R = right[k]  # [L H d d]
        R_norm = R.flatten(-2).norm(dim=-1)
        scores = torch.empty(L, H, L, H, dtype=torch.float64)
        for src in range(L):  # one source head at a time keeps memory at L*H*d² floats
            for head in range(H):
                num = (OV[src, head] @ R).flatten(-2).norm(dim=-1)
                scores[src, head] = num / (OV[src, head].norm() * R_norm)
        bad = OV_undef[:, :, None, None] | right_undef[k][None, None]
        frames.append(_frame(k, scores, baseline, bad, w))
    return pd.concat(frames, ignore_index=True)
