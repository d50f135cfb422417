"""What head loadings and QK attribution hold at their peak, and the rows a memory budget allows.

Both decompositions (:mod:`interp.graphs.heads`, :mod:`interp.graphs.qk`) hold, besides the
model and the graph they were given:

* the sources (:class:`interp.graphs.nodes.Sources`: exact bytes, and their largest writer
  block, alive while a pass's gradients are contracted), read from a clean pass whose cache
  (every transcoder site and the logits, model dtype) is alive while they are read;
* their results, exact bytes: head loadings' ``[target layer head column]`` loadings and
  residual parts, QK attribution's ``2 x d_head`` rows of the query's and key's parts;
* per row of a pass: the frozen passes (:mod:`interp.graphs.attention_pass`; head loadings
  two, QK attribution one), one backward pass's gradients and, for head loadings, each
  target's gradient split over heads: ``_PER_ROW[what]`` = (``[pos d_model]`` tensors per
  layer, ``[head pos pos]`` tensors) in the model's dtype;
* at the end, the table: head loadings' ``[edge layer head]`` weights, their indices and the
  DataFrame, QK attribution's pairs of the items that can have a part on each side (a node
  below the head's layer at or before the query's, or the key's, position, and the three
  constants), each pair's product, indices and columns (counted from the arrays made).

A half-precision model on CPU adds oneDNN's kernels per shape, as the graph's build does
(``_KERNELS`` by the square root of the backward passes).

The per-row coefficients were fitted to the peaks benchmarks/bench_attention_memory.py
measures (host RSS of a fresh process with freed memory returned to the system at once) on
2-layer, d_model 128 models at 16 to 256 positions, to the steeper slope (few rows: a batch
wider than the targets costs less per row), so the estimate errs high; the split between
layers and the rest was not measured (2-layer models only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from interp.engine.allocator import return_freed_memory
from interp.engine.plan import MemoryBudgetError
from interp.foundation.sizes import format_size, parse_size

__all__ = ["Held", "RowPlan", "decomposition_bytes", "fit_rows", "heads_bytes", "qk_bytes"]

_FIXED = 8 * 2**20  # the allocator's, autograd's and a fresh process's first calls' own
# what one row of the passes holds, by decomposition: ([pos d_model] tensors per layer,
# [head pos pos] tensors), model dtype. Fitted over the measured peaks less the rest (float32,
# 2 layers, d_model 128, 4 heads; fresh processes): head loadings up to 2.4 MB a row at 64
# positions (a Llama) and 10.4 at 256; QK attribution 1.0 and 6.1
_PER_ROW = {"heads": (36.0, 2.5), "qk": (24.0, 0.5)}
# bytes per entry of the final tables, counted from the arrays they make (the weights or
# products, nonzero's indices, the columns and the DataFrame's copy of them, its sort)
_HEAD_ENTRY = 160  # an (edge, layer, head) of head loadings
_PAIR_ENTRY = 136  # a (query item, key item) pair of QK attribution
_KERNELS = 4.2 * 2**20  # oneDNN's cached kernels (a half-precision model on CPU), as budget's


@dataclass(frozen=True)
class Held:
    """What a decomposition (``what``: ``"heads"`` or ``"qk"``) holds besides its passes: the
    ``sources``, ``results`` and the final ``table`` (bytes); the backward rows it computes
    (``calls``)."""

    what: str
    sources: int
    results: int
    table: int
    calls: int


@dataclass(frozen=True)
class RowPlan:
    """The rows per pass chosen and the estimate there and at the smallest batch."""

    rows: int
    estimated_bytes: int
    least_bytes: int

    def attrs(self) -> dict:
        return {
            "batch_size": self.rows,
            "estimated_bytes": self.estimated_bytes,
            "least_bytes": self.least_bytes,
        }


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _source_bytes(src) -> int:
    # what the sources hold and, alive while a pass's gradients are contracted, their largest
    # writer block (interp.graphs.nodes: no vector per feature is held)
    return src.held_bytes + src.block_bytes


def heads_bytes(src, loads, residual, n_edges: int) -> Held:
    """Head loadings' :class:`Held`: two passes, the loadings and residual parts, a table of
    ``n_edges x layer x head`` weights; a backward pass per (target, layer, head)."""
    _, n_layers, n_heads, _ = loads.shape
    table = n_edges * n_layers * n_heads * _HEAD_ENTRY
    return Held("heads", _source_bytes(src), _nbytes(loads, residual), table,
                len(loads) * (1 + n_layers * n_heads))  # fmt: skip


def qk_bytes(src, values, n_query: int, n_key: int) -> Held:
    """QK attribution's :class:`Held`: one pass, the ``2 x d_head`` rows and the parts, a table
    of at most ``n_query x n_key`` pairs (the items that can have a part on either side);
    ``2 x d_head`` backward rows."""
    table = n_query * n_key * _PAIR_ENTRY
    return Held("qk", _source_bytes(src), 2 * _nbytes(values), table, len(values))


def decomposition_bytes(model, tc, n_pos: int, rows: int, held: Held) -> int:
    """Bytes a decomposition holds at its peak with ``rows`` rows per pass (module docstring)."""
    cfg = model.cfg
    d, n_heads, n_layers = int(cfg.d_model), int(cfg.n_heads), int(tc.n_layers)
    item = torch.empty((), dtype=cfg.dtype).element_size()
    clean = (2 * n_layers + 1) * n_pos * d * item + n_pos * int(cfg.d_vocab) * item
    per_layer, attention = _PER_ROW[held.what]
    per_row = (per_layer * n_layers * n_pos * d + attention * n_heads * n_pos * n_pos) * item
    kernels = 0.0
    if item < 4 and str(cfg.device).startswith("cpu"):
        kernels = _KERNELS * min(-(-held.calls // rows), 1024) ** 0.5
    peak = max(clean, rows * per_row, held.table)
    return int(_FIXED + kernels + held.sources + held.results + peak)


def fit_rows(model, tc, n_pos: int, rows: int, held: Held, max_bytes, what: str) -> RowPlan:
    """``rows``, halved while the estimate exceeds ``max_bytes`` (None: no budget); a budget
    that the least estimate over the batches tried does not fit is refused, saying what it
    needs. Under a budget freed memory goes back to the system at once
    (:func:`interp.engine.return_freed_memory`), so the process's size is what it holds."""
    sizes = {}  # by batch, the largest first
    batch = rows
    while True:
        sizes[batch] = decomposition_bytes(model, tc, n_pos, batch, held)
        if batch == 1:
            break
        batch //= 2
    least = min(sizes.values())
    if max_bytes is not None:
        budget = parse_size(max_bytes)
        if least > budget:
            raise MemoryBudgetError(
                f"{what} needs at least {least} bytes ({format_size(least)}: its frozen "
                f"pass(es) over {n_pos} positions, {format_size(held.sources)} of sources, "
                f"{format_size(held.results)} of results); raise max_bytes to {least}"
            )
        return_freed_memory()
        rows = next(b for b, size in sizes.items() if size <= budget)  # the largest that fits
    return RowPlan(rows, sizes[rows], least)
