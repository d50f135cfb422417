"""``edge_scores``: every edge of the graph scored over a task, by exact edge patching or by a
gradient estimate of it (docs/discovery.md).

With ``C`` and ``K`` the dataset means of the clean and corrupted metric:

- ``exact`` (denoising): ``m(e)`` is the dataset mean of the corrupted run with edge ``e``'s
  reader given its writer's clean output in place of the corrupted one (its input moved by
  ``clean - corrupted`` of the writer's output), everything downstream recomputed;
  ``score = (m(e) - K) / (C - K)``, the recovered fraction: 1 recovers the clean metric.
- ``eap``: ``m(e) - K`` estimated to first order, ``mean_rows sum_pos (a_clean - a_corrupted)
  . dm/d(reader input)`` with the gradient taken on the corrupted run, divided by ``C - K``.
- ``eap-ig``: the same with the gradient averaged over ``ig_steps`` points on the straight
  path from the corrupted to the clean input embeddings (EAP-IG-inputs, Hanna et al. 2024).

A positive score moves the metric toward the clean run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import torch

from interp.discovery.acdc import acdc
from interp.discovery.gradients import gradient_scores
from interp.discovery.graph import EdgeGraph, edge_frame
from interp.discovery.runs import (
    dataset_mean,
    deltas_bytes,
    patched_metrics,
    task_inputs,
    writer_outputs,
)
from interp.engine import HookFn
from interp.interventions.grids import undefined as _undefined  # too close to divide by
from interp.tasks import Task, TaskTokens

__all__ = ["edge_scores", "edge_changes", "METHODS", "SCORED_METHODS", "SCORE_COLUMNS"]

SCORED_METHODS = ("exact", "eap", "eap-ig")  # the oracle and two estimates: every edge scored
METHODS = (*SCORED_METHODS, "acdc")  # edge_scores methods; acdc prunes (interp.discovery.acdc)
SCORE_COLUMNS = ["edge", "source", "target", "score"]  # edge_scores columns


def edge_scores(
    model,
    task: Task | TaskTokens,
    method: str = "exact",
    *,
    metric: str = "logit_diff",
    ig_steps: int = 5,
    threshold: float | None = None,
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
    progress: bool = False,
    interventions: Sequence[tuple[str, HookFn]] = (),
) -> pd.DataFrame:
    """Score every edge of ``model``'s graph on ``task``; one row per edge, graph order.

    Args:
        method: ``"exact"`` (edge patching, the oracle), ``"eap"`` (one forward per side and
            one backward), ``"eap-ig"`` (``ig_steps`` backward passes) or ``"acdc"``
            (ACDC's pruning, :func:`interp.discovery.acdc.acdc`: pass ``threshold``; the
            frame has an ``in_circuit`` column).
        metric: a :meth:`interp.tasks.TaskTokens.metric` kind.
        max_rows: batch rows of one forward pass (exact: edges x task rows; eap-ig: task
            rows x steps).
        max_bytes: a memory budget for what is held and each pass (bytes or ``"500MB"``);
            the scores do not depend on it.
        interventions: raw forward hooks ``(name, fn)`` applied to every run, clean,
            corrupted, patched and differentiated (e.g. attention patterns held fixed); each
            must handle any batch size (patched passes repeat the rows); eap and eap-ig
            refuse one at ``ln1``'s hooks.

    Returns ``edge, source, target, score`` (module docstring). ``attrs``: ``clean_metric``,
    ``corrupted_metric`` (dataset means), ``method``, ``n_rows``, ``recovered_undefined``
    (scores are NaN when the two means are too close to divide by).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if (method == "acdc") != (threshold is not None):
        raise ValueError(
            "pass threshold with method 'acdc' (the score below which it prunes an edge), and "
            "only with it"
        )
    if method == "acdc" and interventions:
        raise ValueError("method 'acdc' takes no interventions; use 'exact', 'eap' or 'eap-ig'")
    budget = dict(metric=metric, max_rows=max_rows, max_bytes=max_bytes, progress=progress)
    if method == "acdc":
        return acdc(model, task, threshold=threshold, **budget)
    graph, change, c, k, n_rows = edge_changes(
        model, task, method, ig_steps=ig_steps, interventions=interventions, **budget
    )
    undefined = _undefined(c, k)
    score = torch.full_like(change, math.nan) if undefined else change / (c - k)
    return edge_frame(
        graph.edges, score.numpy(), dict(clean_metric=c, corrupted_metric=k, method=method,
        n_rows=n_rows, recovered_undefined=undefined),
    )  # fmt: skip


def edge_changes(
    model,
    task: Task | TaskTokens,
    method: str,
    *,
    metric: str = "logit_diff",
    ig_steps: int = 5,
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
    progress: bool = False,
    interventions: Sequence[tuple[str, HookFn]] = (),
) -> tuple[EdgeGraph, torch.Tensor, float, float, int]:
    """The scored methods' numbers before normalisation: ``(graph, change, C, K, n_rows)``,
    ``change[e]`` the dataset mean of edge ``e``'s metric change (exact: ``m(e) - K``; eap,
    eap-ig: its estimate), ``C`` and ``K`` the clean and corrupted dataset means. Means over
    rows, so shards of a task combine by their row counts (:mod:`interp.discovery.shards`).
    Arguments as :func:`edge_scores` (``method`` one of :data:`SCORED_METHODS`)."""
    graph, batch, task_metric = task_inputs(
        model, task, metric, max_rows, max_bytes, method=method, methods=SCORED_METHODS,
        ig_steps=ig_steps,
    )  # fmt: skip
    clean_out, clean_logits = writer_outputs(model, batch.clean, graph, interventions)
    corrupt_out, corrupt_logits = writer_outputs(model, batch.corrupted, graph, interventions)
    c, k = dataset_mean(task_metric, clean_logits), dataset_mean(task_metric, corrupt_logits)
    del clean_logits, corrupt_logits
    deltas = clean_out - corrupt_out
    del clean_out, corrupt_out
    budget = dict(max_rows=max_rows, max_bytes=max_bytes, held=deltas_bytes(model, graph, batch))
    if method == "exact":
        values = patched_metrics(
            model, batch, task_metric, deltas, [[edge] for edge in graph.edges],
            progress=progress, fixed=interventions, **budget,
        )  # fmt: skip
        change = values.double().mean(dim=1) - k
    else:
        with torch.enable_grad():  # also under a caller's torch.no_grad() or set_grad_enabled
            steps = ig_steps if method == "eap-ig" else 0
            change = gradient_scores(
                model, batch, task_metric, graph, deltas, steps=steps, fixed=interventions, **budget
            )
    return graph, change, c, k, len(batch.clean)
