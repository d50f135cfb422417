"""Activation patching: many patched runs of one prompt in one batched forward pass.

:func:`run_patched` (the engine's, :mod:`interp.engine.batched`) runs many patched copies of one
prompt in batched forward passes; :func:`patch_activations` builds the grids on it (every layer,
position and head of the requested sites), in either direction:

- **denoising**: run the corrupted prompt, patch in the clean run's activation;
- **noising**: run the clean prompt, patch in the corrupted run's activation.

``recovered = (metric - corrupted_metric) / (clean_metric - corrupted_metric)``: 0 is the
corrupted run's value, 1 the clean run's. When the two are numerically equal it is undefined:
NaN, and ``frame.attrs["recovered_undefined"]`` is True.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from torch import Tensor

from interp.engine import (
    HookFn,
    Intervention,
    MemoryBudgetError,
    Site,
    check_eval,
    estimate_attribution_bytes,
    estimate_cache_bytes,
    format_size,
    pair_tokens,
    parse_size,
    rows_per_pass,
    run_cached,
    run_patched,
)
from interp.interventions.grids import (
    COLUMNS,
    DIRECTIONS,
    GRIDS,
    METHODS,
    grid_sites,
    recovered,
    site_frame,
)
from interp.interventions.metrics import MetricFn, metric_name, resolve_metric, row_by_row
from interp.interventions.metrics import per_row as metric_rows
from interp.interventions.sanity import answer_ranks, sanity_warnings
from interp.interventions.task_patching import TASK_METRICS, is_task, patch_task

__all__ = [
    "run_patched",
    "patch_activations",
    "grid_sites",
    "GRIDS",
    "COLUMNS",
    "DIRECTIONS",
    "METHODS",
    "pair_tokens",
    "method_errors",
]


def _frame(
    sites: Sequence[Site], method: str, values: Tensor, clean: float, corrupted: float
) -> tuple[pd.DataFrame, bool]:
    frame = site_frame(sites, method, values)
    frame["recovered"], undefined = recovered(values.double(), clean, corrupted)
    return frame, undefined


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
    ``patch_activations(model, task, metric="logit_diff", ...)`` patches every row of an
    :class:`interp.Task` (or its ``task.tokens(model)``) at once, each row read with its own
    answer at its own last real token, and adds ``recovered_sem`` (or, with ``per_row=True``,
    one table row per site and task row): see :func:`interp.interventions.task_patching.patch_task`.

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
        max_rows: patched runs per forward pass (bounds memory); default: as many as keep
            the float32 logits under 256 MiB (rows of one pass always start at one layer).
        max_bytes: a memory budget instead (bytes or text such as ``"500MB"``; not with
            ``max_rows``): the source run's cache of the patched hooks is held throughout, and
            the patched runs go in passes of as many rows as fit what is left (same numbers as
            one pass). ``method="attribution"`` cannot be split (one forward and backward over
            the prompt): over the budget it raises :class:`interp.engine.MemoryBudgetError`
            before running, with its estimate.
        interventions: applied to every run (clean, corrupted and patched).
        corruption: applied to the corrupted run only (and so to the patched runs of the
            corrupted prompt when denoising): causal tracing is ``corrupted=clean`` with
            ``noise`` interventions here.
        executor: over a :class:`interp.Task` only: patch its rows in shards on an executor
            (``"local"``, ``"ray"``, ``"slurm"`` or an :class:`interp.executors.Sharding`;
            :mod:`interp.executors.tasks`), merged into the same table (docs/scale.md).

    Returns columns ``site, layer, head, pos, method, metric, recovered``; ``head``/``pos`` are
    NA where they do not apply. ``attrs`` hold ``clean_metric``, ``corrupted_metric``,
    ``direction``, ``metric_name``, ``recovered_undefined`` and ``sanity``: plain-language
    warnings when the experiment itself is doubtful (:func:`interp.interventions.sanity.
    sanity_warnings`: clean not above corrupted, a gap too small to normalise by, an answer
    the model ranks poorly), an empty list when all is well.
    """
    from interp.interventions.attribution import attribution_deltas

    if is_task(clean):
        if corrupted is not None:
            raise ValueError(
                "a task carries each row's corrupted prompt: call "
                "patch_activations(model, task, metric=..., sites=...) without corrupted, "
                f"got {type(corrupted).__name__} {corrupted!r:.60}"
            )
        kind = "logit_diff" if metric is None else metric
        if not isinstance(kind, str):
            raise ValueError(
                f"over a task, metric is one of {', '.join(TASK_METRICS)} (each row's own "
                f"answer and wrong at its last real token), got {metric_name(kind)}"
            )
        if executor is not None:
            from interp.executors.tasks import sharded_patch

            if per_row or interventions or corruption or positions is not None:
                raise ValueError(
                    "executor= merges means over shards: leave out per_row, interventions, "
                    "corruption and positions"
                )
            settings = dict(sites=sites, direction=direction, method=method, layers=layers)
            return sharded_patch(
                model, clean, executor, metric=kind, max_rows=max_rows, max_bytes=max_bytes,
                **settings,
            )  # fmt: skip
        return patch_task(
            model,
            clean,
            metric=kind,
            sites=sites,
            direction=direction,
            method=method,
            per_row=per_row,
            layers=layers,
            max_rows=max_rows,
            max_bytes=max_bytes,
            progress=progress,
            interventions=interventions,
            corruption=corruption,
            positions=positions,
        )
    if positions is not None:
        raise ValueError(
            "positions='named' is for a task whose rows carry positions; one prompt pair's "
            "grid is by index"
        )
    if corrupted is None or metric is None:
        raise TypeError(
            "patch_activations needs clean, corrupted and metric (one prompt pair), "
            "or a Task as its second argument"
        )
    if per_row:
        raise ValueError(
            "per_row=True is for a task (one table row per task row); a prompt "
            "pair has one row: pass a Task, or leave per_row out"
        )
    check_eval(model)
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    metric = resolve_metric(model, metric)  # token text to ids, refused before any run
    clean_tokens, corrupted_tokens = pair_tokens(model, clean, corrupted)
    chosen = grid_sites(model, list(dict.fromkeys(sites)), clean_tokens.shape[1], layers=layers)
    names = sorted({site.hook_name for site in chosen})
    if max_bytes is not None and max_rows is not None:
        raise ValueError(
            "pass max_rows (patched runs per pass) or max_bytes (a memory budget "
            "the runs per pass are planned from), not both"
        )
    per_pass = _runs_per_pass(
        model, clean_tokens.shape[1], len(chosen), names, max_rows, max_bytes, method
    )
    denoising = direction == "denoising"
    base_tokens, source_tokens = (
        (corrupted_tokens, clean_tokens) if denoising else (clean_tokens, corrupted_tokens)
    )
    on_corrupted = [*interventions, *corruption]
    base_fixed, source_fixed = (
        (on_corrupted, interventions) if denoising else (interventions, on_corrupted)
    )
    source = run_cached(model, source_tokens, hooks=names, interventions=source_fixed)
    metric = row_by_row(model, metric, source.logits)  # a batch-averaging metric, row by row
    source_metric = float(metric_rows(metric, source.logits)[0])
    parts, base_metric, base = [], None, None
    if method in ("attribution", "both"):
        deltas, base_metric = attribution_deltas(
            model, base_tokens, source, chosen, metric, fixed=base_fixed
        )
    if base_metric is None:
        base = run_cached(model, base_tokens, interventions=base_fixed)
        base_metric = float(metric_rows(metric, base.logits)[0])
    clean_metric, corrupted_metric = (
        (source_metric, base_metric) if denoising else (base_metric, source_metric)
    )
    undefined = False
    if method in ("exact", "both"):
        rows = [[Intervention(site, "patch", source=source[site.hook_name])] for site in chosen]
        values = run_patched(
            model, base_tokens, rows, metric, fixed=base_fixed, max_rows=per_pass, progress=progress
        )
        frame, undefined = _frame(chosen, "exact", values, clean_metric, corrupted_metric)
        parts.append(frame)
    if method in ("attribution", "both"):
        frame, undefined = _frame(
            chosen, "attribution", base_metric + deltas, clean_metric, corrupted_metric
        )
        parts.append(frame)
    frame = pd.concat(parts, ignore_index=True)
    clean_run = source if denoising else base
    frame.attrs.update(
        sanity=sanity_warnings(
            [clean_metric],
            [corrupted_metric],
            ranks=None if clean_run is None else _pair_rank(metric, clean_run.logits),
            metric_name=metric_name(metric),
            higher_is_better=metric_name(metric) != "loss",
        ),
        clean_metric=clean_metric,
        corrupted_metric=corrupted_metric,
        direction=direction,
        metric_name=metric_name(metric),
        recovered_undefined=undefined,
        n_tokens=int(clean_tokens.shape[1]),
    )
    return frame


def _pair_rank(metric: MetricFn, logits: Tensor) -> list[int] | None:
    """The answer's rank on the clean prompt, for a built-in metric that names its answer."""
    answer, pos = getattr(metric, "answer", None), getattr(metric, "pos", -1)
    if not isinstance(answer, int) or logits is None:
        return None
    return answer_ranks(logits[:, pos].float(), [[answer]])


def _runs_per_pass(
    model,
    n_pos: int,
    n_runs: int,
    names: Sequence[str],
    max_rows: int | None,
    max_bytes: int | str | None,
    method: str,
) -> int:
    """Patched runs per pass, asked of the engine before anything runs: under ``max_bytes`` the
    source run's cache is held throughout, and attribution's single forward and backward pass
    must fit whole (refused with its estimate otherwise)."""
    held = 0
    if max_bytes is not None:
        held = estimate_cache_bytes(model, (1, n_pos), hooks=names, keep_logits=True)
        need = held + estimate_attribution_bytes(model, n_pos)
        if method in ("attribution", "both") and need > parse_size(max_bytes):
            raise MemoryBudgetError(
                f"attribution patching runs one forward and one backward pass over the whole "
                f"prompt of {n_pos} tokens and cannot be split: it needs about "
                f"{format_size(need)} but max_bytes is {format_size(parse_size(max_bytes))}; "
                f"raise max_bytes to at least {format_size(need)} or use method='exact', which "
                "is split into passes that fit"
            )
    return rows_per_pass(
        model,
        n_pos,
        n_runs,
        max_rows,
        max_bytes,
        held,
        f"the source run's cache of the {len(names)} patched hooks",
    )


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
