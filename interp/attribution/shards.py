"""Logit attribution over a task in shards: partial sums per shard, merged into the whole run.

Shard ``i`` of ``n`` takes the task's rows ``i, i + n, i + 2n, ...`` (0-based), as
:mod:`interp.interventions.shards` does for patching. :func:`attribution_partial_sums`
attributes one shard's rows (:func:`interp.attribution.task_attribution` with
``per_row=True``) and returns, per component, the sum of the rows' contributions and of their
squares, with each row's logit (difference) and identity error: a JSON-ready dict.
:func:`merge_attribution_sums` checks that the shards are of one task and cover every row once
and rebuilds :func:`interp.logit_attribution`'s task table: with ``S`` and ``Q`` the sums of
``a_i`` and ``a_i^2`` over all ``n`` rows, ``contribution = S / n`` and
``contribution_sem = sqrt((Q - S^2 / n) / (n - 1)) / sqrt(n)`` (NaN for one row).
The whole task is one shard of one, so a whole run and a merged one go through the same sums.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from interp.attribution.direct import task_attribution
from interp.foundation.partials import check_one_run, check_shards
from interp.interventions.shards import shard_rows, task_fingerprint
from interp.tasks import Task

__all__ = [
    "attribution_partial_sums",
    "merge_attribution_sums",
    "merge_attribution_rows",
    "ATTRIBUTION_FORMAT",
]

ATTRIBUTION_FORMAT = "interp-attribute-partial/1"  # merge refuses other formats
_KEYS = ["component", "layer", "head"]


def attribution_partial_sums(
    model,
    task: Task,
    *,
    shard: tuple[int, int] = (0, 1),
    per_row: bool = False,
    max_bytes: int | str | None = None,
) -> dict:
    """Attribute shard ``shard = (index, count)`` of ``task``; its partial sums as a JSON-ready
    dict (module docstring). ``shard=(0, 1)`` is the whole task. ``per_row`` also keeps each
    row's contributions (``values``, rows x components), for :func:`merge_attribution_rows`."""
    index, count = shard
    rows = shard_rows(len(task), index, count)
    part = Task(tuple(task.rows[i] for i in rows), source=task.source)
    frame = task_attribution(model, part, per_row=True, max_bytes=max_bytes)
    first = frame[frame["row"] == 0][_KEYS].reset_index(drop=True)
    values = frame["contribution"].to_numpy(dtype="float64").reshape(len(rows), len(first))
    row_attrs = frame.attrs["rows"]
    part = {
        "format": ATTRIBUTION_FORMAT,
        "settings": {
            "task": task_fingerprint(task),
            "n_rows": len(task),
            "shards": count,
            "wrong": task.has_wrong,
            "per_row": per_row,
        },
        "shard": index,
        "rows": rows,
        "reference_is": row_attrs[0]["reference_is"],
        "reference_rows": [float(a["reference"]) for a in row_attrs],
        "identity_rows": [float(a["identity_error"]) for a in row_attrs],
        "n_tokens_rows": [int(a["n_tokens"]) for a in row_attrs],
        "answer_rows": [a["answer"] for a in row_attrs],
        "wrong_rows": [a["wrong"] for a in row_attrs],
        "components": {
            "component": first["component"].tolist(),
            "layer": [None if pd.isna(v) else int(v) for v in first["layer"]],
            "head": [None if pd.isna(v) else int(v) for v in first["head"]],
            "sum": [float(v) for v in values.sum(axis=0)],
            "sumsq": [float(v) for v in (values**2).sum(axis=0)],
        },
    }
    if per_row:
        part["values"] = values.tolist()
    return part


def _checked(parts: Sequence[dict]) -> list[int]:
    """The shards' rows in merge order; a ValueError naming what does not fit."""
    settings = check_one_run(parts, ATTRIBUTION_FORMAT, "attribute", "one task")
    for number, part in enumerate(parts[1:], start=2):
        if part["components"]["component"] != parts[0]["components"]["component"]:
            raise ValueError(f"partial {number} lists other components than partial 1")
    check_shards(parts, settings["shards"])
    return [row for part in parts for row in part["rows"]]


def merge_attribution_sums(parts: Sequence[dict]) -> pd.DataFrame:
    """The task table of :func:`interp.logit_attribution` from the partial sums of every shard.

    Columns ``component, layer, head, contribution, contribution_sem``; ``attrs``: ``n_rows``,
    ``reference_rows`` and ``identity_rows`` (each row's logit (difference) and how far its
    components' sum is from it, in task order), ``identity_error`` (the largest),
    ``reference_is``, ``n_tokens_rows``, ``answer_rows``, ``wrong_rows``, ``shards``.
    """
    order = _checked(parts)
    n = len(order)
    first = parts[0]["components"]
    sums = [sum(p["components"]["sum"][c] for p in parts) for c in range(len(first["sum"]))]
    squares = [sum(p["components"]["sumsq"][c] for p in parts) for c in range(len(first["sum"]))]
    frame = pd.DataFrame({"component": first["component"]})
    frame["layer"] = pd.array(first["layer"], dtype="Int64")
    frame["head"] = pd.array(first["head"], dtype="Int64")
    frame["contribution"] = [s / n for s in sums]
    frame["contribution_sem"] = [
        math.sqrt(max(0.0, (q - s * s / n) / (n - 1)) / n) if n > 1 else math.nan
        for s, q in zip(sums, squares, strict=True)
    ]

    def by_row(key: str) -> list:
        values = {row: v for p in parts for row, v in zip(p["rows"], p[key], strict=True)}
        return [values[row] for row in sorted(order)]

    identity = by_row("identity_rows")
    frame.attrs = {
        "n_rows": n,
        "reference_rows": by_row("reference_rows"),
        "identity_rows": identity,
        "identity_error": max(identity),
        "reference_is": parts[0]["reference_is"],
        "n_tokens_rows": by_row("n_tokens_rows"),
        "answer_rows": by_row("answer_rows"),
        "wrong_rows": by_row("wrong_rows"),
        "shards": parts[0]["settings"]["shards"],
    }
    return frame


def merge_attribution_rows(parts: Sequence[dict]) -> pd.DataFrame:
    """Each row's contributions from shards made with ``per_row=True``: the columns of
    ``logit_attribution(model, task, per_row=True)`` (``row`` first, 0-based), in task order."""
    _checked(parts)
    if not all("values" in p for p in parts):
        raise ValueError("the shards hold no per-row values; run them with per_row=True")
    first = parts[0]["components"]
    found = {row: values for p in parts for row, values in zip(p["rows"], p["values"], strict=True)}
    n = len(first["component"])
    frames = [
        pd.DataFrame(
            {
                "row": [row] * n,
                "component": first["component"],
                "layer": pd.array(first["layer"], dtype="Int64"),
                "head": pd.array(first["head"], dtype="Int64"),
                "contribution": found[row],
            }
        )
        for row in sorted(found)
    ]
    return pd.concat(frames, ignore_index=True)
