"""``discover_circuit``: a set of edges that carries a task, from edge scores or ACDC
(docs/discovery.md).

Scored methods (``exact``, ``eap``, ``eap-ig``) score every edge with
:func:`interp.discovery.scores.edge_scores` and keep the top ``top_n`` by ``|score|`` (ties in
graph order, as EAP-IG and MIB rank them) or every edge with ``|score| >= threshold``.
``acdc`` prunes the graph itself (:mod:`interp.discovery.acdc`) and keeps what survives.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pandas as pd

from interp.discovery.acdc import acdc
from interp.discovery.evaluate import ranked_edges
from interp.discovery.scores import METHODS, edge_scores
from interp.tasks import Task, TaskTokens

__all__ = ["Circuit", "discover_circuit", "circuit_from_scores", "CIRCUIT_METHODS"]

CIRCUIT_METHODS = METHODS  # discover_circuit methods: the scored ones and acdc


@dataclass(frozen=True)
class Circuit:
    """A set of edges found on a task."""

    edges: tuple[str, ...]  # edge names "SOURCE->TARGET", graph order
    method: str  # "exact" | "eap" | "eap-ig" | "acdc" | "given"
    params: dict  # e.g. {"top_n": 20} or {"threshold": 0.01, "ig_steps": 5, "metric": "logit_diff"}
    scores: pd.DataFrame | None  # edge_scores' frame with an in_circuit column

    def __len__(self) -> int:
        return len(self.edges)

    def __contains__(self, edge: object) -> bool:
        return edge in self.edges


def discover_circuit(
    model,
    task: Task | TaskTokens,
    method: str = "eap-ig",
    *,
    top_n: int | None = None,
    threshold: float | None = None,
    metric: str = "logit_diff",
    ig_steps: int = 5,
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
    progress: bool = False,
    executor=None,
) -> Circuit:
    """The circuit of ``task`` found by ``method`` (module docstring).

    Args:
        method: ``"exact"``, ``"eap"``, ``"eap-ig"`` (scored: pass ``top_n`` or ``threshold``)
            or ``"acdc"`` (pass ``threshold``: the metric change, as a fraction of clean -
            corrupted, below which an edge is pruned).
        top_n, threshold: the edges a scored method keeps (module docstring).
        metric, ig_steps, max_rows, max_bytes, progress: as :func:`edge_scores`.
        executor: scored methods over a :class:`interp.Task`: the scores in shards on an
            executor (``"local"``, ``"ray"``, ``"slurm"`` or an
            :class:`interp.foundation.executors.Sharding`), merged into the same scores
            (float64 sums, :func:`interp.discovery.shards.sharded_edge_scores`; docs/scale.md).

    Returns a :class:`Circuit`: its edges in graph order, the method, the parameters and the
    score frame with an ``in_circuit`` column.
    """
    if method not in CIRCUIT_METHODS:
        raise ValueError(f"method must be one of {', '.join(CIRCUIT_METHODS)}, got {method!r}")
    if (top_n is None) == (threshold is None):
        raise ValueError("pass exactly one of top_n (the number of edges) or threshold")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0):
        raise ValueError(f"top_n must be a whole number >= 0, got {top_n!r}")
    if threshold is not None and not float(threshold) >= 0:
        raise ValueError(f"threshold must be a number >= 0, got {threshold!r}")
    params: dict = {"metric": metric}
    budget = {"max_rows": max_rows, "max_bytes": max_bytes, "progress": progress}
    if method == "acdc":
        if threshold is None:
            raise ValueError("method 'acdc' takes threshold (it prunes edges), not top_n")
        if executor is not None:
            raise ValueError("method 'acdc' has no shards (each decision depends on the last)")
        frame = acdc(model, task, threshold=float(threshold), metric=metric, **budget)
        params["threshold"] = float(threshold)
        edges = tuple(frame.loc[frame["in_circuit"].astype(bool), "edge"])
        return Circuit(edges=edges, method=method, params=params, scores=frame)
    if executor is not None:
        from interp.discovery.shards import sharded_edge_scores

        if max_rows is not None:
            raise ValueError("executor= takes max_bytes (each shard's budget), not max_rows")
        settings = {"metric": metric, "ig_steps": ig_steps, "max_bytes": max_bytes}
        frame = sharded_edge_scores(model, task, method, executor, **settings)
    else:
        frame = edge_scores(model, task, method, metric=metric, ig_steps=ig_steps, **budget)
    if method == "eap-ig":
        params["ig_steps"] = ig_steps
    return circuit_from_scores(frame, method, top_n=top_n, threshold=threshold, params=params)


def circuit_from_scores(
    scores: pd.DataFrame,
    method: str,
    *,
    top_n: int | None = None,
    threshold: float | None = None,
    params: dict | None = None,
) -> Circuit:
    """The circuit a scored method keeps from an :func:`edge_scores` frame (rows in graph
    order, as edge_scores and a merged ``interp discover --shard`` give them; module docstring).
    ``params`` (e.g. the metric) are kept in the circuit, with top_n or threshold."""
    if (top_n is None) == (threshold is None):
        raise ValueError("pass exactly one of top_n (the number of edges) or threshold")
    order = tuple(scores["edge"])
    ranked = ranked_edges(scores, SimpleNamespace(edge_names=order))  # refuses NaN scores
    params = dict(params or {})
    if top_n is not None:
        if top_n > len(ranked):
            raise ValueError(f"top_n={top_n} is more than the graph's {len(ranked)} edges")
        params["top_n"] = top_n
        kept = set(ranked[:top_n])
    else:
        params["threshold"] = float(threshold)
        kept = set(scores.loc[scores["score"].abs() >= float(threshold), "edge"])
    frame = scores.copy()
    frame["in_circuit"] = frame["edge"].isin(kept)
    edges = tuple(e for e in order if e in kept)
    return Circuit(edges=edges, method=method, params=params, scores=frame)
