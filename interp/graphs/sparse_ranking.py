"""The ranking under ``max_feature_nodes`` without a dense copy of the rows: the sparse ranking,
with bounds on the dense ranking's influence and a certificate for each round.

The dense ranking (:class:`interp.graphs.ranking.Ranking`) keeps every row normalised over
every active feature: ``rows x n_active`` numbers, 143 GB at Gemma-2-2B's 1,024 positions. Here
each new row is normalised exactly (``|row| / max(sum, 1e-8)``, from the whole row of its batch,
which exists while the batch does) and only its ``entries`` largest entries are kept (int32
columns, values in the work dtype, appended batch by batch): ``rows x entries x 8`` bytes at
most, whatever the number of active features. A normalised row sums to at most 1, so every
entry ``>= 1 / entries`` is among them (a threshold ``tau = 1 / entries`` would keep a subset).

The ``[row row]`` block (what each row passes to each row's node) holds a new row's entries at
every row's node so far exactly, from its batch; an old row's entry at a new row's node comes
from its kept entries (0 where dropped). The influence is the dense ranking's series run on the
block, then one sparse product with the kept entries (:meth:`SparseRanking.bounds`).

Bounds. Every normalised entry is ``>= 0``, and a dropped one of row ``i`` at a feature of layer
``l`` is at most ``e_il``, the largest entry the row dropped among layer ``l``'s features (kept
per row and layer as the batch comes; ``< 1 / entries``). The series with the truncated block
and rows gives a lower bound of the dense influence at every column (all terms nonnegative). An
upper bound: the same series with every block entry not known exactly raised by ``e_il`` where
row ``i`` can read the node at all, a feature of a lower layer and no later position (the frozen
model is causal in layers and positions: a target at layer ``l`` reads the MLP outputs below
``l``; each batch is checked for it). That block is strictly lower in layers, so its series
ends; at a column of layer ``l``, ``upper = s_up R_kept + sum_i s_up[i] e_il`` over the rows
that can read it and did not keep it (``[layer pos layer]`` suffix sums). Both are summed in
float64 (the kept values are the float32 numbers the dense ranking normalises, by the same
operations), so they bracket the exact influence through those numbers up to a float64 rounding
margin (:func:`_margin`).

Certificate. A round picks the ``size`` unvisited features of largest lower bound; it is
*certified* when the least lower bound it picks exceeds the largest upper bound it leaves (both
widened by the margin): then the dense ranking, given the same rows, picks the same features.
"""

from __future__ import annotations

import logging

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.foundation.fallbacks import warn_fallback
from interp.foundation.sizes import format_size
from interp.graphs.influence import RANKING_CLAMP

__all__ = [
    "ENTRIES", "RANKINGS", "SparseRanking", "choose_entries", "sparse_ranking_bytes", "warn_sparse",
]  # fmt: skip

logger = logging.getLogger(__name__)

# the entries a row keeps (its largest): 8 bytes each (int32 column, float32 value), 4.3 GB over
# Gemma's 8,202 rows; a row of no more columns than this keeps every nonzero (nothing dropped)
ENTRIES = 2**16
# rows normalised at once as a batch comes: a full-width float copy, its masks and a float temp
# (~10 bytes a column a row: 2.8 GB for 8 rows of Gemma's 35M columns at 8,192 positions)
ADD_ROWS = 8
MERGED = 2**22  # kept entries merged into groups of up to this many (SparseRanking._compact)
RANKINGS = ("auto", "dense", "sparse")  # attribution_graph's ranking= under max_feature_nodes


def choose_entries(ranking: str, capped: bool, least, room: int | None) -> int | None:
    """The sparse ranking's entries a row where it ranks, else None (the dense ranking): under a
    cap, ``"sparse"`` always, ``"auto"`` where the dense ranking's least need (``least(None)``;
    ``least(entries)`` the sparse one's) exceeds ``room`` (None: unknown) and the sparse one's is
    less."""
    if ranking not in RANKINGS:
        raise ValueError(f"ranking must be one of {', '.join(RANKINGS)}, got {ranking!r}")
    if not capped or ranking == "dense":
        return None
    if ranking == "sparse":
        return ENTRIES
    if room is None or least(None) <= room:
        return None
    return ENTRIES if least(ENTRIES) < least(None) else None


def warn_sparse(dense: int, room: int, where: str, entries: int) -> None:
    """Says, once, that ``"auto"`` ranks through the sparse ranking, and what that means."""
    warn_fallback(
        logger, "graph-sparse-ranking",
        "max_feature_nodes: the dense ranking needs about %s, more than the %s %s: features are "
        "ranked through a sparse copy of the rows instead (each row's %d largest normalised "
        "entries), the kept rows computed again, exactly; the kept features are the dense "
        "ranking's wherever its rounds are certified (graph.info['ranking_certified']; a "
        "warning says when some are not). ranking='dense' keeps the dense ranking",
        format_size(dense), format_size(max(room, 0)), where, entries,
    )  # fmt: skip


def sparse_ranking_bytes(rows: int, columns: int, n_active: int, batch: int, entries: int,
                         work: int, n_layers: int, n_pos: int) -> int:  # fmt: skip
    """What the sparse ranking holds at its peak beside the row step: the kept entries (at most
    ``entries`` a row), the float64 block with its known-mask and the upper block's transient,
    a batch's normalised copy with its masks and entry indices, the columns' node map, the
    bounds (float64) with their sort and the upper bound's ``[layer pos layer]`` sums."""
    kept = rows * min(entries, columns) * (4 + work)
    block = rows * rows * (3 * 8 + 2) + rows * n_layers * 8
    per_batch = min(batch, ADD_ROWS) * columns * (2 * work + 2)
    per_batch += min(batch, ADD_ROWS) * min(entries, columns) * (16 + work)
    per_column = columns * 4 + n_active * (3 * 8 + 8 + 1)
    grid = (n_layers + 2) * n_pos * n_layers * 8
    return kept + block + per_batch + per_column + grid


def _series(q: Tensor, block: Tensor, max_iter: int = 128) -> tuple[Tensor, int]:
    """``q + q B + q B² + ...`` (``B`` nilpotent: the graph is acyclic) and its steps."""
    reaching = torch.zeros_like(q)
    for step in range(max_iter):
        if not q.any():
            return reaching, step
        reaching += q
        q = q @ block
    raise RuntimeError("feature influence did not converge")


def _margin(n_rows: int, steps: int) -> float:
    """A relative bound on the float64 rounding of the bounds: each step and the product sum at
    most ``n_rows`` nonnegative terms (relative error ``<= n_rows * 2^-53`` each), ``steps + 1``
    of them in a row (~1e-10 at Gemma's 8,202 rows and 27 steps)."""
    return 2.0 * (steps + 2) * n_rows * torch.finfo(torch.float64).eps


class SparseRanking:
    """The rows' kept entries, the ``[row row]`` block, and the bounds (module docstring)."""

    def __init__(
        self, n_rows: int, n_cols: int, logit_p: Float[Tensor, " logit"], *, entries: int,
        feat_layer: Int[Tensor, " feature"], feat_pos: Int[Tensor, " feature"], n_layers: int,
        n_pos: int, device,
    ) -> None:  # fmt: skip
        self.n_cols, self.width = n_cols, n_cols + len(logit_p)  # logits' columns: zero
        self.n_active, self.n_layers, self.n_pos = len(feat_layer), n_layers, n_pos
        self.entries = entries
        self.drops = entries < n_cols  # else every nonzero is kept: the bounds are equal
        self.device = torch.device(device)
        self.feat_layer, self.feat_pos = feat_layer.to(self.device), feat_pos.to(self.device)
        f64 = dict(dtype=torch.float64, device=self.device)
        self.weights = torch.zeros(self.width, **f64)
        self.weights[n_cols:] = logit_p.to(**f64)
        self.row_nodes = torch.zeros(n_rows, dtype=torch.long, device=self.device)
        self.row_layer = torch.zeros(n_rows, dtype=torch.long, device=self.device)
        self.row_pos = torch.zeros(n_rows, dtype=torch.long, device=self.device)
        self.batch_start = torch.zeros(n_rows, dtype=torch.long, device=self.device)
        self.node_row = torch.full((self.width,), -1, dtype=torch.int32, device=self.device)
        # e_il: the largest entry row i dropped among layer l's features (< 1 / entries)
        self.slack = torch.zeros(n_rows, n_layers, **f64)
        counts = torch.bincount(self.feat_layer, minlength=n_layers).tolist()
        self.layer_ends = torch.tensor(counts).cumsum(0).tolist()  # features are layer-major
        self.block = torch.zeros(n_rows, n_rows, **f64)
        self.known = torch.zeros(n_rows, n_rows, dtype=torch.bool, device=self.device)
        # per batch: (first row, entries per row [b], columns int32 [nnz], values [nnz])
        self.kept: list[tuple[int, Tensor, Tensor, Tensor]] = []
        self.filled = 0
        self.linked = 0  # rows whose nodes the older rows' kept entries were looked up at
        self.rounds = 0
        self.certified = 0

    def _place(self, nodes: Tensor) -> tuple[Tensor, Tensor]:
        """The nodes' (layer, position): a feature's own, a logit's (n_layers, last)."""
        feature = nodes < self.n_active
        at = nodes.clamp(max=max(self.n_active - 1, 0))
        last = self.n_pos - 1
        layer = torch.where(feature, self.feat_layer[at], self.n_layers)
        return layer, torch.where(feature, self.feat_pos[at], last)

    def _check_causal(self, normalised: Tensor, layer: Tensor, pos: Tensor) -> None:
        """The bound's premise: no row reads a feature of its own or a later layer, or of a later
        position (the frozen model is causal; exactly 0 there)."""
        readable = (self.feat_layer[None] < layer[:, None]) & (self.feat_pos[None] <= pos[:, None])
        if normalised[:, : self.n_active].masked_fill(readable, 0).any():
            raise RuntimeError(
                "a row reads a feature of its own or a later layer or position, which the sparse "
                "ranking's bound rules out; pass ranking='dense'"
            )

    def add(self, rows: Float[Tensor, "batch col"], nodes: Int[Tensor, " batch"]) -> None:
        """Rows (their first columns; the rest are zero) of nodes ``nodes``: normalised as the
        dense ranking normalises them, ``ADD_ROWS`` at a time (a full-width copy of a few rows
        at once, not of the batch), the block's new entries written, the large ones kept."""
        start, end = self.filled, self.filled + len(nodes)
        nodes = nodes.to(self.device)
        layer, pos = self._place(nodes)
        self.row_nodes[start:end], self.row_layer[start:end], self.row_pos[start:end] = (
            nodes, layer, pos,
        )  # fmt: skip
        self.node_row[nodes] = torch.arange(start, end, dtype=torch.int32, device=self.device)
        self.batch_start[start:end] = start
        self.known[start:end, :end] = True
        for i in range(0, len(nodes), ADD_ROWS):
            part = slice(i, min(i + ADD_ROWS, len(nodes)))
            self._add_rows(rows[part], start + i, layer[part], pos[part], end)
        self.filled = end

    def _add_rows(self, rows: Tensor, start: int, layer: Tensor, pos: Tensor, end: int) -> None:
        normalised = torch.empty(len(rows), self.width, dtype=rows.dtype, device=self.device)
        normalised[:, : rows.shape[1]].copy_(rows)
        normalised[:, rows.shape[1] :] = 0
        normalised.abs_()
        normalised.div_(normalised.sum(dim=1, keepdim=True).clamp(min=RANKING_CLAMP))
        self._check_causal(normalised, layer, pos)
        stop_row = start + len(rows)
        self.block[start:stop_row, :end] = normalised[:, self.row_nodes[:end]]  # exact
        if self.drops:  # the row's `entries` largest (every entry >= 1/entries among them)
            largest = normalised.topk(self.entries, dim=1)
            keep = torch.zeros_like(normalised, dtype=torch.bool)
            keep.scatter_(1, largest.indices, largest.values > 0)
            del largest
        else:
            keep = normalised > 0
        dropped = normalised[:, : self.n_active].masked_fill(keep[:, : self.n_active], 0)
        begin = 0
        for layer_, stop in enumerate(self.layer_ends):
            if stop > begin:
                self.slack[start:stop_row, layer_] = dropped[:, begin:stop].amax(1)
            begin = stop
        del dropped
        r, c = torch.nonzero(keep, as_tuple=True)
        self.kept.append((start, keep.sum(1), c.to(torch.int32), normalised[r, c]))

    def _compact(self) -> None:
        """Consecutive groups of kept entries (each covers the rows after the previous one's)
        merged up to ``MERGED`` entries: a round's passes over them take a few large steps,
        not one per 8 rows (each a handful of kernels on a GPU)."""
        merged: list = []
        for group in self.kept:
            if merged and len(merged[-1][2]) + len(group[2]) <= MERGED:
                start, *parts = merged[-1]
                merged[-1] = (
                    start,
                    *(torch.cat([a, b]) for a, b in zip(parts, group[1:], strict=True)),
                )
            else:
                merged.append(group)
        self.kept = merged

    def _entries(self):
        """Each group's kept entries: (rows [nnz], columns int32 [nnz], values [nnz])."""
        for start, counts, cols, values in self.kept:
            ids = torch.arange(start, start + len(counts), device=self.device)
            yield torch.repeat_interleave(ids, counts), cols, values

    def _link(self) -> None:
        """The older rows' kept entries at the nodes of the rows added since the last round
        (a row's entries at nodes of its own or a later batch were written exactly)."""
        if self.linked == self.filled:
            return
        for rows, cols, values in self._entries():
            j = self.node_row[cols].long()
            hit = j >= self.linked
            hit[hit.clone()] = rows[hit] < self.batch_start[j[hit]]
            self.block[rows[hit], j[hit]] = values[hit].double()
            self.known[rows[hit], j[hit]] = True
        self.linked = self.filled

    def _product(self, reach: Tensor, slack: Tensor | None = None) -> Float[Tensor, " feature"]:
        """``reach R_kept`` at the feature columns, less ``slack[row, column's layer]`` at each
        kept entry (where given)."""
        out = torch.zeros(self.width, dtype=torch.float64, device=self.device)
        for rows, cols, values in self._entries():
            terms = values.double() * reach[rows]
            if slack is not None:
                feature = cols < self.n_active
                rows, cols, terms = rows[feature], cols[feature], terms[feature]
                terms -= slack[rows, self.feat_layer[cols]]
            out.index_add_(0, cols, terms)
        return out[: self.n_active]

    def _dominated(self, t: Float[Tensor, "row layer"], n: int) -> Float[Tensor, " feature"]:
        """At each feature column of layer ``l``, ``sum_i t_il`` over the rows that can read it
        (a later layer, no earlier position): ``[layer pos layer]`` suffix sums."""
        grid = torch.zeros(
            self.n_layers + 2, self.n_pos, self.n_layers, dtype=torch.float64, device=self.device
        )
        grid.index_put_((self.row_layer[:n], self.row_pos[:n]), t, accumulate=True)
        grid = grid.flip(1).cumsum(1).flip(1).flip(0).cumsum(0).flip(0)
        return grid[self.feat_layer + 1, self.feat_pos, self.feat_layer]

    def bounds(self) -> tuple[Float[Tensor, " feature"], Float[Tensor, " feature"], float]:
        """Lower and upper bounds of each feature's influence through the rows so far (the dense
        ranking's ``partial_influences``), and their relative rounding margin (the upper bound
        already widened by it against its subtraction: the kept entries' slack taken back)."""
        self._compact()
        self._link()
        n = self.filled
        block, q = self.block[:n, :n], self.weights[self.row_nodes[:n]]
        low, steps = _series(q, block)
        layer, pos = self.row_layer[:n], self.row_pos[:n]
        readable = (layer[None, :] < layer[:, None]) & (pos[None, :] <= pos[:, None])
        unknown = readable & ~self.known[:n, :n]
        node_layer = layer.clamp(max=self.n_layers - 1)  # a logit's column is never readable
        up, up_steps = _series(q, block + self.slack[:n][:, node_layer] * unknown)
        lower = self._product(low)
        t = self.slack[:n] * up[:, None]  # [row layer]
        dominated = self._dominated(t, n)
        margin = _margin(n, max(steps, up_steps))
        upper = self._product(up, t) + dominated * (1 + 2 * margin)
        return lower, upper, margin

    def next_round(self, visited: Bool[Tensor, " feature"], size: int) -> Int[Tensor, " round"]:
        """The ``size`` unvisited features of largest lower bound, in (layer, pos) order, on the
        host; the round counted, and counted certified where the bounds separate it."""
        lower, upper, margin = self.bounds()
        rank = torch.argsort(lower, descending=True)
        order = rank[~visited.to(rank.device)[rank]]
        picked, left = order[:size], order[size:]
        self.rounds += 1
        least = float(lower[picked].min()) * (1 - margin)
        if not len(left) or least > float(upper[left].max()) * (1 + margin):
            self.certified += 1
        return picked.cpu().sort().values
