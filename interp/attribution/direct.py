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

**Logit lens.** The accumulated residual stream after the embeddings and after each block is read
through the model's own final norm (statistics recomputed for each layer), unembedding and
soft-cap; the last row is the model's output, which is checked.
"""

from __future__ import annotations

import pandas as pd
import torch

from interp.attribution.batch import logit_attribution_batch
from interp.attribution.core import (
    COMPONENTS,
    IDENTITY_ATOL,
    IDENTITY_RTOL,
    TokenError,
    _attribute,
    _decode,
    _position,
    _single_prompt,
    _target,
    resolve_token,
)
from interp.attribution.residual import AttributionError, final_logits, residual_parts
from interp.attribution.task import task_attribution
from interp.engine import Prompt, run_cached
from interp.models.layernorm import fold_layernorm, is_folded
from interp.models.norms import param, soft_cap
from interp.models.offload import materialized
from interp.tasks import Task, TaskTokens

__all__ = [
    "AttributionError",
    "TokenError",
    "COMPONENTS",
    "heads_table",
    "logit_attribution",
    "logit_attribution_batch",
    "logit_lens",
    "resolve_token",
    "top_contributors",
]


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
    see :mod:`interp.attribution.task`.

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
    position = _position(pos, tokens.shape[1])
    folded = model if is_folded(model) else fold_layernorm(model)
    parts = residual_parts(folded, tokens, position, neurons=neurons)
    reference = None if folded is model else final_logits(model, tokens, position)[0]
    return _attribute(model, folded, tokens, target, position, parts, reference, neurons)


def top_contributors(frame: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The ``n`` rows with the largest absolute contribution, ``total`` excluded."""
    rows = frame[frame["component"] != "total"]
    order = rows["contribution"].abs().sort_values(ascending=False).index
    return rows.loc[order[:n]].reset_index(drop=True)


def logit_lens(
    model,
    prompt: Prompt,
    answer: str | int | None = None,
    *,
    wrong: str | int | None = None,
    pos: int = -1,
    k: int = 5,
) -> pd.DataFrame:
    """Read the residual stream after the embeddings and after each block as if it were final.

    Each state is passed through the model's own final norm (LayerNorm or RMSNorm, its
    statistics recomputed for that state, as the model would), unembedding and, for soft-capped
    models (Gemma 2), the soft-cap: every row is what the model would output if it stopped
    there. Use the unfolded model to read the model's own logits; on a folded LayerNorm model
    with a centred unembedding logits are lower by their mean over the vocabulary,
    probabilities the same.

    Returns:
        DataFrame, one row per state: ``layer`` (blocks applied: 0 is the embeddings,
        ``n_layers`` the model's output), ``label`` (``embed``, ``L0``, ...), when ``answer`` is
        given ``answer_logit, answer_prob, answer_rank`` (0 = top), when ``wrong`` is given also
        ``wrong_logit, wrong_prob, logit_diff``, then ``top1_token, top1_id, top1_prob`` ... up to
        ``k``. The last row is checked against the model's logits.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    tokens = _single_prompt(model, prompt)
    answer_id = None if answer is None else resolve_token(model, answer)
    if wrong is not None and answer_id is None:
        raise ValueError("a wrong token needs an answer to compare with")
    wrong_id = None if wrong is None else resolve_token(model, wrong, role="wrong answer")
    position = _position(pos, tokens.shape[1])
    n_layers = int(model.cfg.n_layers)
    run = run_cached(model, tokens, resid=("post",), hooks=["blocks.0.hook_resid_pre"])
    states = torch.cat(
        [run["blocks.0.hook_resid_pre"][:, position], run.resid("post")[:, 0, position]]
    )  # [layer+1 d_model]
    # offloaded final norm and unembedding: load their weights while they are read
    with (
        torch.inference_mode(),
        materialized(model, model.ln_final),
        materialized(model, model.unembed),
    ):
        normed = model.ln_final(states[None])[0]
        logits = normed.double() @ model.W_U.detach().double()
        b_U = param(model, "b_U")
    logits = logits if b_U is None else logits + b_U.to(logits.device)
    cap = soft_cap(model)
    if cap is not None:
        logits = cap * torch.tanh(logits / cap)
    real = run.logits[0, position].double()
    error = float((logits[-1] - real).abs().max())
    bound = IDENTITY_ATOL + IDENTITY_RTOL * float(real.abs().max())
    if not error <= bound:
        raise AttributionError(
            f"the logit lens's last row differs from the model's logits by "
            f"{error:.3g} (> {bound:.3g}): this model's output is not "
            "final norm then unembedding, so the lens would mislead"
        )
    log_probs = logits.log_softmax(-1)
    probs = log_probs.exp()
    frame = pd.DataFrame(
        {
            "layer": range(n_layers + 1),
            "label": ["embed"] + [f"L{layer}" for layer in range(n_layers)],
        }
    )
    if answer_id is not None:
        frame["answer_logit"] = logits[:, answer_id].tolist()
        frame["answer_prob"] = probs[:, answer_id].tolist()
        frame["answer_rank"] = (logits > logits[:, answer_id, None]).sum(-1).tolist()
    if wrong_id is not None:
        frame["wrong_logit"] = logits[:, wrong_id].tolist()
        frame["wrong_prob"] = probs[:, wrong_id].tolist()
        frame["logit_diff"] = (logits[:, answer_id] - logits[:, wrong_id]).tolist()
    top = probs.topk(min(k, probs.shape[-1]), dim=-1)
    for i in range(top.indices.shape[1]):
        ids = top.indices[:, i].tolist()
        frame[f"top{i + 1}_token"] = [_decode(model, t) for t in ids]
        frame[f"top{i + 1}_id"] = ids
        frame[f"top{i + 1}_prob"] = top.values[:, i].tolist()
    frame.attrs.update(
        pos=position,
        identity_error=error,
        soft_cap=cap,
        answer=None if answer_id is None else _decode(model, answer_id),
        wrong=None if wrong_id is None else _decode(model, wrong_id),
    )
    return frame


def heads_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The ``head`` rows as ``layer, head, contribution`` (for a head heatmap)."""
    heads = frame[frame["component"] == "head"]
    return (
        heads[["layer", "head", "contribution"]]
        .astype({"layer": int, "head": int})
        .reset_index(drop=True)
    )
