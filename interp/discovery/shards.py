"""Edge scores over a task in shards: partial sums per shard, merged into the whole run's scores.

Shard ``i`` of ``n`` takes the task's rows ``i, i + n, i + 2n, ...`` (0-based), as
:mod:`interp.interventions.shards` does for patching. Every scored method (``exact``, ``eap``,
``eap-ig``) is a dataset mean of per-row numbers divided by ``C - K``, the clean minus the
corrupted dataset mean (:func:`interp.discovery.scores.edge_changes`), so a shard keeps sums
over its rows: per edge the sum of the rows' metric changes, and the sums of the rows' clean
and corrupted metrics. :func:`merge_discovery_sums` checks the shards are of one task and
settings and cover every row once, and divides: ``score = (S_e / n) / (S_C / n - S_K / n)``,
what :func:`interp.discovery.scores.edge_scores` gives on the whole task. The whole task is one
shard of one. ACDC has no shards: each of its decisions depends on the ones before it, over
every row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from interp.discovery.graph import edge_frame, split_edge
from interp.discovery.scores import SCORED_METHODS, edge_changes
from interp.foundation.executors.sharding import Sharding, as_sharding
from interp.foundation.partials import check_one_run, check_shards
from interp.interventions.grids import undefined as _undefined  # too close to divide by
from interp.interventions.shards import shard_rows, task_fingerprint
from interp.tasks import Task
from interp.tasks.shard_jobs import run_task_shards, task_shard

__all__ = [
    "discovery_partial_sums",
    "merge_discovery_sums",
    "sharded_edge_scores",
    "DISCOVER_FORMAT",
]

DISCOVER_FORMAT = "interp-discover-partial/1"  # merge refuses other formats


def discovery_partial_sums(
    model,
    task: Task,
    method: str,
    *,
    shard: tuple[int, int] = (0, 1),
    metric: str = "logit_diff",
    ig_steps: int = 5,
    max_bytes: int | str | None = None,
    progress: bool = False,
) -> dict:
    """Score shard ``shard = (index, count)`` of ``task`` by ``method`` (one of
    :data:`interp.discovery.scores.SCORED_METHODS`); its sums as a JSON-ready dict (module
    docstring). ``shard=(0, 1)`` is the whole task."""
    if method not in SCORED_METHODS:
        raise ValueError(
            f"method {method!r} has no shards; shard one of {', '.join(SCORED_METHODS)} (ACDC's "
            "decisions depend on each other over every row)"
        )
    index, count = shard
    rows = shard_rows(len(task), index, count)
    part = Task(tuple(task.rows[i] for i in rows), source=task.source)
    graph, change, c, k, n = edge_changes(
        model, part, method, metric=metric, ig_steps=ig_steps, max_bytes=max_bytes,
        progress=progress,
    )  # fmt: skip
    return {
        "format": DISCOVER_FORMAT,
        "settings": {
            "task": task_fingerprint(task),
            "n_rows": len(task),
            "shards": count,
            "method": method,
            "metric": metric,
            "ig_steps": ig_steps if method == "eap-ig" else None,
        },
        "shard": index,
        "rows": rows,
        "edges": list(graph.edge_names),
        "sum": [float(v) * n for v in change.double().tolist()],
        "clean_sum": c * n,
        "corrupted_sum": k * n,
    }


def merge_discovery_sums(parts: Sequence[dict]) -> pd.DataFrame:
    """The :func:`interp.discovery.scores.edge_scores` frame of the whole task (its columns and
    ``attrs``, and ``shards``) from the partial sums of every shard; a ValueError naming a
    partial that does not fit."""
    settings = check_one_run(parts, DISCOVER_FORMAT, "discover", "one task and method")
    edges = parts[0]["edges"]
    for number, part in enumerate(parts[1:], start=2):
        if part["edges"] != edges:
            raise ValueError(f"partial {number} scores other edges than partial 1 (another model)")
    check_shards(parts, settings["shards"])
    n = sum(len(p["rows"]) for p in parts)
    sums = [math.fsum(p["sum"][e] for p in parts) for e in range(len(edges))]
    c = math.fsum(p["clean_sum"] for p in parts) / n
    k = math.fsum(p["corrupted_sum"] for p in parts) / n
    undefined = _undefined(c, k)
    return edge_frame(
        [split_edge(e) for e in edges], [math.nan if undefined else s / n / (c - k) for s in sums],
        dict(clean_metric=c, corrupted_metric=k, method=settings["method"], n_rows=n,
        recovered_undefined=undefined, shards=settings["shards"]),
    )  # fmt: skip


def sharded_edge_scores(
    model,
    task: Task,
    method: str,
    executor: Sharding | str,
    *,
    metric: str = "logit_diff",
    ig_steps: int = 5,
    max_bytes: int | str | None = None,
) -> pd.DataFrame:
    """:func:`interp.discovery.edge_scores`'s frame (scored methods), its shards
    (:func:`discovery_partial_sums`) run by ``executor`` (:mod:`interp.tasks.shard_jobs`),
    merged by :func:`merge_discovery_sums`."""
    settings = {"method": method, "metric": metric, "ig_steps": ig_steps, "max_bytes": max_bytes}
    job = task_shard("discover", discovery_partial_sums, model, task, settings=settings)
    key = {"task": task_fingerprint(task), **settings}
    return merge_discovery_sums(run_task_shards(job, len(task), as_sharding(executor), key))
