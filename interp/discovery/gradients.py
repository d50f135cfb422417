"""Gradient estimates of edge patching: EAP and EAP-IG (inputs), every edge from one backward
pass per step.

Each reader gets a zero change ``e`` at its input (:mod:`interp.discovery.inputs`, the same
delivery exact patching uses), so ``dm/de`` is the gradient of the metric with respect to that
reader's input alone. An edge ``W->R`` scores ``sum_pos (a_clean[W] - a_corrupted[W]) .
dm/de[R]``, summed over rows here and averaged by the caller's mean. For EAP the gradient is
taken on the corrupted run; for EAP-IG it is averaged over the runs whose input embeddings are
``corrupted + (k / steps) (clean - corrupted)``, ``k = 0 .. steps - 1`` (as hannamw/EAP-IG's
``eap-ig-inputs``; one step is EAP).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from interp.discovery.graph import Graph
from interp.discovery.inputs import reader_hooks
from interp.discovery.runs import WriterOutputs, rows_metric
from interp.engine import (
    MemoryBudgetError,
    estimate_attribution_bytes,
    format_size,
    parse_size,
    run_logits,
)
from interp.engine.estimates import _itemsize
from interp.tasks import TaskMetric, TaskTokens

__all__ = ["gradient_scores", "reader_gradients"]


def _rows_at_once(model, graph, n_rows, n_pos, max_rows, max_bytes, held) -> int:
    if max_rows is not None:
        return max(1, min(n_rows, max_rows))
    if max_bytes is None:
        return n_rows
    per_row = estimate_attribution_bytes(model, n_pos) + 2 * len(graph.readers) * n_pos * int(
        model.cfg.d_model
    ) * _itemsize(model)
    budget = parse_size(max_bytes)
    fit = (budget - held) // per_row
    if fit < 1:
        raise MemoryBudgetError(
            f"one row's forward and backward pass with every reader's gradient needs about "
            f"{format_size(per_row)} beside the {format_size(held)} held, but max_bytes is "
            f"{format_size(budget)}; raise max_bytes to at least {format_size(held + per_row)}"
        )
    return int(min(n_rows, fit))


def reader_gradients(
    model,
    tokens: Tensor,
    metric: TaskMetric,
    graph: Graph,
    *,
    embed_shift: Tensor | None = None,
    fixed: Sequence = (),
) -> Float[Tensor, "reader rows pos d_model"]:
    """``d sum_rows metric / d (reader input)`` for every reader of ``graph``, one forward and
    one backward pass of ``tokens``; ``embed_shift`` is added to the input embeddings, ``fixed``
    raw hooks go first."""
    rows, n_pos = tokens.shape
    shape = (rows, n_pos, int(model.cfg.d_model))
    # one leaf per reader: views of one stacked leaf would each backpropagate a full-size zero
    zeros = [torch.zeros(shape, device=tokens.device, requires_grad=True) for _ in graph.readers]
    everything = slice(None)
    hooks = reader_hooks(model, [(r, everything, zeros[i]) for i, r in enumerate(graph.readers)])
    if embed_shift is not None:
        hooks.insert(0, ("blocks.0.hook_resid_pre", lambda act, hook: act + embed_shift))
    logits = run_logits(model, tokens, before=[*fixed, *hooks], grad=True)
    grads = torch.autograd.grad(
        metric(logits).sum(), zeros, allow_unused=True, materialize_grads=True
    )  # a reader nothing depends on (frozen patterns: q and k) has gradient zero
    grad = torch.stack(grads)
    return grad.detach()


def gradient_scores(
    model,
    batch: TaskTokens,
    metric: TaskMetric,
    graph: Graph,
    deltas: WriterOutputs,
    *,
    steps: int = 0,
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
    held: int = 0,
    fixed: Sequence = (),
) -> Float[Tensor, " edge"]:
    """The estimated change of the metric's dataset mean from patching each edge (graph order);
    ``steps=0``: EAP, else EAP-IG with ``steps`` points."""
    n_rows, n_pos = (int(d) for d in batch.corrupted.shape)
    chunk = _rows_at_once(model, graph, n_rows, n_pos, max_rows, max_bytes, held)
    writer_index = {w: i for i, w in enumerate(graph.writers)}
    reader_index = {r: i for i, r in enumerate(graph.readers)}
    src = torch.tensor([writer_index[w] for w, _ in graph.edges])
    dst = torch.tensor([reader_index[r] for _, r in graph.edges])
    total = torch.zeros(len(graph.edges), dtype=torch.float64)
    tokens = batch.corrupted.to(model.cfg.device)
    for lo in range(0, n_rows, chunk):
        hi = min(lo + chunk, n_rows)
        part = deltas.rows(lo, hi)
        chunk_metric = rows_metric(metric, torch.arange(lo, hi))
        alphas = [k / steps for k in range(steps)] if steps else [0.0]
        grad = 0
        for alpha in alphas:
            shift = part.embed * alpha if alpha else None
            grad = grad + reader_gradients(
                model, tokens[lo:hi], chunk_metric, graph, embed_shift=shift, fixed=fixed
            )
        grad = (grad / len(alphas)).flatten(1)  # [reader rows*pos*d_model]
        stacked = torch.stack([part[w] for w in graph.writers]).flatten(1)
        table = stacked @ grad.T  # [writer reader]
        total += table[src, dst].double().cpu()
    return total / n_rows
