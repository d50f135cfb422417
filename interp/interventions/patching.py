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
token reads: padding changes no number (tests/interventions/test_patching_tasks.py). Grids with one
cell per
position need rows of one length, or ``positions="named"``: rows carrying ``positions``
(``IO``, ``S2``) are then reported by label (:mod:`interp.interventions.task_positions`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from interp.engine import HookFn, Intervention, pair_tokens, run_patched
from interp.interventions.grids import COLUMNS, DIRECTIONS, GRIDS, METHODS, grid_sites
from interp.interventions.inputs import Rows, analysis_rows
from interp.interventions.metrics import MetricFn
from interp.interventions.patch_rows import ROW_COLUMNS, TASK_COLUMNS, patch_rows

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
            (``"local"``, ``"ray"``, ``"slurm"`` or an
            :class:`interp.foundation.executors.Sharding`;
            :func:`interp.interventions.shards.sharded_patch`), merged into the same table
            (docs/scale.md).

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
    rows = _rows(model, clean, corrupted, metric, per_row=per_row, positions=positions)
    settings = dict(sites=sites, direction=direction, method=method, layers=layers)
    settings.update(max_rows=max_rows, max_bytes=max_bytes)
    extras = dict(per_row=per_row, interventions=interventions, corruption=corruption)
    if executor is not None:
        return _sharded(model, clean, rows, executor, settings, positions=positions, **extras)
    return patch_rows(model, rows, progress=progress, positions=positions, **extras, **settings)


def _rows(model, clean, corrupted, metric, *, per_row: bool, positions: str | None) -> Rows:
    """The checked rows of a pair or a task; ``positions`` only for a task."""
    rows = analysis_rows(model, clean, corrupted, metric, call="patch_activations", per_row=per_row)
    if positions is not None and not rows.task:
        raise ValueError(
            "positions='named' is for a task whose rows carry positions; one prompt pair's "
            "grid is by index"
        )
    return rows


def _sharded(
    model,
    task,
    rows: Rows,
    executor,
    settings: dict,
    *,
    per_row,
    interventions,
    corruption,
    positions,
) -> pd.DataFrame:
    """The task's table patched in shards on ``executor``
    (:mod:`interp.interventions.shards`), which merges means only."""
    from interp.interventions.shards import sharded_patch

    if not rows.task or per_row or interventions or corruption or positions is not None:
        raise ValueError(
            "executor= merges means over the shards of a Task: pass a Task, and leave out "
            "per_row, interventions, corruption and positions"
        )
    return sharded_patch(model, task, executor, metric=rows.metric.kind, **settings)


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
