"""Path patching's inputs and result table, for one prompt pair or for a task.

A pair (``clean, corrupted, metric``) is run as a batch of its prompt rows and the metric's
mean over them is reported, as before. A task (:class:`interp.Task` or its ``TaskTokens``) is
run the same way over its right-padded rows, each read with its own answer and wrong at its own
last real token (``metric`` is a :meth:`TaskTokens.metric` kind). With ``m_i`` a sender's metric
on row ``i``, ``C`` and ``K`` the clean and corrupted means over the ``n`` rows:

- ``metric = mean_i m_i``; ``recovered = (metric - K) / (C - K)`` from the dataset means (as
  the IOI paper does);
- ``recovered_sem = std_i(m_i) / sqrt(n) / |C - K|``, the standard error of ``metric`` over rows
  in units of recovered (NaN for one row);
- ``per_row=True``: one table row per sender and task row (column ``row``), its ``recovered``
  from that row's own clean and corrupted metric.

Padding changes no number: causal attention never lets a real token see the padding after it,
and every change path patching records or delivers at a real position depends on real
positions only (tests/test_path_patching_tasks.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from interp.engine import PromptError, to_tokens
from interp.interventions.inputs import TASK_METRICS, is_task
from interp.interventions.metrics import metric_name, resolve_metric
from interp.interventions.path_nodes import _recoverable
from interp.tasks import Task

__all__ = ["PathInputs", "path_inputs", "path_table", "tokens_pair"]


@dataclass(frozen=True)
class PathInputs:
    """What path patching runs: the two token batches, how a block of logits becomes one value
    per task row (or one number for a pair), and whether this is a task."""

    clean: Tensor  # [batch pos]
    corrupted: Tensor  # [batch pos]
    read: Callable[[Tensor], Tensor]  # logits of one block of rows -> [rows] (task) or []
    name: str  # the metric's name
    task: bool


def tokens_pair(model, clean, corrupted) -> tuple[Tensor, Tensor]:
    """Both prompts as token batches of one shape, refused in one line otherwise."""
    clean_t, corrupt_t = to_tokens(model, clean), to_tokens(model, corrupted)
    if clean_t.shape != corrupt_t.shape:

        def show(t):
            rows = model.to_str_tokens(t[0]) if model.tokenizer is not None else t[0].tolist()
            return f"{list(t.shape)} {rows}"

        raise PromptError(
            f"clean and corrupted prompts must have the same [batch, pos] shape; "
            f"clean is {show(clean_t)}, corrupted is {show(corrupt_t)}: make them "
            "tokenise to the same length"
        )
    return clean_t, corrupt_t


def _mean(values, rows: int) -> Tensor:
    values = torch.as_tensor(values, dtype=torch.float64)
    if values.ndim == 0:
        return values
    if values.ndim == 1 and len(values) == rows:
        return values.mean()
    raise ValueError(
        f"the metric must return a scalar or a tensor [batch] ({rows} values), "
        f"got shape {tuple(values.shape)}"
    )


def path_inputs(model, clean, corrupted, metric, per_row: bool) -> PathInputs:
    """Check the arguments of either form (module docstring) before any run."""
    if is_task(clean):
        if corrupted is not None:
            raise ValueError(
                "a task carries each row's corrupted prompt: call path_patch(model, task, "
                f"sender=..., receivers=..., metric=...) without corrupted, got {corrupted!r:.60}"
            )
        kind = "logit_diff" if metric is None else metric
        if kind not in TASK_METRICS:
            shown = kind if isinstance(kind, str) else metric_name(kind)
            raise ValueError(
                f"over a task, metric is one of {', '.join(TASK_METRICS)} (each row's own "
                f"answer and wrong at its last real token), got {shown!r}"
            )
        batch = clean.tokens(model) if isinstance(clean, Task) else clean
        task_metric = batch.metric(kind)
        return PathInputs(
            batch.clean,
            batch.corrupted,
            lambda logits: task_metric(logits).double().cpu(),
            task_metric.name,
            True,
        )
    if corrupted is None or metric is None:
        raise TypeError(
            "path patching needs clean, corrupted and metric (a prompt pair), or a Task as "
            "its second argument"
        )
    if per_row:
        raise ValueError(
            "per_row=True is for a task (one table row per task row); pass a Task, or leave "
            "per_row out"
        )
    metric = resolve_metric(model, metric)  # token text to ids, refused before any run
    clean_t, corrupt_t = tokens_pair(model, clean, corrupted)
    rows = int(clean_t.shape[0])
    return PathInputs(
        clean_t, corrupt_t, lambda logits: _mean(metric(logits), rows), metric_name(metric), False
    )


def path_table(
    senders: Sequence,
    receivers: Sequence,
    values: Tensor,
    clean: Tensor,
    corrupted: Tensor,
    *,
    task: bool,
    per_row: bool,
) -> pd.DataFrame:
    """The result table from ``values [senders rows]`` and the clean and corrupted metrics
    ``[rows]`` (one row for a pair): means (a task adds ``recovered_sem``) or, with
    ``per_row``, one table row per sender and row."""
    n_senders, n_rows = values.shape
    c, k = float(clean.mean()), float(corrupted.mean())
    if per_row:
        flat = values.reshape(-1)
        ok = torch.tensor(
            [_recoverable(float(a), float(b)) for a, b in zip(clean, corrupted, strict=True)]
        )
        ratio = ((values - corrupted) / (clean - corrupted)).masked_fill(~ok, math.nan)
        senders = [s for s in senders for _ in range(n_rows)]
        recovered = ratio.reshape(-1).tolist()
    else:
        flat = values.mean(dim=1)
        recovered = (
            ((flat - k) / (c - k)).tolist() if _recoverable(c, k) else [math.nan] * n_senders
        )
    table = pd.DataFrame(
        {
            "site": "path",
            "layer": [s.layer for s in senders],
            "head": pd.array([s.head for s in senders], dtype="Int64"),
            "pos": pd.array([None] * len(senders), dtype="Int64"),
            "method": "exact",
            "metric": flat.tolist(),
            "recovered": recovered,
        }
    )
    if per_row:
        table.insert(4, "row", list(range(n_rows)) * n_senders)
    elif task:
        good = n_rows > 1 and _recoverable(c, k)
        sem = values.std(dim=1) / math.sqrt(n_rows) / abs(c - k) if good else None
        table["recovered_sem"] = math.nan if sem is None else sem.tolist()
    table["sender"] = [str(s) for s in senders]
    table["receivers"] = ", ".join(str(r) for r in receivers)
    return table
