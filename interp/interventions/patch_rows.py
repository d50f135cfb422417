"""Activation patching over rows: the one path behind :func:`interp.patch_activations`.

:func:`patch_rows` patches every site of the requested grids over checked rows
(:class:`interp.interventions.inputs.Rows`: one prompt pair is a task of one row), reads the
source and base runs, runs the patched runs on the engine's one runner
(:func:`interp.engine.run_patched`) and builds the table :mod:`interp.interventions.patching`
describes. The task's shards (:mod:`interp.interventions.shards`) call it too.
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
    run_patched,
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
from interp.interventions.inputs import Rows
from interp.interventions.sanity import sanity_warnings
from interp.interventions.task_positions import label_column, named_labels, named_runs
from interp.tasks import TaskTokens

__all__ = ["patch_rows", "TASK_COLUMNS", "ROW_COLUMNS"]

TASK_COLUMNS = [*COLUMNS, "recovered_sem"]  # dataset means over a task
ROW_COLUMNS = [*COLUMNS[:4], "row", *COLUMNS[4:]]  # per_row=True
_HELD = "the source run's cache of the {} patched hooks over {} rows"  # named in refusals


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


def _budget(model, rows: Rows, names, n_runs, method, max_rows, max_bytes) -> int:
    """Bytes held throughout (the source run's cache of every row), after refusing a budget
    that cannot fit before anything runs."""
    n_rows, n_pos = (int(d) for d in rows.clean.shape)
    held = 0
    if max_bytes is not None:
        held = estimate_cache_bytes(model, (n_rows, n_pos), hooks=names, keep_logits=True)
        need = held + n_rows * estimate_attribution_bytes(model, n_pos)
        if method in ("attribution", "both") and need > parse_size(max_bytes):
            what = f"all {n_rows} rows of" if rows.task else "the whole prompt of"
            raise MemoryBudgetError(
                f"attribution patching runs one forward and one backward pass over {what} "
                f"{n_pos} tokens and cannot be split yet: it needs about {format_size(need)} "
                f"but max_bytes is {format_size(parse_size(max_bytes))}; raise max_bytes to at "
                f"least {format_size(need)} or use method='exact', which is split into passes"
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


def patch_rows(
    model,
    rows: Rows,
    *,
    sites: Sequence[str],
    direction: str,
    method: str,
    per_row: bool,
    layers: Sequence[int] | None,
    max_rows: int | None,
    max_bytes: int | str | None,
    progress: bool,
    positions: str | None,
    interventions: Sequence[Intervention | tuple[str, HookFn]] = (),
    corruption: Sequence[Intervention | tuple[str, HookFn]] = (),
) -> pd.DataFrame:
    """:func:`interp.patch_activations`'s table over ``rows`` (its arguments, checked here but
    for the rows themselves, which :func:`interp.interventions.inputs.analysis_rows` checked;
    their defaults are patch_activations', given once there)."""
    grids = list(dict.fromkeys(sites))
    chosen, labels = _checked_sites(
        model, rows, grids, direction, method, per_row, layers, max_rows, max_bytes, positions
    )
    names = sorted({site.hook_name for site in chosen})
    n_rows, n_pos = (int(d) for d in rows.clean.shape)
    n_runs = len(chosen)
    if positions:  # per-position grids by label: one run per label, not per index
        n_runs = sum(1 for s in chosen if s.pos in (None, 0)) * max(1, len(labels))
    held = _budget(model, rows, names, n_runs, method, max_rows, max_bytes)
    denoising = direction == "denoising"
    rows, source, base, base_tokens, base_fixed = _source_and_base(
        model, rows, names, denoising, interventions, corruption, keep_base=bool(positions)
    )
    source_rows, base_rows = rows.values(source.logits), rows.values(base.logits)
    cell_labels = None
    if positions:
        chosen, cell_labels, runs = named_runs(
            model, rows.batch, grids, labels, source, base, layers
        )
    clean, corrupted = (source_rows, base_rows) if denoising else (base_rows, source_rows)
    ranks = rows.ranks((source if denoising else base).logits)
    del base
    parts = []
    if method in ("exact", "both"):
        if cell_labels is None:
            runs = [[Intervention(s, "patch", source=source[s.hook_name])] for s in chosen]
        passes = dict(max_rows=max_rows, max_bytes=max_bytes, held=held, progress=progress)
        values = run_patched(
            model,
            base_tokens,
            runs,
            row_metric=rows.row_metric,
            read_at=rows.read_at,  # a task row's last real token: no other is unembedded
            fixed=base_fixed,
            held_what=_HELD.format(len(names), n_rows),
            **passes,
        )
        make = _row_frame if per_row else _mean_frame
        part = make(chosen, "exact", values.double(), clean, corrupted)
        if cell_labels is not None:
            label_column(part, cell_labels, repeat=n_rows if per_row else 1)
        parts.append(part)
    if method in ("attribution", "both"):
        deltas, value = _attribution(model, base_tokens, source, chosen, rows.metric, base_fixed)
        parts.append(
            _mean_frame(chosen, "attribution", (value + deltas).double()[:, None], clean, corrupted)
        )
    frame = pd.concat(parts, ignore_index=True)
    return _with_attrs(frame, rows, clean, corrupted, ranks, direction, n_pos)


def _checked_sites(
    model, rows: Rows, grids, direction, method, per_row, layers, max_rows, max_bytes, positions
):
    """The grids' sites, and the rows' position labels (``positions="named"``), after checking
    the settings (the rows themselves were checked by ``analysis_rows``)."""
    check_eval(model)
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if rows.task:
        _check(rows.batch, grids, method, per_row, positions)
    labels = named_labels(rows.batch) if positions else []
    chosen = grid_sites(model, grids, int(rows.clean.shape[1]), layers=layers)
    if max_bytes is not None and max_rows is not None:
        raise ValueError(
            "pass max_rows (patched runs per pass) or max_bytes (a memory budget "
            "the runs per pass are planned from), not both"
        )
    return chosen, labels


def _source_and_base(
    model, rows: Rows, names, denoising: bool, interventions, corruption, *, keep_base
):
    """The source run (its cache of ``names``), the rows with their metric settled on it, the
    base run (caching ``names`` too when ``keep_base``), the base's tokens and interventions."""
    base_tokens, source_tokens = (
        (rows.corrupted, rows.clean) if denoising else (rows.clean, rows.corrupted)
    )
    on_corrupted = [*interventions, *corruption]
    base_fixed, source_fixed = (
        (on_corrupted, interventions) if denoising else (interventions, on_corrupted)
    )
    source = run_cached(model, source_tokens, hooks=names, interventions=source_fixed)
    rows = rows.settled(model, source.logits)  # a batch-averaging metric, row by row
    base = run_cached(
        model, base_tokens, hooks=names if keep_base else (), interventions=base_fixed
    )
    return rows, source, base, base_tokens, base_fixed


def _attribution(model, base_tokens, source, chosen, metric, base_fixed):
    """Attribution patching's per-site deltas and the metric they start from."""
    from interp.interventions.attribution_patching import attribution_deltas

    # float32 estimates about the gradient pass's own metric (the mean over rows)
    return attribution_deltas(model, base_tokens, source, chosen, metric, fixed=base_fixed)


def _with_attrs(frame: pd.DataFrame, rows: Rows, clean, corrupted, ranks, direction, n_pos):
    """The table with its ``attrs``: the runs' metrics, the sanity warnings, the rows'."""
    if not rows.task:
        frame = frame.drop(columns="recovered_sem")  # one pair: no spread to estimate
    c, k = float(clean.mean()), float(corrupted.mean())
    frame.attrs.update(
        sanity=sanity_warnings(
            clean.tolist(),
            corrupted.tolist(),
            ranks=ranks,
            metric_name=rows.name,
            higher_is_better=rows.name != "loss",
        ),
        clean_metric=c,
        corrupted_metric=k,
        direction=direction,
        metric_name=rows.name,
        recovered_undefined=undefined(c, k),
        n_tokens=n_pos,
    )
    if rows.task:
        frame.attrs.update(
            n_rows=int(rows.clean.shape[0]),
            clean_metric_rows=clean.tolist(),
            answer_rank_rows=ranks,
            corrupted_metric_rows=corrupted.tolist(),
        )
    return frame
