"""The logit lens: the residual stream after the embeddings and after each block, read as if final
(the model's own final norm, its statistics recomputed, unembedding and soft-cap); the last row
is the model's output, checked. Not a decomposition: the rows add up to nothing.
"""

from __future__ import annotations

import pandas as pd
import torch

from interp.attribution.core import (
    IDENTITY_ATOL,
    IDENTITY_RTOL,
    _decode,
    _position,
    _single_prompt,
)
from interp.attribution.residual import check_within
from interp.engine import Prompt, resolve_token, run_cached
from interp.models.norms import param, soft_cap
from interp.models.offload import materialized

__all__ = ["logit_lens"]


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
    run = run_cached(model, tokens, resid=("post",), hooks=["blocks.0.hook_resid_pre"])
    states = torch.cat(
        [run["blocks.0.hook_resid_pre"][:, position], run.resid("post")[:, 0, position]]
    )  # [layer+1 d_model]
    logits, cap = _read_as_final(model, states)
    real = run.logits[0, position].double()
    error = check_within(
        float((logits[-1] - real).abs().max()),
        float(real.abs().max()),
        IDENTITY_ATOL,
        IDENTITY_RTOL,
        "the logit lens's last row differs from the model's logits: this model's output is not "
        "final norm then unembedding, so the lens would mislead",
    )
    frame = _lens_frame(model, logits, answer_id, wrong_id, k)
    frame.attrs.update(
        pos=position,
        identity_error=error,
        soft_cap=cap,
        answer=None if answer_id is None else _decode(model, answer_id),
        wrong=None if wrong_id is None else _decode(model, wrong_id),
    )
    return frame


def _read_as_final(model, states):
    """``states`` ``[state d_model]`` through the final norm, the unembedding and the
    soft-cap, in float64: logits ``[state d_vocab]``; and the cap (None without one)."""
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
    return logits, cap


def _lens_frame(model, logits, answer_id: int | None, wrong_id: int | None, k: int):
    """One row per state (``layer``, ``label``), the answer's and wrong token's columns where
    given, then the top ``k`` tokens."""
    log_probs = logits.log_softmax(-1)
    probs = log_probs.exp()
    n_layers = int(model.cfg.n_layers)
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
    return frame
