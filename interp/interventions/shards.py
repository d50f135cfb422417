"""Patching a task in shards: partial sums per shard, merged into exactly the whole run.

Shard ``i`` of ``n`` takes the task's rows ``i, i + n, i + 2n, ...`` (0-based), so ``n``
machines (a SLURM job array, Ray tasks, Kubernetes jobs) each run a slice.
:func:`task_partial_sums` patches one shard and returns, per site, the sum of the rows'
patched metric and of its squares, with each row's clean and corrupted metric and answer rank:
a JSON-ready dict. :func:`merge_partial_sums` checks that the shards are of one task and one
setting and cover every row once, and rebuilds the table :func:`interp.patch_activations`
returns for the whole task (``metric``, ``recovered``, ``recovered_sem`` and the ``attrs``),
within float64 rounding of the sums (tests/interventions/test_patching_shards.py: within 1e-6).

With ``S`` and ``Q`` the sums of ``m_i`` and ``m_i^2`` over all ``n`` rows:
``metric = S / n``, ``std = sqrt((Q - S^2 / n) / (n - 1))``. Attribution rows are linear in the
rows (the gradient of the mean metric): a shard stores ``n_shard * estimate``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence

import pandas as pd
import torch

from interp.foundation.executors.sharding import Sharding, as_sharding
from interp.foundation.partials import check_one_run, check_shards
from interp.interventions.grids import recovered, undefined
from interp.interventions.inputs import analysis_rows
from interp.interventions.patch_rows import TASK_COLUMNS, patch_rows
from interp.interventions.sanity import sanity_warnings
from interp.tasks import Task
from interp.tasks.shard_jobs import run_task_shards, task_shard

__all__ = [
    "shard_rows",
    "task_fingerprint",
    "task_partial_sums",
    "merge_partial_sums",
    "sharded_patch",
    "FORMAT",
]

FORMAT = "interp-patch-partial/1"  # the partial file's format: merge refuses others
KEYS = ["site", "layer", "head", "pos", "method"]  # one cell of the table


def shard_rows(n_rows: int, index: int, count: int) -> list[int]:
    """The 0-based rows of shard ``index`` of ``count``: ``index, index + count, ...``."""
    if not 0 <= index < count:
        raise ValueError(f"shard {index}/{count}: the index must lie in 0 to {count - 1}")
    if index >= n_rows:
        raise ValueError(
            f"shard {index}/{count} has no rows: the task has {n_rows}; use at most {n_rows} shards"
        )
    return list(range(index, n_rows, count))


def task_fingerprint(task: Task) -> str:
    """A hash of the task's rows, so that shards of different tasks are never merged."""
    text = json.dumps(task.to_records(), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def task_partial_sums(
    model,
    task: Task,
    *,
    shard: tuple[int, int] = (0, 1),
    metric: str = "logit_diff",
    sites: Sequence[str] = ("resid_pre",),
    direction: str = "denoising",
    method: str = "exact",
    layers: Sequence[int] | None = None,
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
    progress: bool = False,
    positions: str | None = None,
) -> dict:
    """Patch shard ``shard = (index, count)`` of ``task``; its partial sums as a JSON-ready dict.

    The arguments are :func:`interp.interventions.patch_activations`'s (``positions="named"``:
    cells by the rows' position labels). Merge the shards with
    :func:`merge_partial_sums`; ``shard=(0, 1)`` is the whole task.
    """
    index, count = shard
    rows = shard_rows(len(task), index, count)
    part = Task(tuple(task.rows[i] for i in rows), source=task.source)
    common = dict(
        sites=sites,
        direction=direction,
        layers=layers,
        max_rows=max_rows,
        max_bytes=max_bytes,
        progress=progress,
        positions=positions,
    )
    cells, attrs = [], None
    if method in ("exact", "both"):
        inputs = analysis_rows(model, part, None, metric, call="task_partial_sums", per_row=True)
        frame = patch_rows(model, inputs, method="exact", per_row=True, **common)
        attrs = frame.attrs
        sums = frame.groupby(KEYS, sort=False, dropna=False)["metric"]
        table = sums.sum().rename("sum").to_frame().join(sums.apply(lambda v: (v**2).sum()))
        cells.append(table.rename(columns={"metric": "sumsq"}).reset_index())
    if method in ("attribution", "both"):
        inputs = analysis_rows(model, part, None, metric, call="task_partial_sums")
        frame = patch_rows(model, inputs, method="attribution", per_row=False, **common)
        attrs = attrs or frame.attrs
        table = frame[KEYS].assign(sum=frame["metric"] * len(rows), sumsq=math.nan)
        cells.append(table)
    table = pd.concat(cells, ignore_index=True)
    settings = {
        "task": task_fingerprint(task),
        "n_rows": len(task),
        "metric": metric,
        "sites": list(dict.fromkeys(sites)),
        "direction": direction,
        "method": method,
        "layers": None if layers is None else [int(x) for x in layers],
        "shards": count,
    } | ({"positions": positions} if positions else {})  # older partials have no key
    return {
        "format": FORMAT,
        "settings": settings,
        "shard": index,
        "rows": rows,
        "metric_name": attrs["metric_name"],
        "n_tokens": attrs["n_tokens"],
        "clean_rows": attrs["clean_metric_rows"],
        "corrupted_rows": attrs["corrupted_metric_rows"],
        "rank_rows": attrs["answer_rank_rows"],
        "cells": {
            "site": table["site"].tolist(),
            "layer": [int(v) for v in table["layer"]],
            "head": [None if pd.isna(v) else int(v) for v in table["head"]],
            "pos": [_pos(v) for v in table["pos"]],
            "method": table["method"].tolist(),
            "sum": [float(v) for v in table["sum"]],
            "sumsq": [None if pd.isna(v) else float(v) for v in table["sumsq"]],
        },
    }


def _pos(value) -> int | str | None:
    """A cell's position: an index, a label (``positions="named"``) or None (all positions)."""
    return None if pd.isna(value) else value if isinstance(value, str) else int(value)


def _check_parts(parts: Sequence[dict]) -> list[int]:
    first = check_one_run(parts, FORMAT, "patch", "one run")
    check_shards(parts, first["shards"])
    rows = sorted(r for part in parts for r in part["rows"])
    if rows != list(range(first["n_rows"])):
        raise ValueError(
            f"the shards cover {len(set(rows))} of the task's {first['n_rows']} rows; "
            "rerun the shards of one run"
        )
    return rows


def merge_partial_sums(parts: Sequence[dict]) -> pd.DataFrame:
    """The whole task's patching table from the partial sums of all its shards: the columns
    and ``attrs`` of :func:`interp.patch_activations` over the task."""
    _check_parts(parts)
    settings = parts[0]["settings"]
    n = settings["n_rows"]
    by_row: dict[int, tuple[float, float, int | None]] = {}
    for part in parts:
        for r, c, k, rank in zip(
            part["rows"],
            part["clean_rows"],
            part["corrupted_rows"],
            part["rank_rows"],
            strict=True,
        ):
            by_row[r] = (c, k, rank)
    clean, corrupted, ranks = (list(v) for v in zip(*(by_row[r] for r in range(n)), strict=True))
    c, k = sum(clean) / n, sum(corrupted) / n
    tables = [pd.DataFrame(part["cells"]) for part in parts]
    merged = pd.concat(tables).groupby(KEYS, sort=False, dropna=False)
    table = merged[["sum", "sumsq"]].sum(min_count=1).reset_index()
    frame = table[KEYS].copy()
    frame["head"] = pd.array(table["head"], dtype="Int64")
    named = any(isinstance(v, str) for v in table["pos"])  # labels (positions="named")
    frame["pos"] = pd.array(table["pos"], dtype="string" if named else "Int64")
    frame["metric"] = table["sum"].to_numpy(dtype=float) / n
    values = torch.tensor(frame["metric"].to_numpy(dtype=float), dtype=torch.float64)
    frame["recovered"], is_undefined = recovered(values, c, k)
    variance = table["sumsq"].to_numpy(dtype=float) - table["sum"].to_numpy(dtype=float) ** 2 / n
    if n == 1 or is_undefined:
        frame["recovered_sem"] = math.nan
    else:
        # NaN stays NaN (attribution rows); rounding may leave a tiny negative for equal rows
        std = [v if math.isnan(v) else math.sqrt(max(v, 0.0) / (n - 1)) for v in variance]
        frame["recovered_sem"] = [s / math.sqrt(n) / abs(c - k) for s in std]
    frame = frame[TASK_COLUMNS]
    frame.attrs.update(
        sanity=sanity_warnings(clean, corrupted, ranks=ranks, metric_name=parts[0]["metric_name"]),
        clean_metric=c,
        corrupted_metric=k,
        n_rows=n,
        clean_metric_rows=clean,
        answer_rank_rows=ranks,
        corrupted_metric_rows=corrupted,
        direction=settings["direction"],
        metric_name=parts[0]["metric_name"],
        recovered_undefined=undefined(c, k),
        n_tokens=max(part["n_tokens"] for part in parts),
    )
    return frame


def sharded_patch(
    model,
    task: Task,
    executor: Sharding | str,
    *,
    metric: str = "logit_diff",
    sites=("resid_pre",),
    direction: str = "denoising",
    method: str = "exact",
    layers=None,
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
) -> pd.DataFrame:
    """:func:`interp.patch_activations`'s table over ``task``, its shards
    (:func:`task_partial_sums`) run by ``executor`` (:mod:`interp.tasks.shard_jobs`), merged by
    :func:`merge_partial_sums`."""
    settings = {
        "metric": metric,
        "sites": list(sites),
        "direction": direction,
        "method": method,
        "layers": None if layers is None else list(layers),
        "max_rows": max_rows,
        "max_bytes": max_bytes,
    }
    job = task_shard("patch", task_partial_sums, model, task, settings=settings)
    key = {"task": task_fingerprint(task), **settings}
    return merge_partial_sums(run_task_shards(job, len(task), as_sharding(executor), key))
