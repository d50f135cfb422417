"""Many patched runs of one prompt, or of every row of a task, in batched forward passes.

:func:`run_patched` is the one runner every patching grid, ablation and circuit check is built
on. The base is a batch of rows ``[rows pos]`` (one prompt is one row; a task's rows are
right-padded), and each *patched run* is a set of interventions applied to every row, a
``patch`` taking row ``i``'s value from row ``i`` of its source. Patched runs are grouped by the
earliest layer they touch, ``L``: layers below ``L`` run once on the rows, and at
``blocks.L.hook_resid_pre`` the activation ``[rows pos d_model]`` is repeated to
``[runs * rows pos d_model]``, patched run ``p`` owning the block of rows
``p * rows ... (p + 1) * rows - 1``. So a patch at layer ``L`` never recomputes the layers below
it (GPT-2 small, 12 layers: about half the layer-passes of one forward per patch, as one batch
instead of ``12 x pos`` small ones; benchmarks/bench_patching.py). A pass holds all rows and as
many runs as fit, or, when not even one run over all rows fits, one run over a chunk of rows
(:func:`interp.engine.plan.task_blocks`).

A *metric* is any callable from logits ``[batch pos d_vocab]`` to one number per row
(:func:`per_row` checks it); over a task's rows a *row metric* ``(logits, rows)`` also gets the
task row of each batch row, so that each is read with its own answer. Given ``read_at`` (each
row's position to read), a pass computes the logits at that position of each row only,
``[batch d_vocab]`` (:func:`interp.engine.passes.forward_read`), and may start each run at its
first patched position (:mod:`interp.engine.suffix`); a model whose logits are not
``unembed(ln_final(resid))`` (checked on one row first) gets full logits, ``read_at`` or not.

A caller whose runs are not lists of interventions gives *pass hooks* instead
(:data:`PassHooks`): for each pass, the runs in it and the task rows it covers, it returns the
hooks that act on the pass's whole batch, run ``p``'s block of rows at its place. Such runs
start at the tokens, repeated once per run (some models' hooks take their shape from the batch
given: OPT's MLP output); circuit discovery's edge runs are built this way
(:mod:`interp.discovery.runs`, :mod:`interp.discovery.removal`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from interp.engine.batch_plan import check_limits, plan_passes, plan_reading, plan_sizes
from interp.engine.hooks import compile_hooks
from interp.engine.passes import (
    HookFn,
    forward,
    forward_read,
    masks_follow_rows,
)
from interp.engine.sites import Intervention
from interp.engine.suffix import (
    suffix_pass,
)
from interp.engine.tokens import PromptError, to_tokens

logger = logging.getLogger(__name__)

__all__ = [
    "run_patched",
    "per_row",
    "check_eval",
    "MetricFn",
    "RowMetricFn",
    "PassHooks",
    "TASK_KINDS",
]

# a metric: logits [batch pos d_vocab] -> one number per row [batch]
MetricFn = Callable[[Float[Tensor, "batch pos d_vocab"]], Float[Tensor, " batch"]]
# a row metric: (logits, the task row of each batch row) -> one value per batch row; the
# logits are [batch d_vocab] (already read) when run_patched was given read_at
RowMetricFn = Callable[
    [Float[Tensor, "batch pos d_vocab"] | Float[Tensor, "batch d_vocab"], Int[Tensor, " batch"]],
    Float[Tensor, " batch"],
]
# a caller's hooks for one pass: (the runs in it, in block order; the task rows it covers) ->
# hooks over its whole batch [runs * rows ...], run runs[b] owning rows b * rows ... (b + 1) * rows
PassHooks = Callable[[list[int], slice], list[tuple[str, HookFn]]]
# kinds that act on each of several rows as if it ran alone: a patch takes its row of the
# source, zero and noise are the same for every row; a mean or resample would mix the rows
TASK_KINDS = ("patch", "zero", "noise")


def per_row(
    metric: MetricFn, logits: Float[Tensor, "batch pos d_vocab"]
) -> Float[Tensor, " batch"]:
    """Call ``metric`` and check it gave one finite-typed number per row."""
    value = metric(logits)
    if not isinstance(value, Tensor):
        value = torch.as_tensor(value, dtype=torch.float32)
    if value.ndim == 0 and logits.shape[0] == 1:
        value = value[None]
    if value.ndim == 0:
        raise ValueError(
            f"the metric returned one number for a batch of {logits.shape[0]} patched runs, "
            "so their values cannot be told apart; return one value per batch row (e.g. "
            "lambda logits: logits[:, -1, answer] - logits[:, -1, wrong]), or pass the metric "
            "to patch_activations or path_patch, which read a batch-averaging metric row by row"
        )
    if value.shape != (logits.shape[0],):
        raise ValueError(
            f"a metric must return one value per batch row, shape "
            f"({logits.shape[0]},), got shape {tuple(value.shape)}; e.g. "
            "lambda logits: logits[:, -1, answer] - logits[:, -1, wrong]"
        )
    return value.float()


def check_eval(model) -> None:
    """Refuse a model in training mode: dropout would make every patched run differ by chance."""
    if model.training:
        raise ValueError(
            "the model is in training mode (dropout is active); call model.eval() before patching"
        )


def _block_hooks(
    start: int, n_rows: int, runs: Sequence[list[tuple[str, HookFn]]]
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
            # OPT's MLP flattens batch and position, and after the rows were repeated the
            # bridge no longer restores them: a view of the run-major [rows pos ...] blocks
            rows = act.view(n_runs * n_rows, -1, *act.shape[1:]) if act.ndim == 2 else act
            for p, fn in items:
                fn(rows[p * n_rows : (p + 1) * n_rows], hook)  # in place (see hooks._write)
            return act

        return hook

    return [(name, make(name, items)) for name, items in per_hook.items()]


def _for_rows(item: Intervention, lo: int, hi: int, n_rows: int) -> Intervention:
    """``item`` for rows ``lo:hi`` of ``n_rows``: a patch's source cut to those rows. One row
    takes every kind as it is (a mean or resample then mixes nothing)."""
    if n_rows == 1:
        return item
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


def _compiled(model, runs: Sequence[Sequence[Intervention]]) -> list[list[tuple[str, HookFn]]]:
    """Each run's hooks, compiled together (a source prompt shared by runs is run once)."""
    hooks = compile_hooks(model, [item for run in runs for item in run])
    at = [0]
    for run in runs:
        at.append(at[-1] + len(run))
    return [hooks[at[p] : at[p + 1]] for p in range(len(runs))]


def run_patched(
    model,
    prompt,
    rows: Sequence[Sequence[Intervention]],
    metric: MetricFn | None = None,
    *,
    row_metric: RowMetricFn | None = None,
    read_at: Int[Tensor, " task_rows"] | None = None,
    fixed: Sequence[Intervention | tuple[str, HookFn]] = (),
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
    held: int = 0,
    held_what: str = "what the caller keeps",
    progress: bool = False,
    pass_hooks: PassHooks | None = None,
    kept_per_row: int = 0,
) -> Float[Tensor, " rows"] | Float[Tensor, "rows task_rows"]:
    """``metric`` of ``prompt`` (one prompt) run once per row with that row's interventions;
    or, given ``row_metric`` instead, of every row of a task (``prompt``: its token ids
    ``[task_rows pos]``, right-padded) under each patched run: ``[rows task_rows]``.

    Entry ``[p]`` (``[p, i]``) equals, to float rounding, the prompt (task row ``i``) run alone
    with row ``p``'s interventions, its patches taking row ``i`` of their sources
    (tests/interventions/test_patching.py, tests/interventions/test_patching_tasks.py), but runs
    share forward passes:
    ``max_rows`` batch rows at most per pass (default: as many as keep the float32 logits under
    256 MiB), or as many as fit ``max_bytes`` (bytes or text such as ``"500MB"``: one pass's
    working memory and the metric over its logits, :func:`interp.engine.rows_per_chunk`; raises
    :class:`interp.engine.MemoryBudgetError` when not even one row fits). ``held``: bytes the
    caller keeps throughout (e.g. the source run's cache, named by ``held_what`` in a refusal),
    which come off ``max_bytes`` first. Pass one of ``max_rows`` and ``max_bytes``, not both;
    the numbers do not depend on the split. ``fixed`` interventions apply to every row before
    the row's own (e.g. a frozen LayerNorm scale, or the noise of causal tracing); they must
    broadcast over the batch. A ``mean`` without a source is each row's own mean, as if that row
    were run alone. Over several task rows interventions are ``patch`` (``source`` with one row
    per task row), ``zero`` or ``noise``; with ``read_at`` (row ``i``'s position to read, e.g.
    its last real token) the row metric gets ``[batch d_vocab]`` logits read there, or full
    logits where the model's cannot be read that way (module docstring; the numbers are the
    same, tests/engine/test_task_reading.py). ``pass_hooks`` (module docstring): each pass's
    hooks come from it, ``rows`` only counting the runs it reads (no ``read_at``);
    ``kept_per_row``: bytes its hooks keep per batch row, planned beside the pass.
    """
    tokens, row_metric = _tokens_and_metric(model, prompt, metric, row_metric, read_at)
    check_eval(model)
    check_limits(max_rows, max_bytes)
    n_rows, n_pos = (int(d) for d in tokens.shape)
    if pass_hooks is not None and read_at is not None:
        raise ValueError("pass_hooks runs every position; read_at is for runs of interventions")
    for run in rows if pass_hooks is None else ():  # refuse a bad run before any pass
        for item in run:
            _for_rows(item, 0, n_rows, n_rows)
    fixed_hooks = compile_hooks(model, fixed)
    read_at, offsets = plan_reading(model, tokens, rows, fixed_hooks, read_at)
    plan = dict(max_rows=max_rows, max_bytes=max_bytes, held_what=held_what)
    plan.update(read_one=read_at is not None, kept_per_row=kept_per_row)
    offsets, states, per_pass, rows_at_once = plan_sizes(model, tokens, rows, offsets, held, plan)
    passes = plan_passes(rows, offsets, n_rows, per_pass, rows_at_once, bool(pass_hooks))
    whole = None if pass_hooks or rows_at_once < n_rows else _compiled(model, rows)  # run once
    values = torch.full((len(rows), n_rows), float("nan"))
    for offset, start, lo, members in tqdm(
        passes, desc="patching", unit="pass", disable=not progress
    ):
        hi = min(lo + rows_at_once, n_rows)
        with masks_follow_rows(model):
            logits = _pass_logits(
                model, tokens, rows, (offset, start, lo, hi, members), fixed_hooks,
                states, read_at, whole, pass_hooks,
            )  # fmt: skip
        batch_rows = torch.arange(lo, hi).repeat(len(members))
        value = torch.as_tensor(row_metric(logits, batch_rows)).float()
        if value.shape != batch_rows.shape:
            raise ValueError(
                f"a row metric must return one value per batch row, shape "
                f"{tuple(batch_rows.shape)}, got shape {tuple(value.shape)}"
            )
        values[members, lo:hi] = value.reshape(len(members), hi - lo).cpu()
        del logits
    return values[:, 0] if metric is not None else values


def _pass_logits(model, tokens, rows, where, fixed_hooks, states, read_at, whole, pass_hooks):
    """The logits of one pass ``where`` = ``(offset, start layer, lo, hi, runs)``: a suffix
    pass, the caller's pass hooks over its rows, or the runs' interventions as blocks."""
    offset, start, lo, hi, members = where
    n_rows = int(tokens.shape[0])
    if pass_hooks is not None:  # the caller's runs are its own; pass_hooks cuts them
        hooks = fixed_hooks + pass_hooks(members, slice(lo, hi))
        return forward(model, tokens[lo:hi].repeat(len(members), 1), hooks)
    cut = [[_for_rows(item, lo, hi, n_rows) for item in rows[p]] for p in members]
    if offset:
        return suffix_pass(model, tokens, offset, cut, states, read_at, slice(lo, hi))
    compiled = _compiled(model, cut) if whole is None else [whole[p] for p in members]
    hooks = fixed_hooks + _block_hooks(start, hi - lo, compiled)
    return _dense_pass(model, tokens[lo:hi], hooks, read_at, lo, hi, len(members))


def _tokens_and_metric(model, prompt, metric, row_metric, read_at):
    """The base rows ``[rows pos]`` on the model's device, and a row metric (one prompt's
    ``metric`` becomes one, checked by :func:`per_row`)."""
    if (metric is None) == (row_metric is None):
        raise TypeError("pass metric (one prompt) or row_metric (a task's rows), one of them")
    if metric is None:
        tokens = torch.as_tensor(prompt).to(model.cfg.device)
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [rows pos], got shape {tuple(tokens.shape)}")
        return tokens, row_metric
    tokens = to_tokens(model, prompt).to(model.cfg.device)
    if tokens.shape[0] != 1:
        raise PromptError(f"run_patched runs one prompt, got a batch of {tokens.shape[0]}")
    if read_at is not None:
        raise ValueError("read_at is for a task's rows (row_metric); a metric reads its own")

    def one_prompt(logits, _rows):
        return per_row(metric, logits)

    return tokens, one_prompt


def _dense_pass(model, tokens, hooks, read_at, lo: int, hi: int, n_runs: int):
    """Logits of one dense pass over rows ``lo:hi`` repeated ``n_runs`` times: full, or read at
    each row's ``read_at``."""
    if read_at is None:
        return forward(model, tokens, hooks)
    return forward_read(model, tokens, hooks, read_at[lo:hi].repeat(n_runs))
