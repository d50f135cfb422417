"""Circuits through the embeddings, kept factored: ``d_vocab x d_vocab`` only as a slice.

* full QK circuit ``W_E W_QK W_Eᵀ``: how much a query token attends to a key token;
* full OV circuit ``W_E W_OV W_U``: how attending to a token moves each logit;
* direct path ``W_E W_U``: what a zero-layer transformer predicts (bigram statistics).

For GPT-2's 50,257 tokens one such matrix is 10 GB in float32, so they stay
``FactoredMatrix`` objects (two ``d_vocab x d_head`` factors) and :func:`materialize` computes
only the rows and columns asked for, refusing (:class:`MatrixTooLargeError`) what would not fit.

The approximation: between the embedding and a head sit a LayerNorm (and, in a deeper model,
everything earlier layers add); between a head and the unembedding, the final LayerNorm. With
``fold_ln=True`` the LayerNorms' weights, biases' directions and centring are folded in
(``interp.circuits.weights``); their division by a per-token scale, the biases, positional
embeddings and all other layers are left out. Full circuits describe what a head does with a
token's embedding alone, not what it does inside the model on a given prompt.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens.FactoredMatrix import FactoredMatrix

from interp.circuits.tolerances import ZERO_RTOL, negligible
from interp.circuits.weights import as_weights
from interp.foundation.sizes import available_host_bytes

__all__ = [
    "MatrixTooLargeError",
    "default_max_bytes",
    "materialize",
    "full_qk_circuit",
    "full_ov_circuit",
    "direct_path",
    "direct_path_top_tokens",
    "full_ov_diagonal",
    "top_copied_tokens",
]

logger = logging.getLogger(__name__)

GIB = 1024**3
DEFAULT_MAX_BYTES = GIB  # when available memory cannot be read
Index = Sequence[int] | Tensor | range | slice | None


class MatrixTooLargeError(MemoryError):
    """A dense matrix was asked for that would not fit the memory budget; says what to do."""


def default_max_bytes() -> int:
    """The budget :func:`materialize` uses by default: 1 GiB, or half the available memory
    when that is less (the result is followed by its own temporaries and a caller's copies)."""
    available = available_host_bytes()
    return DEFAULT_MAX_BYTES if available is None else min(DEFAULT_MAX_BYTES, available // 2)


def _index(idx: Index, size: int, what: str) -> Tensor | slice:
    if idx is None:
        return slice(None)
    if isinstance(idx, slice):
        return torch.arange(size)[idx]
    tensor = torch.as_tensor(list(idx) if isinstance(idx, range) else idx)
    if tensor.dtype == torch.bool:
        if tensor.shape != (size,):
            raise ValueError(
                f"a boolean {what} mask must have shape ({size},), got {tuple(tensor.shape)}"
            )
        return tensor.nonzero().squeeze(-1)
    tensor = tensor.long().reshape(-1)
    if tensor.numel() and (tensor.min() < -size or tensor.max() >= size):
        raise IndexError(
            f"{what} indices must lie in [0, {size - 1}], got values from "
            f"{int(tensor.min())} to {int(tensor.max())}"
        )
    return tensor


def _count(idx: Tensor | slice, size: int) -> int:
    return size if isinstance(idx, slice) else int(idx.numel())


def materialize(
    matrix: FactoredMatrix, rows: Index = None, cols: Index = None, *, max_bytes: int | None = None
) -> Tensor:
    """The dense ``matrix[..., rows, cols]`` (all rows / columns when None), memory-guarded.

    Raises :class:`MatrixTooLargeError` naming the size when the result would take more than
    ``max_bytes`` (default :func:`default_max_bytes`); nothing is allocated then.
    """
    budget = default_max_bytes() if max_bytes is None else int(max_bytes)
    r = _index(rows, matrix.ldim, "row")
    c = _index(cols, matrix.rdim, "column")
    shape = (*matrix.shape[:-2], _count(r, matrix.ldim), _count(c, matrix.rdim))
    itemsize = torch.empty((), dtype=torch.promote_types(matrix.A.dtype, matrix.B.dtype)).itemsize
    n_bytes = itemsize * int(torch.Size(shape).numel())
    if n_bytes > budget:
        raise MatrixTooLargeError(
            f"a dense {'x'.join(map(str, shape))} matrix needs {n_bytes / 1e9:.2f} GB, over the "
            f"{budget / 1e9:.2f} GB budget: pass rows=/cols= index sets to take a slice (e.g. "
            "rows=range(100)), keep it factored (FactoredMatrix @ vectors), or raise max_bytes"
        )
    return matrix.A[..., r, :] @ matrix.B[..., :, c]


def _head(w, layer: int, head: int) -> tuple[int, int]:
    if not (0 <= layer < w.n_layers and 0 <= head < w.n_heads):
        raise IndexError(
            f"head L{layer}H{head} does not exist: the model has {w.n_layers} "
            f"layers of {w.n_heads} heads"
        )
    return layer, head


def full_qk_circuit(model, layer: int, head: int, *, fold_ln: bool | None = None) -> FactoredMatrix:
    """``W_E W_Q W_Kᵀ W_Eᵀ`` ``[d_vocab(query) d_vocab(key)]`` for one head, factored.

    On a rotary model this is the content-only part: the model's scores also depend on the
    distance between query and key, which no matrix over tokens holds.
    """
    w = as_weights(model, fold_ln)
    layer, head = _head(w, layer, head)
    return FactoredMatrix(w.W_E @ w.W_Q[layer, head], (w.W_E @ w.W_K[layer, head]).T)


def full_ov_circuit(model, layer: int, head: int, *, fold_ln: bool | None = None) -> FactoredMatrix:
    """``W_E W_V W_O W_U`` ``[d_vocab(attended token) d_vocab(logit)]`` for one head, factored.

    Row ``t``: how the logits move when the head attends (fully) to token ``t``.
    """
    w = as_weights(model, fold_ln)
    layer, head = _head(w, layer, head)
    return FactoredMatrix(w.W_E @ w.W_V[layer, head], w.logits_from(w.W_O[layer, head]))


def direct_path(model, *, fold_ln: bool | None = None) -> FactoredMatrix:
    """``W_E W_U`` ``[d_vocab(current token) d_vocab(next token)]``, factored through d_model."""
    w = as_weights(model, fold_ln)
    return FactoredMatrix(w.W_E, w.unembed_cols())


def _decode(tokenizer, ids: Sequence[int]) -> list[str | None]:
    if tokenizer is None:
        return [None] * len(ids)
    return [tokenizer.decode([int(i)]) for i in ids]


def direct_path_top_tokens(
    model, tokens: Sequence[int] | Tensor, *, k: int = 10, fold_ln: bool | None = None
) -> pd.DataFrame:
    """The ``k`` next tokens the direct path ranks highest after each of ``tokens``.

    One row of ``W_E W_U`` per token, never the whole matrix. Columns: ``token, token_str,
    rank, next_token, next_token_str, logit`` (rank 1 = highest logit; strings are None without
    a tokenizer). Logits leave out the final LayerNorm's scale and the biases.
    """
    w = as_weights(model, fold_ln)
    ids = _index(tokens, w.d_vocab, "token")
    ids = torch.arange(w.d_vocab) if isinstance(ids, slice) else ids
    k = min(int(k), w.d_vocab)
    with torch.no_grad():
        logits = w.logits_from(w.W_E[ids])
        top = logits.topk(k, dim=-1)
    records = []
    for token, values, nexts in zip(
        ids.tolist(), top.values.tolist(), top.indices.tolist(), strict=True
    ):
        for rank, (value, nxt) in enumerate(zip(values, nexts, strict=True), start=1):
            records.append((token, rank, nxt, value))
    df = pd.DataFrame(records, columns=["token", "rank", "next_token", "logit"])
    df.insert(1, "token_str", _decode(w.tokenizer, df["token"].tolist()))
    df.insert(4, "next_token_str", _decode(w.tokenizer, df["next_token"].tolist()))
    return df


def full_ov_diagonal(
    model, layer: int, head: int, *, fold_ln: bool | None = None
) -> Float[Tensor, " d_vocab"]:
    """Diagonal of the full OV circuit: how attending to token t moves t's own logit.

    One dot product per token of the two ``d_vocab x d_head`` factors, never the vocab² matrix.
    """
    with torch.no_grad():
        ov = full_ov_circuit(model, layer, head, fold_ln=fold_ln)
        return (ov.A * ov.B.T).sum(dim=-1)


def top_copied_tokens(
    model, layer: int, head: int, *, k: int = 10, fold_ln: bool | None = None
) -> pd.DataFrame:
    """The ``k`` tokens whose own logit the head raises most when it attends to them.

    Columns: ``token, token_str, diagonal, row_rank``: the full OV circuit's diagonal entry and
    where that entry ranks within its row (1: no other logit is raised more, i.e. the head
    predicts exactly the token it attends to). A head whose full OV circuit is numerically zero
    copies nothing: it gets no rows, and ``df.attrs["undefined"]`` is True (False otherwise).
    """
    w = as_weights(model, fold_ln)
    with torch.no_grad():
        ov = full_ov_circuit(w, layer, head)
        A, B = ov.A.double(), ov.B.double()
        # ||AB||_F² = tr(AᵀA BBᵀ): the circuit's size without forming it
        norm = ((A.T @ A) * (B @ B.T)).sum().clamp(min=0).sqrt()
        sizes = w.W_V.flatten(-2).norm(dim=-1) * w.W_O.flatten(-2).norm(dim=-1)
        undefined = not bool(norm > ZERO_RTOL * A.norm() * B.norm()) or bool(
            negligible(sizes)[layer, head]
        )
        diag = (ov.A * ov.B.T).sum(dim=-1)
        top = diag.topk(0 if undefined else min(int(k), w.d_vocab))
        rows = ov.A[top.indices] @ ov.B  # k rows of the full circuit, one d_vocab row each
        # compare within each computed row: the diagonal summed another way rounds differently
        own = rows.gather(1, top.indices[:, None])
        row_rank = (rows > own).sum(dim=-1) + 1
    ids = top.indices.tolist()
    df = pd.DataFrame(
        {
            "token": ids,
            "token_str": _decode(w.tokenizer, ids),
            "diagonal": top.values.tolist(),
            "row_rank": row_rank.tolist(),
        }
    )
    df.attrs["undefined"] = undefined
    return df
