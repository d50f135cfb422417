"""Activation patching over a task: every row patched at once, each read with its own answer.

Row ``i`` of a task is a clean/corrupted pair with its own answer and wrong tokens; its metric
(:meth:`interp.tasks.TaskTokens.metric`, ``logit_diff`` or ``prob_diff``) is read at its own
last real token. Denoising runs every corrupted row and patches in the same row's clean
activation; noising the reverse. With ``m_i(site)`` the patched metric of row ``i``, and
``C = mean_i clean_i``, ``K = mean_i corrupted_i`` over the ``n`` rows:

- ``metric = mean_i m_i(site)``, the dataset mean;
- ``recovered = (metric - K) / (C - K)``: from the dataset means, as the IOI paper and
  TransformerLens do (not the mean of per-row ratios, which a row with ``clean_i`` near
  ``corrupted_i`` would swamp);
- ``recovered_sem = std_i(m_i(site)) / sqrt(n) / |C - K|``: the standard error of ``metric``
  over rows (``std`` with ``n - 1``), in units of recovered; NaN for one row, and for
  attribution rows (the gradient estimates only the mean).

``per_row=True`` keeps one table row per site and task row instead (``row``: the 0-based index
of ``task[row]``), its ``recovered`` from that row's own clean and corrupted metric.

Rows are right-padded to one width. Causal attention never lets a real token see the padding
after it, and a patch over all positions also writes pad positions of its row, which no real
token reads: padding changes no number (tests/test_patching_tasks.py). Grids with one cell per
position need rows of one length, or ``positions="named"``: rows carrying ``positions``
(``IO``, ``S2``) are then reported by label (:mod:`interp.interventions.task_positions`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import torch
from torch import Tensor

from interp.engine import (
    HookFn,
    Intervention,
    MemoryBudgetError,
    check_eval,
    estimate_attribution_bytes,
    estimate_cache_bytes,
    format_size,
    parse_size,
    run_cached,
    run_patched_task,
    task_blocks,
)
from interp.interventions.grids import (
    COLUMNS,
    DIRECTIONS,
    GRIDS,
    METHODS,
    grid_sites,
    recovered,
    site_frame,
    undefined,
)
from interp.interventions.sanity import answer_ranks, sanity_warnings
from interp.interventions.task_positions import label_column, named_labels, named_runs
from interp.tasks import Task, TaskMetric, TaskTokens, last_logits

__all__ = [
    "patch_task",
    "is_task",
    "task_row_metric",
    "TASK_METRICS",
    "TASK_COLUMNS",
    "ROW_COLUMNS",
]

TASK_METRICS = ("logit_diff", "prob_diff")  # TaskTokens.metric kinds
TASK_COLUMNS = [*COLUMNS, "recovered_sem"]  # dataset means
ROW_COLUMNS = [*COLUMNS[:4], "row", *COLUMNS[4:]]  # per_row=True
_HELD = "the source run's cache of the {} patched hooks over {} rows"  # named in refusals


def is_task(value) -> bool:
    """Whether ``value`` is a task (a :class:`interp.Task` or its :class:`TaskTokens`)."""
    return isinstance(value, (Task, TaskTokens))


def task_row_metric(metric: TaskMetric):
    """The task metric as the engine's row metric: batch row ``b`` is task row ``rows[b]``."""

    def value(logits: Tensor, rows: Tensor) -> Tensor:
        picked = rows.tolist()
        wrong = None if metric.wrong is None else tuple(metric.wrong[i] for i in picked)
        answers = tuple(metric.answers[i] for i in picked)
        return TaskMetric(metric.kind, answers, wrong, metric.lengths[rows])(logits)

    return value


def _check(batch: TaskTokens, grids: Sequence[str], method: str, per_row: bool, named) -> None:
    lengths = batch.lengths
    by_pos = [g for g in grids if g in GRIDS and GRIDS[g][2]]
    if named not in (None, "named"):
        raise ValueError(f"positions is None (by index) or 'named' (by label), got {named!r}")
    if named and method != "exact":
        raise ValueError(f"positions='named' needs method='exact', got {method!r}")
    if by_pos and not named and int(lengths.min()) != int(lengths.max()):
        raise ValueError(
            f"sites {', '.join(by_pos)} patch one position at a time, but the task's rows have "
            f"{int(lengths.min())} to {int(lengths.max())} tokens, so position p is a "
            "different token in each row; add 'positions' to the rows (label -> index, e.g. "
            '{"IO": 1, "S2": 9, "END": -1}) and pass positions="named", or use sites over '
            "all positions: heads, q, k, v, pattern"
        )
    if per_row and method != "exact":
        raise ValueError(
            f"per_row=True needs method='exact' (got {method!r}): attribution over a task "
            "estimates the dataset mean only; per-row estimates come next"
        )


def _budget(model, batch, names, n_runs, method, max_rows, max_bytes) -> int:
    """Bytes held throughout (the source run's cache of every row), after refusing a budget
    that cannot fit before anything runs."""
    n_rows, n_pos = (int(d) for d in batch.clean.shape)
    held = 0
    if max_bytes is not None:
        held = estimate_cache_bytes(model, (n_rows, n_pos), hooks=names, keep_logits=True)
        need = held + n_rows * estimate_attribution_bytes(model, n_pos)
        if method in ("attribution", "both") and need > parse_size(max_bytes):
            raise MemoryBudgetError(
                f"attribution patching over a task runs one forward and one backward pass over "
                f"all {n_rows} rows of {n_pos} tokens and cannot be split yet: it needs about "
                f"{format_size(need)} but max_bytes is {format_size(parse_size(max_bytes))}; "
                f"raise max_bytes to at least {format_size(need)} or use method='exact'"
            )
    task_blocks(
        model,
        n_pos,
        n_rows,
        n_runs,
        max_rows=max_rows,
        max_bytes=max_bytes,
        held=held,
        held_what=_HELD.format(len(names), n_rows),
    )
    return held


def _mean_frame(sites, method: str, values: Tensor, clean: Tensor, corrupted: Tensor):
    """One table row per site: dataset means, recovered from them, and its standard error."""
    c, k = float(clean.mean()), float(corrupted.mean())
    frame = site_frame(sites, method, values.mean(dim=1))
    frame["recovered"], is_undefined = recovered(values.mean(dim=1), c, k)
    n = values.shape[1]
    if method == "attribution" or n == 1 or is_undefined:
        frame["recovered_sem"] = math.nan
    else:
        frame["recovered_sem"] = (values.std(dim=1) / math.sqrt(n) / abs(c - k)).numpy()
    return frame


def _row_frame(sites, method: str, values: Tensor, clean: Tensor, corrupted: Tensor):
    """One table row per site and task row, recovered from that row's own metrics."""
    n_sites, n_rows = values.shape
    frame = site_frame([s for s in sites for _ in range(n_rows)], method, values.reshape(-1))
    frame.insert(4, "row", list(range(n_rows)) * n_sites)
    ratio = (values - corrupted) / (clean - corrupted)
    bad = torch.tensor(
        [undefined(float(c), float(k)) for c, k in zip(clean, corrupted, strict=True)]
    )
    frame["recovered"] = ratio.masked_fill(bad, math.nan).reshape(-1).numpy()
    return frame


def patch_task(
    model,
    task: Task | TaskTokens,
    *,
    metric: str = "logit_diff",
    sites: Sequence[str] = ("resid_pre",),
    direction: str = "denoising",
    method: str = "exact",
    per_row: bool = False,
    layers: Sequence[int] | None = None,
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
    progress: bool = False,
    interventions: Sequence[Intervention | tuple[str, HookFn]] = (),
    corruption: Sequence[Intervention | tuple[str, HookFn]] = (),
    positions: str | None = None,
) -> pd.DataFrame:
    """Patch every site of the requested grids over every row of ``task``; a tidy DataFrame.

    ``positions="named"``: per-position grids are reported by the rows' position labels
    (``pos`` holds ``IO``, ``S2``, ...), which works over rows of different lengths
    (:mod:`interp.interventions.task_positions`).

    The arguments are :func:`interp.interventions.patch_activations`'s; ``metric`` is a
    :meth:`TaskTokens.metric` kind. ``max_rows`` bounds the batch rows of one pass (patched
    runs x task rows); ``max_bytes`` holds the source run's cache of every row and plans the
    rest (``method="attribution"`` runs all rows in one forward and backward pass).

    Returns ``site, layer, head, pos, method, metric, recovered, recovered_sem`` (module
    docstring), or with ``per_row`` ``site, layer, head, pos, row, method, metric, recovered``.
    ``attrs``: ``clean_metric`` and ``corrupted_metric`` (dataset means), ``n_rows``,
    ``clean_metric_rows`` and ``corrupted_metric_rows`` (per row), ``direction``,
    ``metric_name``, ``recovered_undefined`` (of the means), ``n_tokens`` (the padded width)
    ``answer_rank_rows`` (each row's answer rank on its clean prompt, 1 = top) and ``sanity``
    (warnings about the task itself, :mod:`interp.interventions.sanity`).
    """
    from interp.interventions.attribution import attribution_deltas

    check_eval(model)
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if metric not in TASK_METRICS:
        raise ValueError(f"over a task, metric is one of {', '.join(TASK_METRICS)}, got {metric!r}")
    batch = task.tokens(model) if isinstance(task, Task) else task
    grids = list(dict.fromkeys(sites))
    _check(batch, grids, method, per_row, positions)
    labels = named_labels(batch) if positions else []
    chosen = grid_sites(model, grids, int(batch.clean.shape[1]), layers=layers)
    names = sorted({site.hook_name for site in chosen})
    n_runs = len(chosen)
    if positions:  # per-position grids by label: one run per label, not per index
        n_runs = sum(1 for s in chosen if s.pos in (None, 0)) * max(1, len(labels))
    held = _budget(model, batch, names, n_runs, method, max_rows, max_bytes)
    denoising = direction == "denoising"
    base_tokens, source_tokens = (
        (batch.corrupted, batch.clean) if denoising else (batch.clean, batch.corrupted)
    )
    on_corrupted = [*interventions, *corruption]
    base_fixed, source_fixed = (
        (on_corrupted, interventions) if denoising else (interventions, on_corrupted)
    )
    task_metric = batch.metric(metric)
    source = run_cached(model, source_tokens, hooks=names, interventions=source_fixed)
    base = run_cached(
        model, base_tokens, hooks=names if positions else (), interventions=base_fixed
    )
    source_rows, base_rows = (task_metric(run.logits).double().cpu() for run in (source, base))
    cell_labels = None
    if positions:
        chosen, cell_labels, runs = named_runs(model, batch, grids, labels, source, base, layers)
    clean, corrupted = (source_rows, base_rows) if denoising else (base_rows, source_rows)
    clean_logits = last_logits((source if denoising else base).logits, batch.lengths)
    ranks = answer_ranks(clean_logits.float(), batch.answers)
    del base, clean_logits
    make = _row_frame if per_row else _mean_frame
    parts = []
    if method in ("exact", "both"):
        if cell_labels is None:
            runs = [[Intervention(s, "patch", source=source[s.hook_name])] for s in chosen]
        values = run_patched_task(
            model,
            base_tokens,
            runs,
            task_row_metric(task_metric),
            read_at=batch.last,  # each row's last real token: no other is unembedded
            fixed=base_fixed,
            max_rows=max_rows,
            max_bytes=max_bytes,
            held=held,
            held_what=_HELD.format(len(names), len(batch)),
            progress=progress,
        )
        part = make(chosen, "exact", values.double(), clean, corrupted)
        if cell_labels is not None:
            label_column(part, cell_labels, repeat=len(batch) if per_row else 1)
        parts.append(part)
    if method in ("attribution", "both"):
        deltas, _ = attribution_deltas(
            model, base_tokens, source, chosen, task_metric, fixed=base_fixed
        )
        estimate = (float(base_rows.mean()) + deltas.double())[:, None]
        parts.append(_mean_frame(chosen, "attribution", estimate, clean, corrupted))
    frame = pd.concat(parts, ignore_index=True)
    c, k = float(clean.mean()), float(corrupted.mean())
    frame.attrs.update(
        sanity=sanity_warnings(
            clean.tolist(), corrupted.tolist(), ranks=ranks, metric_name=task_metric.name
        ),
        clean_metric=c,
        corrupted_metric=k,
        n_rows=len(batch),
        clean_metric_rows=clean.tolist(),
        answer_rank_rows=ranks,
        corrupted_metric_rows=corrupted.tolist(),
        direction=direction,
        metric_name=task_metric.name,
        recovered_undefined=undefined(c, k),
        n_tokens=int(batch.clean.shape[1]),
    )
    return frame
