"""Activation patching: every site of the requested grids patched, in batched forward passes.

:func:`patch_activations` patches one prompt pair, or every row of a task at once (a pair is a
task of one row, :mod:`interp.interventions.inputs`), in either direction:

- **denoising**: run the corrupted rows, patch in the same row's clean activation;
- **noising**: run the clean rows, patch in the corrupted run's activation.

With ``m_i(site)`` the patched metric of row ``i`` (read at its own last real token, with its
own answer, for a task), ``C = mean_i clean_i`` and ``K = mean_i corrupted_i`` over ``n`` rows:

- ``metric = mean_i m_i(site)``; ``recovered = (metric - K) / (C - K)``: 0 is the corrupted
  run's value, 1 the clean run's, from the dataset means as the IOI paper and TransformerLens
  do (not the mean of per-row ratios, which a row with ``clean_i`` near ``corrupted_i`` would
  swamp). When ``C`` and ``K`` are numerically equal it is undefined: NaN, and
  ``frame.attrs["recovered_undefined"]`` is True.
- over a task, ``recovered_sem = std_i(m_i(site)) / sqrt(n) / |C - K|``: the standard error of
  ``metric`` over rows (``std`` with ``n - 1``) in units of recovered; NaN for one row and for
  attribution rows (the gradient estimates only the mean). ``per_row=True`` keeps one table
  row per site and task row instead (``row``: the 0-based index of ``task[row]``), its
  ``recovered`` from that row's own clean and corrupted metric.

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
    pair_tokens,
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
from interp.interventions.inputs import Rows, analysis_rows
from interp.interventions.metrics import MetricFn
from interp.interventions.sanity import sanity_warnings
from interp.interventions.task_positions import label_column, named_labels, named_runs
from interp.tasks import TaskTokens

__all__ = [
    "run_patched",
    "patch_activations",
    "grid_sites",
    "GRIDS",
    "COLUMNS",
    "TASK_COLUMNS",
    "ROW_COLUMNS",
    "DIRECTIONS",
    "METHODS",
    "pair_tokens",
    "method_errors",
]

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


def patch_activations(
    model,
    clean,
    corrupted=None,
    metric: MetricFn | str | None = None,
    *,
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
    executor=None,
) -> pd.DataFrame:
    """Patch every site of the requested grids and measure ``metric``; a tidy DataFrame.

    ``patch_activations(model, clean, corrupted, metric, ...)`` patches one prompt pair;
    ``patch_activations(model, task, metric="logit_diff", ...)`` every row of an
    :class:`interp.Task` (or its ``task.tokens(model)``) at once, each row read with its own
    answer at its own last real token (``metric``: ``logit_diff`` or ``prob_diff``).

    Args:
        sites: grid names from ``GRIDS``: ``resid_pre|mid|post``, ``attn_out``, ``mlp_out``
            (layer x position), ``heads`` (each head's output at all positions), ``heads_pos``
            (each head at each position), ``q``, ``k``, ``v``, ``pattern`` (per head, all
            positions) and ``q_pos``, ``k_pos``, ``v_pos``, ``pattern_pos`` (per head and
            position; the pattern's query position).
        direction: ``denoising`` (clean into corrupted) or ``noising`` (corrupted into clean).
        method: ``exact`` (a patched forward pass per cell, batched), ``attribution`` (the
            gradient approximation, one forward and one backward for the whole grid) or
            ``both`` (rows for each; compare them with :func:`method_errors`).
        per_row: over a task only: one table row per site and task row (column ``row``).
        positions: over a task only: ``"named"`` reports per-position grids by the rows'
            position labels (``pos`` holds ``IO``, ``S2``, ...; rows may differ in length).
        max_rows: batch rows per forward pass (patched runs x task rows; bounds memory);
            default: as many as keep the float32 logits under 256 MiB.
        max_bytes: a memory budget instead (bytes or text such as ``"500MB"``; not with
            ``max_rows``): the source run's cache of the patched hooks is held throughout, and
            the patched runs go in passes of as many rows as fit what is left (same numbers as
            one pass). ``method="attribution"`` cannot be split (one forward and backward over
            all rows): over the budget it raises :class:`interp.engine.MemoryBudgetError`
            before running, with its estimate.
        interventions: applied to every run (clean, corrupted and patched).
        corruption: applied to the corrupted run only (and so to the patched runs of the
            corrupted prompt when denoising): causal tracing is ``corrupted=clean`` with
            ``noise`` interventions here.
        executor: over a :class:`interp.Task` only: patch its rows in shards on an executor
            (``"local"``, ``"ray"``, ``"slurm"`` or an :class:`interp.executors.Sharding`;
            :mod:`interp.executors.tasks`), merged into the same table (docs/scale.md).

    Returns columns ``site, layer, head, pos, method, metric, recovered`` (a task adds
    ``recovered_sem``; with ``per_row`` ``site, layer, head, pos, row, method, metric,
    recovered``); ``head``/``pos`` are NA where they do not apply. ``attrs`` hold
    ``clean_metric``, ``corrupted_metric`` (dataset means over a task), ``direction``,
    ``metric_name``, ``recovered_undefined``, ``n_tokens`` (the padded width) and ``sanity``:
    plain-language warnings when the experiment itself is doubtful
    (:func:`interp.interventions.sanity.sanity_warnings`: clean not above corrupted, a gap too
    small to normalise by, an answer the model ranks poorly), an empty list when all is well.
    Over a task also ``n_rows``, ``clean_metric_rows``, ``corrupted_metric_rows`` and
    ``answer_rank_rows`` (each row's answer rank on its clean prompt, 1 = top).
    """
    from interp.interventions.attribution import attribution_deltas

    rows = analysis_rows(model, clean, corrupted, metric, call="patch_activations", per_row=per_row)
    if positions is not None and not rows.task:
        raise ValueError(
            "positions='named' is for a task whose rows carry positions; one prompt pair's "
            "grid is by index"
        )
    if executor is not None:
        from interp.executors.tasks import sharded_patch

        if not rows.task or per_row or interventions or corruption or positions is not None:
            raise ValueError(
                "executor= merges means over the shards of a Task: pass a Task, and leave out "
                "per_row, interventions, corruption and positions"
            )
        settings = dict(sites=sites, direction=direction, method=method, layers=layers)
        return sharded_patch(
            model, clean, executor, metric=rows.metric.kind, max_rows=max_rows,
            max_bytes=max_bytes, **settings,
        )  # fmt: skip
    check_eval(model)
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    grids = list(dict.fromkeys(sites))
    if rows.task:
        _check(rows.batch, grids, method, per_row, positions)
    labels = named_labels(rows.batch) if positions else []
    n_rows, n_pos = (int(d) for d in rows.clean.shape)
    chosen = grid_sites(model, grids, n_pos, layers=layers)
    names = sorted({site.hook_name for site in chosen})
    if max_bytes is not None and max_rows is not None:
        raise ValueError(
            "pass max_rows (patched runs per pass) or max_bytes (a memory budget "
            "the runs per pass are planned from), not both"
        )
    n_runs = len(chosen)
    if positions:  # per-position grids by label: one run per label, not per index
        n_runs = sum(1 for s in chosen if s.pos in (None, 0)) * max(1, len(labels))
    held = _budget(model, rows, names, n_runs, method, max_rows, max_bytes)
    denoising = direction == "denoising"
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
        model, base_tokens, hooks=names if positions else (), interventions=base_fixed
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
    make = _row_frame if per_row else _mean_frame
    parts = []
    if method in ("exact", "both"):
        if cell_labels is None:
            runs = [[Intervention(s, "patch", source=source[s.hook_name])] for s in chosen]
        values = run_patched(
            model,
            base_tokens,
            runs,
            row_metric=rows.row_metric,
            read_at=rows.read_at,  # a task row's last real token: no other is unembedded
            fixed=base_fixed,
            max_rows=max_rows,
            max_bytes=max_bytes,
            held=held,
            held_what=_HELD.format(len(names), n_rows),
            progress=progress,
        )
        part = make(chosen, "exact", values.double(), clean, corrupted)
        if cell_labels is not None:
            label_column(part, cell_labels, repeat=n_rows if per_row else 1)
        parts.append(part)
    if method in ("attribution", "both"):
        deltas, value = attribution_deltas(
            model, base_tokens, source, chosen, rows.metric, fixed=base_fixed
        )  # float32 estimates about the gradient pass's own metric (the mean over rows)
        parts.append(
            _mean_frame(chosen, "attribution", (value + deltas).double()[:, None], clean, corrupted)
        )
    frame = pd.concat(parts, ignore_index=True)
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
            n_rows=n_rows,
            clean_metric_rows=clean.tolist(),
            answer_rank_rows=ranks,
            corrupted_metric_rows=corrupted.tolist(),
        )
    return frame


def method_errors(frame: pd.DataFrame) -> pd.DataFrame:
    """Exact beside attribution per cell: ``exact``, ``attribution`` and ``error`` (their
    difference in metric units) for a frame made with ``method="both"``."""
    methods = set(frame["method"])
    if not {"exact", "attribution"} <= methods:
        raise ValueError(
            f"method_errors needs rows of both methods, got {sorted(methods)}; "
            "run patch_activations(..., method='both')"
        )
    keys = ["site", "layer", "head", "pos"]
    exact = frame[frame["method"] == "exact"].set_index(keys)["metric"]
    approx = frame[frame["method"] == "attribution"].set_index(keys)["metric"]
    table = pd.DataFrame({"exact": exact, "attribution": approx}).reset_index()
    table["error"] = table["attribution"] - table["exact"]
    return table
