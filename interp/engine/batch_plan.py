"""How :func:`interp.engine.run_patched` lays out its passes: the limits checked, where each
row is read and each run may start (:mod:`interp.engine.suffix`), the runs and rows a pass
holds (suffix passes beside the base run's keys and values where they fit), and the passes,
grouped by the layer or position their runs start from."""

from __future__ import annotations

import logging

import torch
from jaxtyping import Int
from torch import Tensor

from interp.engine.passes import reads_like_forward
from interp.engine.plan import MemoryBudgetError, task_blocks
from interp.engine.suffix import base_states, run_offset, state_bytes, suffix_like_forward
from interp.foundation.fallbacks import warn_fallback

__all__ = ["check_limits", "check_read_at", "plan_passes", "plan_reading", "plan_sizes"]

logger = logging.getLogger(__name__)


def check_read_at(read_at, n_rows: int, n_pos: int) -> Int[Tensor, " rows"]:
    """``read_at`` as one position per task row, each within the rows' ``n_pos``."""
    read_at = torch.as_tensor(read_at).long()
    if read_at.shape != (n_rows,):
        raise ValueError(
            f"read_at must have one position per task row ({n_rows}), got shape "
            f"{tuple(read_at.shape)}"
        )
    if n_rows and (int(read_at.min()) < 0 or int(read_at.max()) >= n_pos):
        raise ValueError(
            f"read_at must lie in [0, {n_pos - 1}] (the rows' positions), got "
            f"{int(read_at.min())} to {int(read_at.max())}"
        )
    return read_at


def check_limits(max_rows: int | None, max_bytes) -> None:
    """``max_rows`` at least 1, and not given with ``max_bytes``."""
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")
    if max_rows is not None and max_bytes is not None:
        raise ValueError(
            "pass max_rows (batch rows per pass) or max_bytes (a memory budget "
            "the rows per pass are planned from), not both"
        )


def plan_reading(model, tokens, rows, fixed_hooks, read_at):
    """``read_at`` checked, or None where the model's logits cannot be read at one position
    (checked on one row); and each run's first position (all 0: the dense passes)."""
    n_rows, n_pos = (int(d) for d in tokens.shape)
    if read_at is not None:  # checked on one row; the passes are planned for what is read
        read_at = check_read_at(read_at, n_rows, n_pos).to(model.cfg.device)
        names = [name for name, _ in fixed_hooks]
        names += [item.site.hook_name for run in rows for item in run]
        if not reads_like_forward(model, tokens, read_at, names):
            read_at = None
    offsets = [0] * len(rows)
    if read_at is not None and not fixed_hooks and rows:  # runs from their first position
        first = int(read_at.min())
        offsets = [min(run_offset(run, n_pos), first) for run in rows]
        if not any(offsets) or not suffix_like_forward(model, tokens, read_at):
            offsets = [0] * len(rows)
    return read_at, offsets


def plan_passes(rows, offsets, n_rows: int, per_pass: int, rows_at_once: int, from_tokens: bool):
    """``(offset, start layer, first task row, runs)`` of each pass: dense passes grouped by
    the earliest layer their runs touch (every run from the tokens with ``from_tokens``: the
    caller's pass hooks), suffix passes by their first position."""
    groups: dict[tuple[int, int], list[int]] = {}
    layers = [
        0 if from_tokens else min((item.site.layer for item in run), default=0) for run in rows
    ]
    for p in sorted(range(len(rows)), key=lambda p: layers[p]):
        # dense passes: one start layer each; suffix passes: one offset, rows join as they start
        groups.setdefault((offsets[p], 0 if offsets[p] else layers[p]), []).append(p)
    return [
        (offset, start, lo, members[i : i + per_pass])
        for (offset, start), members in sorted(groups.items())
        for lo in range(0, n_rows, rows_at_once)
        for i in range(0, len(members), per_pass)
    ]


def plan_sizes(model, tokens, rows, offsets, held: int, plan: dict):
    """Runs per pass and task rows per pass; suffix passes hold the base run's keys and values
    beside them, or, where those do not fit, every run goes back to the dense passes."""
    n_rows, n_pos = (int(d) for d in tokens.shape)
    if any(offsets):
        try:
            kept = held + state_bytes(model, n_rows, n_pos)
            per_pass, rows_at_once = task_blocks(model, n_pos, n_rows, len(rows), held=kept, **plan)
        except MemoryBudgetError:  # the base run's states do not fit: the dense passes
            offsets = [0] * len(rows)
            warn_fallback(
                logger,
                "suffix_pass:budget",
                "the base run's keys and values do not fit max_bytes beside the patched runs: "
                "running every position (the dense passes, slower) instead of suffix_pass",
            )
        else:
            return offsets, base_states(model, tokens), per_pass, rows_at_once
    per_pass, rows_at_once = task_blocks(model, n_pos, n_rows, len(rows), held=held, **plan)
    return offsets, None, per_pass, rows_at_once
