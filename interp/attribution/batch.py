"""Direct logit attribution over a batch of prompts, in chunks that fit a memory budget.

:func:`logit_attribution_batch` gives, for every prompt, exactly the rows
:func:`interp.logit_attribution` gives for it alone (tests/test_memory_budgets.py), each checked
by the same identity (the prompt's rows add up to its real logit or logit difference), but
folds the model once and runs the prompts in batched forward passes: prompts of one token
length share passes, as many rows per pass as fit ``max_bytes``
(:func:`interp.engine.rows_per_chunk`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch

from interp.attribution.core import _attribute, _position, _single_prompt, _target
from interp.attribution.residual import final_hooks, final_logits, parts_hooks, residual_parts
from interp.engine import Prompt, estimate_cache_bytes, row_chunks, run_cached, to_tokens
from interp.models.layernorm import fold_layernorm, is_folded

__all__ = ["logit_attribution_batch"]


def _per_prompt(value, n: int, what: str) -> list:
    """One value per prompt: a single token for all, or a sequence of ``n``."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, (str, int)) or value is None or not isinstance(value, Sequence):
        return [value] * n
    values = list(value)
    if len(values) != n:
        raise ValueError(
            f"pass one {what} for all prompts or one per prompt: got {len(values)} "
            f"{what}s for {n} prompts"
        )
    return values


def _prompt_list(model, prompts) -> list[torch.Tensor]:
    if isinstance(prompts, torch.Tensor):
        tokens = to_tokens(model, prompts)
        return [tokens[i : i + 1] for i in range(tokens.shape[0])]
    if isinstance(prompts, str):
        raise ValueError(
            "pass a list of prompts (one string is one prompt: use "
            "interp.logit_attribution, or wrap it in a list)"
        )
    return [_single_prompt(model, prompt) for prompt in prompts]


def _bytes_per_row(model, folded, n_pos: int, neurons: bool) -> int:
    """What one row of a pass keeps: the folded run's cache, and the unfolded run's logits."""
    kept = estimate_cache_bytes(
        folded, (1, n_pos), head_outputs=True, hooks=parts_hooks(folded, neurons=neurons)
    )
    if folded is not model:
        kept += estimate_cache_bytes(model, (1, n_pos), hooks=final_hooks(model))
    return kept


def logit_attribution_batch(
    model,
    prompts: Sequence[Prompt] | torch.Tensor,
    answers,
    *,
    wrong=None,
    pos: int = -1,
    neurons: bool = False,
    max_bytes: int | str | None = None,
) -> pd.DataFrame:
    """:func:`interp.logit_attribution` of every prompt, in batched passes under a budget.

    Args:
        prompts: a list of prompts (text or token ids), or a token tensor ``[batch pos]``.
            Prompts may differ in length: each length runs in its own passes (no padding).
        answers: one answer token for all prompts, or one per prompt (text or ids).
        wrong: as ``answers``, for the logit difference ``answer - wrong``; None for the logit.
        pos: the position explained in every prompt (default the last).
        neurons: split each MLP row into neurons (see :func:`interp.logit_attribution`).
        max_bytes: a memory budget for the forward passes (bytes or text such as ``"500MB"``);
            the folded copy of the model made once at the start is not counted. Raises
            :class:`interp.engine.MemoryBudgetError` when not even one prompt fits.

    Returns:
        ``logit_attribution``'s columns after a ``prompt`` column (the prompt's index in
        ``prompts``), the prompts' rows one after another. ``attrs["prompts"]`` holds each
        prompt's ``attrs`` (reference, identity error, tokens...), in order.
    """
    tokens = _prompt_list(model, prompts)
    if not tokens:
        raise ValueError("pass at least one prompt")
    n = len(tokens)
    targets = [
        _target(model, a, w)
        for a, w in zip(
            _per_prompt(answers, n, "answer"), _per_prompt(wrong, n, "wrong token"), strict=True
        )
    ]
    folded = model if is_folded(model) else fold_layernorm(model)
    by_length: dict[int, list[int]] = {}
    for i, row in enumerate(tokens):
        by_length.setdefault(int(row.shape[1]), []).append(i)
    frames: dict[int, pd.DataFrame] = {}
    for n_pos, members in by_length.items():
        position = _position(pos, n_pos)
        kept = 0 if max_bytes is None else _bytes_per_row(model, folded, n_pos, neurons)
        for rows in row_chunks(
            folded, len(members), n_pos, max_bytes, kept_per_row=kept, what="logit attribution"
        ):
            chunk = members[rows]
            batch = torch.cat([tokens[i] for i in chunk]).to(folded.cfg.device)
            run = run_cached(
                folded, batch, head_outputs=True, hooks=parts_hooks(folded, neurons=neurons)
            )
            reference = (
                None if folded is model else run_cached(model, batch, hooks=final_hooks(model))
            )
            for row, i in enumerate(chunk):
                parts = residual_parts(folded, None, position, neurons=neurons, run=run, row=row)
                logits = (
                    None
                    if reference is None
                    else final_logits(model, None, position, run=reference, row=row)[0]
                )
                frames[i] = _attribute(
                    model, folded, tokens[i], targets[i], position, parts, logits, neurons
                )
            del run, reference
    frame = pd.concat([frames[i].assign(prompt=i) for i in range(n)], ignore_index=True)
    frame = frame[["prompt", *frames[0].columns]]
    frame.attrs = {"prompts": [frames[i].attrs for i in range(n)]}
    return frame
