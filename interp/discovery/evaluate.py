"""``evaluate_circuit``: how much of a task a circuit carries (docs/discovery.md).

The run of a circuit ``C`` is the clean run with every edge outside ``C`` removed: its reader
gets the writer's ablated output in place of the writer's output in this run
(:mod:`interp.discovery.removal`), ``"patch"``: the writer's corrupted output, ``"mean"``: its
mean over every real token of every clean row (one vector per writer), ``"zero"``: zero.
``m(M)`` is the full model (the clean run, nothing removed) and ``m(empty)`` the run with every
edge removed; faithfulness is ``(m(C) - m(empty)) / (m(M) - m(empty))``, so the full graph
gives exactly 1 and the empty circuit exactly 0.

The MIB curve: faithfulness of the circuits of the top ``round(f * n_total)`` edges (at least
1) by ``|score|`` for each fraction ``f`` of :data:`CURVE_FRACTIONS`; CPR is the area under it
(trapezoid over the fractions, 0.001 to 1) and CMD the area under ``|1 - f|``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from interp.discovery.graph import EdgeGraph
from interp.discovery.removal import removed_metrics
from interp.discovery.runs import (
    WriterOutputs,
    deltas_bytes,
    task_inputs,
    writer_outputs,
)
from interp.engine import run_logits
from interp.interventions.grids import undefined as _undefined  # too close to divide by
from interp.tasks import Task, TaskTokens

__all__ = ["CircuitEvaluation", "evaluate_circuit", "CURVE_FRACTIONS", "ABLATIONS", "ranked_edges"]

CURVE_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # MIB fractions
ABLATIONS = ("patch", "mean", "zero")  # what a removed edge's reader gets


@dataclass(frozen=True)
class CircuitEvaluation:
    """Faithfulness of a circuit over a task (module docstring)."""

    faithfulness: float  # (m(C) - m(empty)) / (m(M) - m(empty)), dataset means; NaN: undefined
    per_row: pd.DataFrame  # row, circuit_metric, empty_metric, model_metric, faithfulness
    curve: pd.DataFrame | None  # fraction, n_edges, faithfulness (MIB fractions)
    cpr: float | None  # area under the curve (trapezoid over fraction)
    cmd: float | None  # area under |1 - f|
    ablation: str  # "patch" | "mean" | "zero"
    n_edges: int  # edges in the circuit
    n_total: int  # edges in the graph


def ranked_edges(scores: pd.DataFrame, graph: EdgeGraph) -> list[str]:
    """Every edge of ``graph`` by ``|score|`` descending, ties in graph order; a ValueError for
    NaN scores or a frame that is not this graph's."""
    if not {"edge", "score"} <= set(scores.columns):
        raise ValueError("scores must be an edge_scores frame with 'edge' and 'score' columns")
    if sorted(scores["edge"]) != sorted(graph.edge_names):
        raise ValueError("scores do not list exactly this model's edges: score this model's graph")
    if scores["score"].isna().any():
        raise ValueError(
            "some edge scores are NaN (the clean and corrupted metrics are too close to divide "
            "by): choose a task whose clean and corrupted runs differ"
        )
    size = dict(zip(scores["edge"], scores["score"].abs(), strict=True))
    return sorted(graph.edge_names, key=lambda edge: -size[edge])  # stable: ties in graph order


def curve_sizes(n_total: int) -> list[int]:
    """Edges in the circuit at each of :data:`CURVE_FRACTIONS`: ``round(f * n_total)``, at
    least 1."""
    return [max(1, round(f * n_total)) for f in CURVE_FRACTIONS]


def _edge_list(edges, graph: EdgeGraph) -> list[str]:
    names = list(getattr(edges, "edges", edges))
    if isinstance(edges, str):
        raise ValueError("edges must be a Circuit or an iterable of edge names, not one string")
    known = set(graph.edge_names)
    unknown = [e for e in names if e not in known]
    if unknown:
        raise ValueError(
            f"{len(unknown)} edge(s) not in this model's graph, e.g. {unknown[0]!r}; names are "
            "SOURCE->TARGET as EdgeGraph.from_model(model).edge_names lists them"
        )
    chosen = set(names)
    return [e for e in graph.edge_names if e in chosen]


def _ablated(model, batch: TaskTokens, graph: EdgeGraph, ablation: str) -> WriterOutputs:
    if ablation == "patch":
        return writer_outputs(model, batch.corrupted, graph)[0]
    clean, _ = writer_outputs(model, batch.clean, graph)

    def fixed(t: torch.Tensor) -> torch.Tensor:  # [rows pos (head) d] -> the same, broadcast
        if ablation == "zero":
            return torch.zeros_like(t[:1, :1]).expand_as(t)
        mask = batch.mask.to(t.device)
        real = t[mask]  # [real tokens (head) d]
        return real.double().mean(0).to(t.dtype)[None, None].expand_as(t)

    return clean.map(fixed)


def _faithfulness(circuit: torch.Tensor, empty: torch.Tensor, full: torch.Tensor) -> float:
    c, e, m = (float(t.double().mean()) for t in (circuit, empty, full))
    return math.nan if _undefined(m, e) else (c - e) / (m - e)


def _circuit_metrics(
    model,
    batch: TaskTokens,
    metric,
    graph: EdgeGraph,
    circuits: list[list[str]],
    ablation: str,
    **budget,
) -> tuple[dict[frozenset, torch.Tensor], torch.Tensor, torch.Tensor]:
    """``({edges kept: per-row metric}, empty, full)``: each distinct circuit of ``circuits``
    runs once, in batched passes with the empty circuit (every edge removed); the full graph is
    the clean run."""
    n_total = len(graph)
    keys = [frozenset(c) for c in circuits]
    distinct = [k for k in dict.fromkeys(keys) if 0 < len(k) < n_total]
    by_name = dict(zip(graph.edge_names, graph.edges, strict=True))
    runs = [[by_name[e] for e in graph.edge_names if e not in k] for k in distinct]
    runs.append(list(graph.edges))  # the empty circuit: every edge removed
    with torch.no_grad():
        full = metric(run_logits(model, batch.clean.to(model.cfg.device))).float().cpu()
        ablated = _ablated(model, batch, graph, ablation)
    held = deltas_bytes(model, graph, batch) if ablation == "patch" else 0
    values = removed_metrics(model, batch, metric, ablated, runs, graph, held=held, **budget)
    metrics = {k: values[i] for i, k in enumerate(distinct)}
    metrics[frozenset()] = values[-1]
    metrics[frozenset(graph.edge_names)] = full
    return metrics, values[-1], full


def _per_row(circuit: torch.Tensor, empty: torch.Tensor, full: torch.Tensor) -> pd.DataFrame:
    """The per-row frame of :class:`CircuitEvaluation`."""
    rows = zip(circuit.tolist(), empty.tolist(), full.tolist(), strict=True)
    faithful = [math.nan if _undefined(m, e) else (c - e) / (m - e) for c, e, m in rows]
    return pd.DataFrame(
        {
            "row": range(len(circuit)),
            "circuit_metric": circuit.numpy(),
            "empty_metric": empty.numpy(),
            "model_metric": full.numpy(),
            "faithfulness": faithful,
        }
    )


def _curve(points: list[float], n_total: int) -> tuple[pd.DataFrame, float, float]:
    """The MIB curve's frame, its CPR and CMD (module docstring)."""
    curve = pd.DataFrame(
        {"fraction": CURVE_FRACTIONS, "n_edges": curve_sizes(n_total), "faithfulness": points}
    )
    x, f = np.asarray(CURVE_FRACTIONS), np.asarray(points)
    return curve, float(np.trapezoid(f, x)), float(np.trapezoid(np.abs(1.0 - f), x))


def evaluate_circuit(
    model,
    task: Task | TaskTokens,
    edges,
    *,
    ablation: str = "patch",
    scores: pd.DataFrame | None = None,
    metric: str = "logit_diff",
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
    progress: bool = False,
) -> CircuitEvaluation:
    """Faithfulness of the circuit ``edges`` on ``task`` (module docstring).

    Args:
        edges: a :class:`interp.discovery.circuit.Circuit` or an iterable of edge names
            (``SOURCE->TARGET``).
        ablation: what the reader of an edge outside the circuit gets (module docstring):
            ``"patch"``, ``"mean"`` or ``"zero"``.
        scores: an edge_scores frame; when given (or when ``edges`` is a Circuit with scores)
            the MIB curve, CPR and CMD are computed over edges ordered by ``|score|``.
        metric, max_rows, max_bytes: as :func:`interp.discovery.scores.edge_scores`'s.
    """
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation must be one of {', '.join(ABLATIONS)}, got {ablation!r}")
    graph, batch, task_metric = task_inputs(model, task, metric, max_rows, max_bytes)
    chosen = _edge_list(edges, graph)
    scores = getattr(edges, "scores", None) if scores is None else scores
    ranked = None if scores is None else ranked_edges(scores, graph)
    n_total = len(graph)
    # the circuit itself, then the curve's
    curve_circuits = [] if ranked is None else [ranked[:k] for k in curve_sizes(n_total)]
    metrics, empty, full = _circuit_metrics(
        model, batch, task_metric, graph, [chosen, *curve_circuits], ablation,
        max_rows=max_rows, max_bytes=max_bytes, progress=progress,
    )  # fmt: skip
    circuit = metrics[frozenset(chosen)]
    curve = cpr = cmd = None
    if ranked is not None:
        points = [_faithfulness(metrics[frozenset(c)], empty, full) for c in curve_circuits]
        curve, cpr, cmd = _curve(points, n_total)
    return CircuitEvaluation(
        faithfulness=_faithfulness(circuit, empty, full),
        per_row=_per_row(circuit, empty, full),
        curve=curve,
        cpr=cpr,
        cmd=cmd,
        ablation=ablation,
        n_edges=len(chosen),
        n_total=n_total,
    )
