"""Many patched runs of one prompt in batched forward passes, planned under a budget.

:func:`run_patched` is the one engine every patching grid is built on. Each *row* is a set of
interventions applied to one run of the base prompt. Rows are grouped by the earliest layer
they touch, ``L``: layers below ``L`` run once on the single base prompt, and at
``blocks.L.hook_resid_pre`` the activation is expanded to one row per patched run, so a patch
at layer ``L`` never recomputes the layers below it (GPT-2 small, 12 layers: about half the
layer-passes of one forward per patch, and those as one batch instead of ``12 x pos`` small
ones; see benchmarks/bench_patching.py).

A *metric* is any callable from logits ``[batch pos d_vocab]`` to one number per row
(:func:`per_row` checks it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from interp.engine.estimates import (
    estimate_forward_bytes,
    estimate_loss_bytes,
    format_size,
    parse_size,
)
from interp.engine.hooks import compile_hooks
from interp.engine.passes import HookFn, forward
from interp.engine.plan import _PLAN_SHARE, MemoryBudgetError, rows_per_chunk
from interp.engine.sites import Intervention
from interp.engine.tokens import PromptError, to_tokens

__all__ = [
    "run_patched",
    "rows_per_pass",
    "per_row",
    "check_eval",
    "MetricFn",
    "LOGITS_BUDGET_BYTES",
]

# a metric: logits [batch pos d_vocab] -> one number per row [batch]
MetricFn = Callable[[Float[Tensor, "batch pos d_vocab"]], Float[Tensor, " batch"]]
# default rows per pass: the logits [rows pos d_vocab] are the largest tensor of a patched pass
LOGITS_BUDGET_BYTES = 256 * 2**20


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


def _start_layer(row: Sequence[Intervention]) -> int:
    return min((item.site.layer for item in row), default=0)


def _row_hooks(
    start: int,
    rows: Sequence[Sequence[int]],
    compiled: list[tuple[str, HookFn]],
) -> list[tuple[str, HookFn]]:
    """Hooks expanding the batch at ``start`` and applying row r's hooks to row r only."""
    expand_at = f"blocks.{start}.hook_resid_pre"
    per_hook: dict[str, list[tuple[int, HookFn]]] = {expand_at: []}
    for r, indices in enumerate(rows):
        for i in indices:
            name, fn = compiled[i]
            per_hook.setdefault(name, []).append((r, fn))
    n_rows = len(rows)

    def make(name: str, items: list[tuple[int, HookFn]]) -> HookFn:
        def hook(act: Tensor, hook) -> Tensor:
            if name == expand_at:
                act = act.expand(n_rows, *act.shape[1:]).clone()
            for r, fn in items:
                fn(act[r : r + 1], hook)  # writes into row r in place (see hooks._write)
            return act

        return hook

    return [(name, make(name, items)) for name, items in per_hook.items()]


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
    (:func:`estimate_forward_bytes`) under 256 MiB, where that is more. Callers that must
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


def run_patched(
    model,
    prompt,
    rows: Sequence[Sequence[Intervention]],
    metric: MetricFn,
    *,
    fixed: Sequence[Intervention | tuple[str, HookFn]] = (),
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
    held: int = 0,
    held_what: str = "what the caller keeps",
    progress: bool = False,
) -> Float[Tensor, " rows"]:
    """``metric`` of ``prompt`` (one prompt) run once per row with that row's interventions.

    Equal, to float rounding, to one ``run_cached(model, prompt, interventions=row)`` per row
    (tests/test_patching.py), but rows share forward passes: ``max_rows`` rows at most per pass
    (default: as many as keep the float32 logits under 256 MiB), or as many as fit
    ``max_bytes`` (bytes or text such as ``"500MB"``: one pass's working memory and the metric
    over its logits, :func:`interp.engine.rows_per_chunk`; raises
    :class:`interp.engine.MemoryBudgetError` when not even one row fits). ``held``: bytes the
    caller keeps throughout (e.g. the source run's cache, named by ``held_what`` in a refusal),
    which come off ``max_bytes`` first. Pass one of ``max_rows`` and ``max_bytes``, not both.
    ``fixed`` interventions apply to every row before the row's own (e.g. a frozen LayerNorm
    scale, or the noise of causal tracing); they must broadcast over the batch. A ``mean``
    without a source is each row's own mean, as if that row were run alone.
    """
    tokens = to_tokens(model, prompt).to(model.cfg.device)
    if tokens.shape[0] != 1:
        raise PromptError(f"run_patched runs one prompt, got a batch of {tokens.shape[0]}")
    check_eval(model)
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")
    if max_rows is not None and max_bytes is not None:
        raise ValueError(
            "pass max_rows (patched runs per pass) or max_bytes (a memory budget "
            "the runs per pass are planned from), not both"
        )
    size = rows_per_pass(
        model, int(tokens.shape[1]), len(rows), max_rows, max_bytes, held, held_what
    )
    flat = [item for row in rows for item in row]
    compiled = compile_hooks(model, flat)
    fixed_hooks = compile_hooks(model, fixed)
    index, at = [], 0
    for row in rows:
        index.append(list(range(at, at + len(row))))
        at += len(row)
    groups: dict[int, list[int]] = {}
    for r, row in enumerate(rows):
        groups.setdefault(_start_layer(row), []).append(r)
    chunks = [
        (start, members[i : i + size])
        for start, members in sorted(groups.items())
        for i in range(0, len(members), size)
    ]
    values = torch.full((len(rows),), float("nan"))
    for start, members in tqdm(chunks, desc="patching", unit="pass", disable=not progress):
        # fixed hooks first: a corruption at the hook a row patches is undone by the patch
        hooks = fixed_hooks + _row_hooks(start, [index[r] for r in members], compiled)
        logits = forward(model, tokens, hooks)
        values[members] = per_row(metric, logits).cpu()
        del logits
    return values
