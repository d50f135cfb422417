"""Many patched runs of every row of a task in batched forward passes, planned under a budget.

:func:`run_patched_task` is :func:`interp.engine.batched.run_patched` along a second axis: the
base batch is a task's rows ``[rows pos]`` (right-padded), and each *patched run* is a set of
interventions applied to every row, a ``patch`` taking row ``i``'s value from row ``i`` of its
source. Patched runs are grouped by the earliest layer they touch, ``L``; layers below ``L`` run
once on the rows, and at ``blocks.L.hook_resid_pre`` the activation ``[rows pos d_model]`` is
repeated to ``[runs * rows pos d_model]``, patched run ``p`` owning the block of rows
``p * rows ... (p + 1) * rows - 1``. A pass holds all rows and as many runs as fit, or, when not
even one run over all rows fits, one run over a chunk of rows (:func:`rows_per_pass`).

A *row metric* is a callable ``(logits [batch pos d_vocab], rows [batch]) -> [batch]``: ``rows``
says which task row each batch row is, so that each is read with its own answer and at its own
last real token. Given ``read_at`` (each row's position to read), a pass computes the logits at
that position of each row only, ``[batch d_vocab]``, and the metric receives those
(:func:`interp.engine.passes.forward_read`): the unembedding of every other position is never
computed. A model whose logits are not ``unembed(ln_final(resid))`` (checked on one row before
the passes) gets full logits, ``read_at`` or not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from interp.engine.batched import check_eval, rows_per_pass
from interp.engine.hooks import compile_hooks
from interp.engine.passes import HookFn, forward, forward_read, reads_like_forward
from interp.engine.plan import MemoryBudgetError
from interp.engine.sites import Intervention
from interp.engine.suffix import (
    base_states,
    run_offset,
    state_bytes,
    suffix_like_forward,
    suffix_pass,
)

__all__ = ["run_patched_task", "task_blocks", "RowMetricFn", "TASK_KINDS"]

# a row metric: (logits, the task row of each batch row) -> one value per batch row; the
# logits are [batch d_vocab] (already read) when run_patched_task was given read_at
RowMetricFn = Callable[
    [Float[Tensor, "batch pos d_vocab"] | Float[Tensor, "batch d_vocab"], Int[Tensor, " batch"]],
    Float[Tensor, " batch"],
]
# kinds that act on each task row as if it ran alone: a patch takes its row of the source,
# zero and noise are the same for every row; a mean or resample would mix the rows of a block
TASK_KINDS = ("patch", "zero", "noise")


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
) -> tuple[int, int]:
    """``(runs, rows)`` per pass: all task rows and as many patched runs as fit (at least one),
    or one run over as many rows as fit. ``max_rows`` counts batch rows of a pass (runs x task
    rows); the budget is :func:`interp.engine.batched.rows_per_pass`'s, with ``held`` off it
    (``read_one``: each row unembedded at one position)."""
    size = rows_per_pass(
        model, n_pos, n_runs * n_rows, max_rows, max_bytes, held, held_what, read_one=read_one
    )
    if size < n_rows:
        return 1, max(1, size)
    return max(1, min(n_runs, size // n_rows)), n_rows


def _repeat_mask(module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Repeat an attention mask made for the rows ``[rows 1 q_pos k_pos]`` to the repeated
    batch ``[runs * rows ...]`` (run-major, as the rows were), so each row keeps its own."""
    mask = kwargs.get("attention_mask")
    hidden = args[0] if args else kwargs.get("hidden_states")
    if not isinstance(mask, Tensor) or not isinstance(hidden, Tensor) or mask.ndim < 3:
        return None
    rows, batch = mask.shape[0], hidden.shape[0]
    if rows in (1, batch) or batch % rows:
        return None
    return args, {**kwargs, "attention_mask": mask.repeat(batch // rows, *[1] * (mask.ndim - 1))}


@contextmanager
def _masks_follow_rows(model) -> Iterator[None]:
    """While the block is open, attention masks follow the rows when a hook repeats them: the
    model builds its (causal) mask for the batch it was given, ``[rows ...]``, which does not
    broadcast over ``[runs * rows ...]`` once ``rows > 1``."""
    handles = [
        block.attn.register_forward_pre_hook(_repeat_mask, with_kwargs=True)
        for block in model.blocks
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _block_hooks(
    start: int,
    n_rows: int,
    runs: Sequence[list[tuple[str, HookFn]]],
) -> list[tuple[str, HookFn]]:
    """Hooks repeating the rows at ``start`` once per run and applying run p's hooks to its
    block of rows only."""
    expand_at = f"blocks.{start}.hook_resid_pre"
    per_hook: dict[str, list[tuple[int, HookFn]]] = {expand_at: []}
    for p, hooks in enumerate(runs):
        for name, fn in hooks:
            per_hook.setdefault(name, []).append((p, fn))
    n_runs = len(runs)

    def make(name: str, items: list[tuple[int, HookFn]]) -> HookFn:
        def hook(act: Tensor, hook) -> Tensor:
            if name == expand_at:
                act = act.repeat(n_runs, *([1] * (act.ndim - 1)))  # run-major blocks of rows
            for p, fn in items:
                fn(act[p * n_rows : (p + 1) * n_rows], hook)  # in place (see hooks._write)
            return act

        return hook

    return [(name, make(name, items)) for name, items in per_hook.items()]


def _for_rows(item: Intervention, lo: int, hi: int, n_rows: int) -> Intervention:
    """``item`` for task rows ``lo:hi``: a patch's source cut to those rows."""
    if item.kind not in TASK_KINDS:
        raise ValueError(
            f"{item}: over a task's rows an intervention is one of {', '.join(TASK_KINDS)}; "
            f"a {item.kind} would mix the rows of a pass"
        )
    if item.kind != "patch":
        return item
    if item.source.shape[0] != n_rows:
        raise ValueError(
            f"{item}: a patch over a task needs a source with one row per task row "
            f"({n_rows}), got {item.source.shape[0]}"
        )
    return replace(item, source=item.source[lo:hi])


def _check_read_at(read_at, n_rows: int, n_pos: int) -> Int[Tensor, " rows"]:
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


def _hooks(model, start: int, n_rows: int, runs, fixed_hooks) -> list[tuple[str, HookFn]]:
    """The fixed hooks, then each run's in its block of ``n_rows`` rows repeated at ``start``."""
    return fixed_hooks + _block_hooks(start, n_rows, [compile_hooks(model, run) for run in runs])


def run_patched_task(
    model,
    tokens: Int[Tensor, "rows pos"],
    runs: Sequence[Sequence[Intervention]],
    metric: RowMetricFn,
    *,
    read_at: Int[Tensor, " rows"] | None = None,
    fixed: Sequence[Intervention | tuple[str, HookFn]] = (),
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
    held: int = 0,
    held_what: str = "what the caller keeps",
    progress: bool = False,
) -> Float[Tensor, "runs rows"]:
    """``metric`` of every task row (``tokens``, right-padded) under each patched run.

    Entry ``[p, i]`` equals, to float rounding, row ``i`` run alone with run ``p``'s
    interventions, its patches taking row ``i`` of their sources (tests/test_patching_tasks.py).
    Interventions are ``patch`` (``source`` with one row per task row), ``zero`` or ``noise``.
    ``max_rows`` bounds the batch rows of one pass (runs x task rows); ``max_bytes`` is planned
    as :func:`interp.engine.batched.run_patched` plans it, less ``held``; the numbers do not
    depend on the split. ``fixed`` interventions apply to every run and must broadcast over the
    batch (one row, or none: the same for every row). With ``read_at`` (row ``i``'s position to
    read, e.g. its last real token) the metric gets ``[batch d_vocab]`` logits read there, or,
    when the model's logits cannot be read that way, full logits (module docstring); the
    numbers are the same (tests/test_task_reading.py).
    """
    check_eval(model)
    tokens = torch.as_tensor(tokens).to(model.cfg.device)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [rows pos], got shape {tuple(tokens.shape)}")
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")
    if max_rows is not None and max_bytes is not None:
        raise ValueError(
            "pass max_rows (batch rows per pass) or max_bytes (a memory budget "
            "the rows per pass are planned from), not both"
        )
    n_rows, n_pos = (int(d) for d in tokens.shape)
    for run in runs:  # refuse a bad run before any pass
        for item in run:
            _for_rows(item, 0, n_rows, n_rows)
    fixed_hooks = compile_hooks(model, fixed)
    if read_at is not None:  # checked on one row; the passes are planned for what is read
        read_at = _check_read_at(read_at, n_rows, n_pos).to(model.cfg.device)
        names = [name for name, _ in fixed_hooks]
        names += [item.site.hook_name for run in runs for item in run]
        if not reads_like_forward(model, tokens, read_at, names):
            read_at = None
    offsets, states = [0] * len(runs), None
    if read_at is not None and not fixed_hooks and runs:  # runs from their first position
        first = int(read_at.min())
        offsets = [min(run_offset(run, n_pos), first) for run in runs]
        if not any(offsets) or not suffix_like_forward(model, tokens, read_at):
            offsets = [0] * len(runs)
    plan = dict(max_rows=max_rows, max_bytes=max_bytes, held_what=held_what)
    plan.update(read_one=read_at is not None)
    if any(offsets):
        try:
            kept = held + state_bytes(model, n_rows, n_pos)
            per_pass, rows_at_once = task_blocks(model, n_pos, n_rows, len(runs), held=kept, **plan)
        except MemoryBudgetError:  # the base run's states do not fit: the dense passes
            offsets = [0] * len(runs)
    if any(offsets):
        states = base_states(model, tokens)
    else:
        per_pass, rows_at_once = task_blocks(model, n_pos, n_rows, len(runs), held=held, **plan)
    groups: dict[tuple[int, int], list[int]] = {}
    layers = [min((item.site.layer for item in run), default=0) for run in runs]
    for p in sorted(range(len(runs)), key=lambda p: layers[p]):
        # dense passes: one start layer each; suffix passes: one offset, rows join as they start
        groups.setdefault((offsets[p], 0 if offsets[p] else layers[p]), []).append(p)
    passes = [
        (offset, start, lo, members[i : i + per_pass])
        for (offset, start), members in sorted(groups.items())
        for lo in range(0, n_rows, rows_at_once)
        for i in range(0, len(members), per_pass)
    ]
    values = torch.full((len(runs), n_rows), float("nan"))
    for offset, start, lo, members in tqdm(
        passes, desc="patching", unit="pass", disable=not progress
    ):
        hi = min(lo + rows_at_once, n_rows)
        cut = [[_for_rows(item, lo, hi, n_rows) for item in runs[p]] for p in members]
        with _masks_follow_rows(model):
            if offset:
                logits = suffix_pass(model, tokens, offset, cut, states, read_at, slice(lo, hi))
            else:
                hooks = _hooks(model, start, hi - lo, cut, fixed_hooks)
                if read_at is None:
                    logits = forward(model, tokens[lo:hi], hooks)
                else:
                    at = read_at[lo:hi].repeat(len(members))
                    logits = forward_read(model, tokens[lo:hi], hooks, at)
        rows = torch.arange(lo, hi).repeat(len(members))
        value = torch.as_tensor(metric(logits, rows)).float()
        if value.shape != rows.shape:
            raise ValueError(
                f"a row metric must return one value per batch row, shape {tuple(rows.shape)}, "
                f"got shape {tuple(value.shape)}"
            )
        values[members, lo:hi] = value.reshape(len(members), hi - lo).cpu()
        del logits
    return values
