"""The sums behind :func:`interp.discovery.features.feature_edge_scores`: each SAE feature's and
the error's change dotted with every later reader's gradient, and (``upstream``) each earlier
writer's change carried into each feature by the encoder's local gradient.

With ``g_R`` the gradient of the summed metric at reader ``R``'s input at a gradient point (the
corrupted run for EAP, each of the EAP-IG points), ``G = sum_{R at layer >= L} g_R`` (the
gradient at the SAE's stream: every later reader reads it) and ``m_j`` 1 where feature ``j``
fires at that point:

- ``F_j -> R``: ``sum_pos Δf_j (W_dec[j] . g_R)``; ``error -> R``: ``sum_pos Δerror . g_R``;
- ``W -> F_j``: ``sum_pos (W_dec[j] . G) m_j (W_enc[:, j] . Δw)``, the metric's gradient at
  the feature times the feature's change to first order (sparse feature circuits' edge);
- ``W -> error``: ``sum_pos G . Δw - sum_j (W -> F_j)``: the error is ``x - decode(f(x))``,
  so what does not go through the features goes through it.

Each is summed over the rows and points of the task and divided by their number; the caller
divides by ``C - K``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from interp.discovery.gradients import gradient_points, step_sums
from interp.discovery.graph import EdgeGraph, Reader
from interp.tasks import TaskMetric, TaskTokens

__all__ = ["FeatureDeltas", "FeatureTables", "feature_tables"]

_PRODUCT_ELEMENTS = 2**24  # a product [outer n features] is taken this many elements at a time


def _slices(n_outer: int, per_outer: int) -> list[slice]:
    """Slices of ``range(n_outer)`` whose products of ``per_outer`` elements each stay under
    ``_PRODUCT_ELEMENTS`` (at least one at a time)."""
    step = max(1, _PRODUCT_ELEMENTS // max(1, per_outer))
    return [slice(i, min(i + step, n_outer)) for i in range(0, n_outer, step)]


_SPARSE_BELOW = 0.25  # S's fraction of nonzeros below which _weighted_dots goes entry by entry


def _weighted_dots(
    X: Float[Tensor, "outer n d"], V: Float[Tensor, "cols d"], S: Float[Tensor, "n cols"]
) -> Float[Tensor, "outer cols"]:
    """``out[o, c] = sum_n S[n, c] (V[c] . X[o, n])``, summed into float64 on the CPU: by
    dense products, or over ``S``'s nonzero entries alone when it is sparse (an SAE's code
    is: of ``d_sae`` features a few dozen fire at a position)."""
    outer, _, d = X.shape
    out = torch.zeros(outer, V.shape[0], dtype=torch.float64)
    rows, cols = torch.nonzero(S, as_tuple=True)
    if rows.numel() >= _SPARSE_BELOW * S.numel():
        for part in _slices(outer, S.numel()):
            out[part] = torch.einsum("onc,nc->oc", X[part] @ V.T, S).double().cpu()
        return out
    values = S[rows, cols]
    for part in _slices(rows.numel(), outer * d):
        r, c = rows[part], cols[part]
        dots = torch.einsum("okd,kd->ok", X[:, r], V[c]) * values[part]  # [outer entries]
        out.index_add_(1, c.cpu(), dots.double().cpu())
    return out


@dataclass(frozen=True)
class FeatureDeltas:
    """Clean minus corrupted over the task: the input embeddings ``[rows pos d_model]``, the
    features that changed ``[rows pos active]`` (their indices ``active``), the error
    ``[rows pos d_model]`` and, for upstream edges, the graph's writers before the SAE's layer
    ``[writer rows pos d_model]`` (None without)."""

    embed: Tensor
    features: Tensor
    active: Tensor
    error: Tensor
    writers: Tensor | None = None


@dataclass(frozen=True)
class FeatureTables:
    """Sums divided by rows x points: ``features [reader active]``, ``error [reader]`` for the
    ``readers`` at the SAE's layer or later; ``upstream [writer d_sae]`` and
    ``upstream_error [writer]`` (None unless asked)."""

    readers: list[Reader]
    features: Tensor
    error: Tensor
    upstream: Tensor | None
    upstream_error: Tensor | None


def _upstream(
    sae, x: Tensor, G: Tensor, dw: Tensor
) -> tuple[Float[Tensor, "writer d_sae"], Float[Tensor, " writer"]]:
    """One batch of points: ``x`` the stream ``[points pos d]``, ``G`` its gradient, ``dw``
    the writers' changes ``[writer points pos d]``: ``W -> F_j`` summed, and ``sum G . Δw``."""
    with torch.no_grad():
        fired = sae.encode(x.to(sae.W_enc.dtype)).ne(0).flatten(0, 1)  # [n d_sae]
    cols = torch.nonzero(fired.any(0)).flatten()
    flat_g, flat_w = G.flatten(0, 1), dw.flatten(1, 2)  # [n d], [writer n d]
    at_feature = (flat_g @ sae.W_dec.detach()[cols].T.to(G)) * fired[:, cols]  # [n fired]
    table = torch.zeros(dw.shape[0], sae.d_sae, dtype=torch.float64)
    table[:, cols.cpu()] = _weighted_dots(flat_w, sae.W_enc.detach()[:, cols].T.to(G), at_feature)
    return table, torch.einsum("wnd,nd->w", flat_w, flat_g).double().cpu()


def feature_tables(
    model,
    batch: TaskTokens,
    metric: TaskMetric,
    graph: EdgeGraph,
    sae,
    layer: int,
    deltas: FeatureDeltas,
    *,
    steps: int,
    max_rows: int | None,
    max_bytes: int | str | None,
    held: int,
) -> FeatureTables:
    """The module docstring's sums over ``batch``; ``steps`` 0: EAP, else EAP-IG points."""
    W_dec = sae.W_dec.detach()[deltas.active].to(deltas.embed.dtype)  # [active d_model]
    readers = [r for r in graph.readers if r.layer is None or r.layer >= layer]
    by_layer: dict = {}
    for i, r in enumerate(readers):
        by_layer.setdefault(r.layer, []).append(i)
    feature_sums = torch.zeros(len(readers), len(deltas.active), dtype=torch.float64)
    error_sums = torch.zeros(len(readers), dtype=torch.float64)
    upstream = deltas.writers is not None
    n_up = deltas.writers.shape[0] if upstream else 0
    up_sums = torch.zeros(n_up, sae.d_sae, dtype=torch.float64)
    up_total = torch.zeros(n_up, dtype=torch.float64)
    n_steps = max(1, steps)
    total = len(batch.corrupted) * n_steps
    streams: list[Tensor] = []  # the SAE's stream at each pass (upstream)
    record = (f"blocks.{layer}.ln1.hook_in", lambda x, hook: streams.append(x.detach()))
    fixed = [record] if upstream else []
    points = gradient_points(
        model, batch, metric, graph, deltas.embed, steps=steps, max_rows=max_rows,
        max_bytes=max_bytes, held=held, fixed=fixed,
    )  # fmt: skip
    for rows, local, gradients in points:
        first, last = rows.start, rows.stop
        f_part = deltas.features[first:last].flatten(0, 1)  # [rows*pos active]
        e_part = deltas.error[first:last].flatten(0, 1)  # [rows*pos d_model]
        G = 0
        for lay, grad in gradients:
            if lay is not None and lay < layer:
                continue
            if upstream:
                G = G + grad.sum(0)  # [points pos d_model], before the steps are summed
            if n_steps > 1:
                grad = step_sums(grad, local, last - first)
            ids = by_layer[lay]  # all of this layer's readers, in the order of grad's
            flat = grad.flatten(1, 2)  # [reader rows*pos d_model]
            feature_sums[ids] += _weighted_dots(flat, W_dec, f_part)
            error_sums[ids] += torch.einsum("rnd,nd->r", flat, e_part).double().cpu()
        if upstream:
            dw = deltas.writers[:, first:last][:, local]  # [writer points pos d_model]
            table, dot = _upstream(sae, streams.pop(), G, dw)
            up_sums += table
            up_total += dot
    up = (up_sums / total, (up_total - up_sums.sum(1)) / total) if upstream else (None, None)
    return FeatureTables(readers, feature_sums / total, error_sums / total, *up)
