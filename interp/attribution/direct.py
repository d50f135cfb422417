"""Direct logit attribution and the logit lens, as exact decompositions.

**Direct logit attribution.** The final residual stream ``x`` at the answer position is a sum of
what each component wrote (:mod:`interp.attribution.residual`): the token (and positional)
embedding, every attention head (``z @ W_O``, per query head), each layer's attention bias
``b_O``, and each MLP. The final norm divides the stream by one scale ``s`` per position;
*freezing* that scale at its value in the run makes the logit linear in the components. With
LayerNorm (which centres)::

    logit[t] = sum_c (c - mean(c)) / s · W_U[:, t]  +  b_U[t]  (+ mean_logit)

and with RMSNorm (Llama, Qwen, Mistral, Gemma: no centring, so no mean is taken anywhere)::

    logit[t] = sum_c c / s · W_U[:, t]  +  b_U[t]

This is exact only once the final norm's weight (and LayerNorm's bias) are folded into
``W_U``/``b_U`` (TransformerLens's ``logit_attrs`` on an unfolded model silently drops them), so
it is computed on the copy :func:`interp.models.layernorm.fold_layernorm` returns. For LayerNorm
models that copy's unembedding is centred, which lowers every logit at a position by their mean
over the vocabulary; for a single logit that mean is added back as the named term
``mean_logit`` so that ``total`` equals the ORIGINAL model's logit. For a logit difference it
cancels and is left out.

Gemma 2 soft-caps its logits (``cap * tanh(logit / cap)``), which is not linear: the rows
decompose the logit *before* the cap, and the result says so (``df.attrs["note"]``).

Every result is checked before it is returned: the rows must add up to the logit (difference)
the models really produce, or :class:`AttributionError` is raised.

Every door here is thin: one prompt is one row, a batch a row per prompt, a task a row per task
row, and all of them run through :func:`interp.attribution.rows.attribute_rows`. A prompt alone
and the same prompt as a task's only row are the same operations, so the same numbers to the
bit; in a pass shared with other prompts of its length, the same up to the batched matmuls'
float32 rounding (tests/engine/test_memory_budgets.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import torch

from interp.attribution.core import (
    COMPONENTS,
    TokenError,
    _position,
    _single_prompt,
    _target,
)
from interp.attribution.residual import AttributionError
from interp.attribution.rows import Row, attribute_rows
from interp.engine import Prompt, resolve_token, to_tokens
from interp.tasks import Task, TaskTokens

__all__ = [
    "AttributionError",
    "TokenError",
    "COMPONENTS",
    "heads_table",
    "logit_attribution",
    "logit_attribution_batch",
    "resolve_token",
    "task_attribution",
    "top_contributors",
]

_KEYS = ["component", "layer", "head", "neuron"]  # what a table row is, "neuron" if present


def logit_attribution(
    model,
    prompt: Prompt | Task | TaskTokens,
    answer: str | int | None = None,
    *,
    wrong: str | int | None = None,
    pos: int = -1,
    neurons: bool = False,
    per_row: bool = False,
) -> pd.DataFrame:
    """Direct logit attribution of the ``answer`` logit (or ``answer - wrong``) at ``pos``.

    ``logit_attribution(model, task)`` attributes every row of an :class:`interp.Task` to its
    own answer minus its own wrong token at its own last real token, and returns the mean over
    rows with ``contribution_sem`` (``per_row=True``: each row's table under a ``row`` column);
    see :func:`task_attribution`.

    Args:
        model: a TransformerBridge with LayerNorm or RMSNorm. An unfolded model is folded into a
            copy here (:func:`interp.models.layernorm.fold_layernorm`) and its own logits are the
            reference the rows must add up to; pass an already folded model to fold once for
            many calls.
        prompt: one prompt (text or token ids), tokenised like ``interp.run_cached``.
        answer: the token whose logit is decomposed: single-token text or a token id.
        wrong: a counterfactual token; the logit difference ``answer - wrong`` is decomposed.
        pos: the position whose prediction is explained (default the last).
        neurons: split each MLP row into one row per neuron plus ``mlp_bias``.

    Returns:
        DataFrame with columns ``component, layer, head, contribution`` (plus ``neuron`` when
        ``neurons``); ``layer``/``head``/``neuron`` are nullable integers, missing where they do
        not apply. Rows: ``embed`` (Gemma: the embedding times sqrt(d_model), as the model adds
        it), ``pos_embed`` (learned positions only), per layer every ``head`` (query heads),
        ``attn_bias`` (``b_O``, which holds the folded value biases; absent in models without
        one) and ``mlp`` (or ``neuron`` rows and ``mlp_bias``); then ``unembed_bias``,
        ``mean_logit`` (single logit of a LayerNorm model only; see the module docstring) and
        ``total``, which equals the original model's logit (difference), before the soft-cap
        for soft-capped models. ``df.attrs`` records the tokens, the position, the reference
        value and what it is (``reference_is``), the measured identity error, the model's
        ``normalization``, its ``soft_cap`` (None if none), its ``output`` (the logit or
        difference after the cap; equal to the reference without one) and a ``note`` (None, or
        why the reference is not the model's output).

    Raises:
        TokenError: ``answer``/``wrong`` is not a single token.
        AttributionError: the rows do not add up to the model's logit.
        interp.models.layernorm.FoldError: the model cannot be folded.
    """
    if isinstance(prompt, (Task, TaskTokens)):
        if answer is not None or wrong is not None or pos != -1:
            raise ValueError(
                "a task carries each row's answer and wrong token, read at its last real "
                "token: call logit_attribution(model, task) without answer, wrong or pos"
            )
        return task_attribution(model, prompt, per_row=per_row, neurons=neurons)
    if per_row:
        raise ValueError("per_row=True is for a task; one prompt has one row")
    if answer is None:
        raise TypeError("logit_attribution needs an answer token for a prompt (or pass a Task)")
    tokens = _single_prompt(model, prompt)
    target = _target(model, answer, wrong)
    _position(pos, tokens.shape[1])  # refused before the model is folded
    return attribute_rows(model, [Row(tokens, target, pos)], neurons=neurons)[0]


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
    """:func:`interp.logit_attribution` of every prompt, in batched passes under a budget:
    each prompt's rows are exactly what it gets alone, checked by the same identity.

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
    pairs = zip(
        _per_prompt(answers, n, "answer"), _per_prompt(wrong, n, "wrong token"), strict=True
    )
    rows = [Row(t, _target(model, a, w), pos) for t, (a, w) in zip(tokens, pairs, strict=True)]
    frames = attribute_rows(model, rows, neurons=neurons, max_bytes=max_bytes)
    frame = pd.concat([f.assign(prompt=i) for i, f in enumerate(frames)], ignore_index=True)
    frame = frame[["prompt", *frames[0].columns]]
    frame.attrs = {"prompts": [f.attrs for f in frames]}
    return frame


def _single(sets, what: str) -> list[int]:
    for i, ids in enumerate(sets):
        if len(ids) != 1:
            raise ValueError(
                f"row {i + 1}: the {what} is a list of {len(ids)} tokens; logit attribution "
                "decomposes one logit (difference), so each row needs a single answer and "
                "wrong token"
            )
    return [int(ids[0]) for ids in sets]


def task_attribution(
    model,
    task: Task | TaskTokens,
    *,
    per_row: bool = False,
    neurons: bool = False,
    max_bytes: int | str | None = None,
) -> pd.DataFrame:
    """Mean direct logit attribution over ``task``'s rows.

    Row ``i`` is attributed as its clean prompt alone, read at its last real token for its own
    answer (minus its own wrong token): its components ``a_ic`` add up to that row's logit
    (difference). The table holds ``contribution = mean_i a_ic`` and its standard error
    ``contribution_sem = std_i(a_ic) / sqrt(n)`` (NaN for one row); ``total`` is then the mean
    logit (difference). Answers given as lists of tokens (greater-than's sets) are not one
    logit: they are refused.

    Returns :func:`interp.logit_attribution`'s columns, ``contribution`` the mean over rows,
    and ``contribution_sem``; with ``per_row`` a ``row`` column first and one table per row.
    ``attrs``: ``n_rows``, ``reference_rows`` (each row's own logit difference, what its rows
    add up to), ``rows`` (each row's ``logit_attribution`` attrs).
    """
    batch = task.tokens(model) if isinstance(task, Task) else task
    answers = _single(batch.answers, "answer")
    wrong = None if batch.wrong is None else _single(batch.wrong, "wrong token")
    prompts = [batch.clean[i : i + 1, : int(n)] for i, n in enumerate(batch.lengths.tolist())]
    frame = logit_attribution_batch(
        model, prompts, answers, wrong=wrong, neurons=neurons, max_bytes=max_bytes
    )
    rows_attrs = frame.attrs["prompts"]
    frame = frame.rename(columns={"prompt": "row"})
    attrs = dict(
        n_rows=len(prompts),
        reference_rows=[a["reference"] for a in rows_attrs],
        rows=rows_attrs,
    )
    if per_row:
        frame.attrs = attrs
        return frame
    n = len(prompts)
    keys = [k for k in _KEYS if k in frame.columns]
    first = frame[frame["row"] == 0][keys].reset_index(drop=True)
    values = torch.tensor(frame["contribution"].to_numpy(dtype=float)).reshape(n, -1)
    first["contribution"] = values.mean(dim=0).numpy()
    first["contribution_sem"] = (values.std(dim=0) / math.sqrt(n)).numpy() if n > 1 else math.nan
    first.attrs = attrs
    return first


def top_contributors(frame: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The ``n`` rows with the largest absolute contribution, ``total`` excluded."""
    rows = frame[frame["component"] != "total"]
    order = rows["contribution"].abs().sort_values(ascending=False).index
    return rows.loc[order[:n]].reset_index(drop=True)


def heads_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The ``head`` rows as ``layer, head, contribution`` (for a head heatmap)."""
    heads = frame[frame["component"] == "head"]
    return (
        heads[["layer", "head", "contribution"]]
        .astype({"layer": int, "head": int})
        .reset_index(drop=True)
    )
