"""ACDC (Conmy et al. 2023): prune the graph edge by edge, keeping what the task needs
(docs/discovery.md, "ACDC").

The state is a set ``R`` of removed edges; its run is the clean run with every edge of ``R``
removed (its reader gets the writer's corrupted output in place of the writer's output in this
run, :mod:`interp.discovery.removal`), and ``m(R)`` the dataset mean of the metric over it.
``C`` and ``K`` are the clean and corrupted dataset means. Starting from ``R = {}`` (the clean
run), every edge is tried once, in reverse topological order: readers from ``logits`` back to
layer 0, and each reader's writers from the last to ``embed`` (``reversed(EdgeGraph.edges)``).
Trying ``e`` measures ``score(e) = (m(R) - m(R + e)) / (C - K)``, the fraction of the task's
clean - corrupted difference that removing ``e`` loses now (positive: the edge moves the metric
toward the clean run, as in :func:`interp.discovery.scores.edge_scores`), and removes it for
good when ``|score(e)| <= threshold``. The kept edges are the circuit. Since ``m`` telescopes,
the circuit's metric is ``C - (C - K) * sum(score of the removed edges)``.

Batching (speculative, exact): the next ``window`` untried edges are tried in one call of
:func:`interp.discovery.removal.removed_metrics` (many runs per forward pass), each against the
state the earlier ones of the window are *guessed* to leave (an edge never tried is guessed
removed, a tried one as its last measured score says). Going through the window in order, the
measurement of an edge is exactly the sequential one as long as every earlier guess in the
window held; at the first edge whose decision differs from its guess, its decision is taken
(it was measured against the true state) and the next window starts after it. So the result
is the plain sequential algorithm's, decision for decision (tested), and the number of calls
is the number of windows plus the number of wrong guesses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from interp.discovery.graph import EdgeGraph, Reader, edge_frame
from interp.discovery.removal import removed_metrics
from interp.discovery.runs import (
    dataset_mean,
    deltas_bytes,
    task_inputs,
    writer_outputs,
)
from interp.engine import run_logits
from interp.interventions.grids import undefined as _undefined  # too close to divide by
from interp.tasks import Task, TaskTokens

__all__ = ["acdc", "acdc_order", "prune", "ACDC_COLUMNS", "WINDOW"]

ACDC_COLUMNS = ["edge", "source", "target", "score", "in_circuit"]  # acdc frame columns
WINDOW = 32  # edges tried per call of removed_metrics (see the module docstring)

Edge = tuple[str, Reader]


def acdc_order(graph: EdgeGraph) -> list[Edge]:
    """The edges in the order ACDC tries them: readers from ``logits`` back to layer 0, and
    each reader's writers from the last to ``embed``."""
    return list(reversed(graph.edges))


def prune(
    order: Sequence,
    measure: Callable[[list[list]], Sequence[float]],
    start: float,
    span: float,
    threshold: float,
    *,
    window: int = WINDOW,
    progress: bool = False,
) -> tuple[list, dict, float, int, int]:
    """ACDC's greedy pruning, batched speculatively (module docstring).

    ``measure(states)``: the metric of each state (a list of removed edges); ``start``: the
    metric with nothing removed; ``span``: ``C - K``. Returns ``(removed edges in the order
    removed, {edge: score}, the final state's metric, calls of measure, states measured)``.
    """
    removed, scores, guess = [], {}, {}  # guess: edge -> "removed"; untried edges guessed so
    current, calls, states, done = float(start), 0, 0, 0
    bar = tqdm(total=len(order), desc="acdc", unit="edge", disable=not progress)
    while done < len(order):
        todo = list(order[done : done + window])
        chain, tries = list(removed), []
        for edge in todo:
            tries.append([*chain, edge])
            if guess.get(edge, True):
                chain = tries[-1]
        values = [float(v) for v in measure(tries)]
        calls, states = calls + 1, states + len(tries)
        before, stale = current, []  # each edge's score against its guessed state
        for edge, value in zip(todo, values, strict=True):
            stale.append((before - value) / span)
            if guess.get(edge, True):
                before = value
        for j, edge in enumerate(todo):
            scores[edge] = stale[j]  # exact: every earlier guess in the window held
            remove = abs(stale[j]) <= threshold
            if remove:
                removed.append(edge)
                current = values[j]
            done += 1
            bar.update(1)
            if remove != guess.get(edge, True):
                for later, score in zip(todo[j + 1 :], stale[j + 1 :], strict=True):
                    guess[later] = abs(score) <= threshold
                break
    bar.close()
    return removed, scores, current, calls, states


def acdc(
    model,
    task: Task | TaskTokens,
    *,
    threshold: float,
    metric: str = "logit_diff",
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """ACDC's circuit of ``task``: every edge tried once, removed when ``|score| <= threshold``
    (module docstring).

    Args:
        threshold: the largest ``|change|`` of the metric, as a fraction of ``C - K``, for
            which an edge is removed (0 removes only edges whose removal changes nothing).
        metric, max_rows, max_bytes: as :func:`interp.discovery.scores.edge_scores`'s
            (decisions read dataset means: the result does not depend on the split).

    Returns ``edge, source, target, score, in_circuit``, one row per edge in graph order;
    ``score`` as measured when the edge was tried. ``attrs``: ``clean_metric``,
    ``corrupted_metric``, ``circuit_metric`` (the final state's mean), ``method``,
    ``threshold``, ``n_rows``, ``calls`` (batched calls) and ``runs`` (states measured).
    """
    number = not isinstance(threshold, bool) and isinstance(threshold, (int, float))
    if not number or math.isnan(threshold) or threshold < 0:
        raise ValueError(
            f"threshold must be a number >= 0 (a fraction of clean - corrupted), got {threshold!r}"
        )
    threshold = float(threshold)
    graph, batch, task_metric = task_inputs(model, task, metric, max_rows, max_bytes)
    with torch.no_grad():
        c = dataset_mean(task_metric, run_logits(model, batch.clean.to(model.cfg.device)))
        corrupted, corrupt_logits = writer_outputs(model, batch.corrupted, graph)
        k = dataset_mean(task_metric, corrupt_logits)
    del corrupt_logits
    if _undefined(c, k):
        raise ValueError(
            f"the clean and corrupted metrics ({c:.6g}, {k:.6g}) are too close to divide by; "
            "ACDC's threshold is a fraction of their difference: use a task whose runs differ"
        )
    budget = dict(max_rows=max_rows, max_bytes=max_bytes, held=deltas_bytes(model, graph, batch))

    def measure(states: list[list[Edge]]) -> list[float]:  # the engine's passes take no grad
        values = removed_metrics(model, batch, task_metric, corrupted, states, graph, **budget)
        return values.double().mean(dim=1).tolist()

    removed, scores, final, calls, runs = prune(
        acdc_order(graph), measure, c, c - k, threshold, window=WINDOW, progress=progress
    )
    frame = edge_frame(
        graph.edges, [scores[e] for e in graph.edges], dict(clean_metric=c, corrupted_metric=k,
        circuit_metric=final, method="acdc", threshold=threshold, n_rows=len(batch.clean),
        calls=calls, runs=runs, recovered_undefined=False),
    )  # fmt: skip
    gone = set(removed)
    frame["in_circuit"] = [e not in gone for e in graph.edges]
    return frame
