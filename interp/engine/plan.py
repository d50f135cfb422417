"""Budgets: how many rows one forward pass may take, and refusing a run that cannot fit.

Everything a pass needs scales with its rows, so a budget becomes a number of rows per chunk
(:func:`rows_per_chunk`, which leaves room for what glibc keeps); analyses that reduce as they
go split their batch into such chunks (:func:`row_chunks`) and give the same numbers as one
pass. A single pass that cannot be split is checked whole (:func:`check_budget`).
"""

from __future__ import annotations

from dataclasses import replace

from interp.engine.allocator import return_freed_memory
from interp.engine.estimates import (
    Kept,
    _cache_items,
    _run_bytes,
    _shape,
    estimate_attribution_bytes,
    estimate_forward_bytes,
    estimate_loss_bytes,
    format_size,
    parse_size,
    takes_kept,
)

__all__ = [
    "MemoryBudgetError",
    "rows_per_chunk",
    "row_chunks",
    "check_budget",
    "rows_per_pass",
    "task_blocks",
    "backward_rows",
    "LOGITS_BUDGET_BYTES",
]

# glibc's default keeps resident up to this many times the memory in use (measured 1.4-2.2x
# for one pass, growing to 2.5x over 14 chunks): plans this much above the estimate hold
# without returning memory (which costs page faults); run_cached's single pass uses 2
_GLIBC_SLACK = 2.5
_GLIBC_SLACK_ONE_PASS = 2
# chunks are planned to this share of a budget: the rest covers the estimate's error and
# what grows across chunks (allocator, interpreter; measured up to +7% after 6 chunks)
_PLAN_SHARE = 0.9
# default rows per pass: the logits [rows pos d_vocab] are the largest tensor of a patched pass
LOGITS_BUDGET_BYTES = 256 * 2**20
# and, where a pass keeps bytes per row beside it (kept_per_row), those are capped by default too
KEPT_BUDGET_BYTES = 2 * LOGITS_BUDGET_BYTES


class MemoryBudgetError(ValueError):
    """A run would not fit its ``max_bytes``; the message says what would."""


def rows_per_chunk(
    model,
    n_pos: int,
    max_bytes: int | str,
    *,
    n_rows: int,
    kept_per_row: int = 0,
    loss: bool = False,
    held: int = 0,
    what: str = "this analysis",
    read_positions: int | None = None,
) -> int:
    """How many rows of ``n_pos`` tokens one forward pass may take under ``max_bytes``.

    ``kept_per_row``: bytes per row a pass needs beside the forward pass (what it records);
    ``loss``: it computes a next-token loss from the logits after each pass
    (:func:`estimate_loss_bytes`); ``held``: bytes the analysis keeps throughout, whatever
    its chunks (they come off the budget first); ``read_positions``: a pass unembeds that many
    positions per row only (the loss too is over those). Chunks are planned to 90% of the budget,
    and to 2.5x the estimate per row: glibc keeps freed memory resident (peaks measured
    1.4-2.5x what is in use), and splitting costs almost nothing, since a pass's time grows
    with its rows. Only when one row would not fit that way are freed blocks returned to the
    operating system (:func:`return_freed_memory`, which costs page faults) and chunks
    planned to the estimate itself. Raises :class:`MemoryBudgetError` when not even one row
    fits.
    """
    budget = parse_size(max_bytes)
    per_row = estimate_forward_bytes(model, (1, n_pos), read_positions=read_positions)
    if loss:
        per_row = max(per_row, estimate_loss_bytes(model, (1, read_positions or n_pos)))
    per_row += kept_per_row
    usable = int((budget - held) * _PLAN_SHARE)
    if held and per_row > usable:
        least = held + per_row / _PLAN_SHARE
        raise MemoryBudgetError(
            f"{what} keeps {format_size(held)} throughout and needs about "
            f"{format_size(per_row)} per row of {n_pos} tokens in a pass, more than "
            f"max_bytes={format_size(budget)} allows (passes are planned to {_PLAN_SHARE:.0%} "
            f"of what is left); raise max_bytes to at least {format_size(least)}, or use fewer "
            "or shorter rows"
        )
    if per_row > usable:
        raise MemoryBudgetError(
            f"{what} needs about {format_size(per_row)} per row of {n_pos} tokens, more than "
            f"{_PLAN_SHARE:.0%} of max_bytes={format_size(budget)}; raise max_bytes to at least "
            f"{format_size(per_row / _PLAN_SHARE)} or use shorter rows"
        )
    if per_row * n_rows * _GLIBC_SLACK <= usable:
        return n_rows  # one pass, with room for what glibc keeps
    if per_row * _GLIBC_SLACK <= usable:
        return int(usable // (per_row * _GLIBC_SLACK))
    return_freed_memory()
    return min(n_rows, usable // per_row)


@takes_kept
def check_budget(model, prompt_shape, max_bytes: int | str, **kept) -> None:
    """Raise :class:`MemoryBudgetError` before a run of ``run_cached(...)`` that would not fit,
    saying what would: a smaller batch, fewer layers, or dropping the largest items. The
    keyword arguments are run_cached's of what it keeps (:class:`interp.engine.estimates.Kept`)."""
    what = Kept(**kept)
    budget = parse_size(max_bytes)
    batch, n_pos = _shape(prompt_shape)
    need = _run_bytes(model, (batch, n_pos), what)
    if budget < _GLIBC_SLACK_ONE_PASS * need:
        return_freed_memory()
    if need <= budget:
        return
    items = _cache_items(model, (batch, n_pos), what)
    items.pop("logits", None)  # counted with the forward pass, where they are made
    parts = ", ".join(
        f"{k} {format_size(v)}" for k, v in sorted(items.items(), key=lambda kv: -kv[1]) if v
    )
    n_layers = int(model.cfg.n_layers)
    chosen = list(range(n_layers)) if what.layers is None else list(what.layers)
    forward = need - sum(items.values())
    options = []
    per_row = _run_bytes(model, (1, n_pos), what)
    if per_row <= budget:
        options.append(f"a batch of at most {budget // per_row} rows (of {batch})")
    fits_layers = [
        k
        for k in range(1, len(chosen))
        if _run_bytes(model, (batch, n_pos), replace(what, layers=chosen[:k])) <= budget
    ]
    if fits_layers:
        options.append(
            f"at most {fits_layers[-1]} of the {len(chosen)} layers "
            f"(layers={chosen[: fits_layers[-1]]})"
        )
    big = [k for k in ("patterns", "scores", "head_outputs") if getattr(what, k)]
    if big:
        lean = _run_bytes(model, (batch, n_pos), replace(what, **dict.fromkeys(big, False)))
        verdict = "fits" if lean <= budget else "still needs " + format_size(lean)
        options.append(
            f"reducing {' and '.join(big)} inside a hook instead of caching them "
            f"(run_cached(interventions=...), as the induction scan does; {verdict})"
        )
    advice = (
        "; or ".join(options)
        if options
        else (
            f"nothing smaller fits: one row alone needs {format_size(per_row)}; use shorter prompts"
        )
    )
    raise MemoryBudgetError(
        f"this run needs about {format_size(need)} (cache: {parts}; forward pass with logits "
        f"{format_size(forward)}) but max_bytes is {format_size(budget)}. What fits: {advice}."
    )


def row_chunks(
    model,
    n_rows: int,
    n_pos: int,
    max_bytes: int | str | None,
    *,
    kept_per_row: int = 0,
    loss: bool = False,
    held: int = 0,
    what: str = "this analysis",
) -> list[slice]:
    """Slices of ``n_rows`` rows whose forward passes each fit ``max_bytes`` (one slice when
    there is no budget); the keyword arguments are :func:`rows_per_chunk`'s."""
    if max_bytes is None:
        return [slice(0, n_rows)]
    size = rows_per_chunk(
        model,
        n_pos,
        max_bytes,
        n_rows=n_rows,
        kept_per_row=kept_per_row,
        loss=loss,
        held=held,
        what=what,
    )
    return [slice(start, min(start + size, n_rows)) for start in range(0, n_rows, size)]


def rows_per_pass(
    model,
    n_pos: int,
    n_rows: int,
    max_rows: int | None,
    max_bytes: int | str | None,
    held: int = 0,
    held_what: str = "what the caller keeps",
    *,
    kept_per_row: int = 0,
    what: str = "one patched run",
    advice: str = "patch fewer sites or layers, or raise max_bytes",
    read_one: bool = False,
) -> int:
    """Runs per forward pass: ``max_rows``, or planned from ``max_bytes`` less ``held`` (what
    the caller keeps throughout, named ``held_what`` in a refusal, with ``advice``), each run
    needing a pass and a metric over its logits plus ``kept_per_row`` bytes; or by default as
    many as keep the logits under 256 MiB. ``read_one``: each run is unembedded at one position
    only (:func:`interp.engine.passes.forward_read`), so its logits are ``[d_vocab]``; the
    default then also allows as many as keep the pass's largest moment
    (:func:`estimate_forward_bytes`) under 256 MiB, where that is more, and keeps what is kept
    per row under 512 MiB. Callers that must
    refuse a budget before any run ask here first; raises
    :class:`interp.engine.MemoryBudgetError` when not even one run fits."""
    if max_rows is not None:
        return max_rows
    read = 1 if read_one else None
    if max_bytes is None:
        rows = max(1, LOGITS_BUDGET_BYTES // (n_pos * int(model.cfg.d_vocab) * 4))
        if read_one:  # no [pos d_vocab] logits: the pass's largest moment decides, if larger
            one = estimate_forward_bytes(model, (1, n_pos), read_positions=1)
            rows = max(rows, LOGITS_BUDGET_BYTES // one)
        if kept_per_row:
            rows = min(rows, max(1, KEPT_BUDGET_BYTES // kept_per_row))
        return rows
    budget = parse_size(max_bytes)
    if held >= budget:
        raise MemoryBudgetError(
            f"{held_what} alone needs {format_size(held)}, more than "
            f"max_bytes={format_size(budget)}; {advice}"
        )
    forward = max(
        estimate_forward_bytes(model, (1, n_pos), read_positions=read),
        estimate_loss_bytes(model, (1, read or n_pos)),
    )
    per_run = forward + kept_per_row
    least = held + per_run / _PLAN_SHARE
    if held and budget < least:
        raise MemoryBudgetError(
            f"{what} needs about {format_size(per_run)} for {n_pos} tokens on top of "
            f"{held_what} ({format_size(held)}), more than max_bytes={format_size(budget)} "
            f"allows (passes are planned to {_PLAN_SHARE:.0%} of what is left); raise max_bytes "
            f"to at least {format_size(least)}"
        )
    return rows_per_chunk(
        model,
        n_pos,
        budget - held,
        n_rows=n_rows,
        kept_per_row=kept_per_row,
        loss=True,
        what=what,
        read_positions=read,
    )


def task_blocks(
    model,
    n_pos: int,
    n_rows: int,
    n_runs: int,
    *,
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
    held: int = 0,
    held_what: str = "what the caller keeps",
    read_one: bool = False,
    kept_per_row: int = 0,
) -> tuple[int, int]:
    """``(runs, rows)`` per pass: all task rows and as many patched runs as fit (at least one),
    or one run over as many rows as fit. ``max_rows`` counts batch rows of a pass (runs x task
    rows); the budget is :func:`rows_per_pass`'s, with ``held`` off it
    (``read_one``: each row unembedded at one position; ``kept_per_row``: bytes a pass keeps
    per batch row beside it)."""
    size = rows_per_pass(
        model, n_pos, n_runs * n_rows, max_rows, max_bytes, held, held_what,
        kept_per_row=kept_per_row, read_one=read_one,
    )  # fmt: skip
    if size < n_rows:
        return 1, max(1, size)
    return max(1, min(n_runs, size // n_rows)), n_rows


def backward_rows(
    model,
    n_pos: int,
    *,
    n_rows: int,
    max_bytes: int | str | None,
    max_rows: int | None = None,
    held: int = 0,
    kept_per_row: int = 0,
    what: str = "one row's forward and backward pass",
) -> int:
    """Rows of ``n_pos`` tokens per forward and backward pass (gradients of a metric): at most
    ``max_rows``, all ``n_rows`` without a budget, or as many as fit ``max_bytes`` less
    ``held``, each needing :func:`estimate_attribution_bytes` plus ``kept_per_row``; raises
    :class:`MemoryBudgetError` (naming ``what``) when not even one row fits."""
    if max_rows is not None:
        return max(1, min(n_rows, max_rows))
    if max_bytes is None:
        return n_rows
    per_row = estimate_attribution_bytes(model, n_pos) + kept_per_row
    budget = parse_size(max_bytes)
    fit = (budget - held) // per_row
    if fit < 1:
        raise MemoryBudgetError(
            f"{what} needs about {format_size(per_row)} beside the {format_size(held)} held, "
            f"but max_bytes is {format_size(budget)}; raise max_bytes to at least "
            f"{format_size(held + per_row)}"
        )
    return int(min(n_rows, fit))
