"""Prompts into token ids, checked before any model work, and hook names checked likewise.

A prompt is text, a batch of texts of one token length, or token ids ``[pos]`` /
``[batch pos]``; :func:`to_tokens` refuses an empty prompt, ids outside the vocabulary and a
prompt longer than the context, each in one line saying what to do.
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Sequence

import torch
from jaxtyping import Int
from torch import Tensor

__all__ = [
    "Prompt",
    "PromptError",
    "TokenError",
    "resolve_token",
    "to_tokens",
    "pair_tokens",
    "check_hook_names",
    "hook_name",
    "RESID_KINDS",
]

RESID_KINDS = ("pre", "mid", "post")  # residual streams: before attention, between, after MLP
Prompt = str | Sequence[str] | Sequence[int] | Tensor  # text, texts of one length, or token ids


class PromptError(ValueError):
    """A prompt that cannot be run: empty, too long, or with ids outside the vocabulary."""


class TokenError(ValueError):
    """An answer that is not exactly one token of the model's vocabulary."""


def _n_ctx(model) -> int:
    return int(model.cfg.n_ctx)


def _check_ids(tokens: Tensor, model) -> Int[Tensor, "batch pos"]:
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise PromptError(f"token ids must be integers, got dtype {tokens.dtype}")
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2:
        raise PromptError(
            f"token ids must be [pos] or [batch, pos], got shape {tuple(tokens.shape)}"
        )
    if tokens.numel() == 0:
        raise PromptError("the prompt is empty: pass at least one token")
    d_vocab = int(model.cfg.d_vocab)
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= d_vocab:
        raise PromptError(
            f"token ids must lie in [0, {d_vocab - 1}] (the model's vocabulary), "
            f"got values from {lo} to {hi}"
        )
    if tokens.shape[1] > _n_ctx(model):
        raise PromptError(
            f"prompt has {tokens.shape[1]} tokens but the model's context is "
            f"{_n_ctx(model)}; pass a shorter prompt"
        )
    return tokens.long()


def to_tokens(
    model, prompt: Prompt, *, prepend_bos: bool | None = None
) -> Int[Tensor, "batch pos"]:
    """Validate a prompt (text, a batch of texts, or token ids) and return ``[batch, pos]`` ids.

    Text is tokenised by the model's tokenizer (``prepend_bos`` as the model's default when
    None); a batch of texts must tokenise to equal lengths, since padding would be attended to.
    """
    if isinstance(prompt, Tensor):
        tokens = prompt
    elif isinstance(prompt, str) or (
        isinstance(prompt, Sequence) and prompt and all(isinstance(p, str) for p in prompt)
    ):
        texts = [prompt] if isinstance(prompt, str) else list(prompt)
        if any(not t for t in texts):
            raise PromptError("the prompt is empty: pass some text")
        if model.tokenizer is None:
            raise PromptError("this model has no tokenizer; pass token ids instead of text")
        rows = [model.to_tokens(t, prepend_bos=prepend_bos, truncate=False)[0].cpu() for t in texts]
        lengths = sorted({len(r) for r in rows})
        if len(lengths) > 1:
            raise PromptError(
                f"the texts tokenise to different lengths {lengths}; run them "
                "separately or pass equal-length token ids"
            )
        tokens = torch.stack(rows)
    elif isinstance(prompt, Sequence):
        if not prompt:
            raise PromptError("the prompt is empty: pass some text or token ids")
        try:
            tokens = torch.as_tensor(prompt)
        except (TypeError, ValueError) as exc:
            raise PromptError(f"cannot read the prompt as token ids: {exc}") from exc
    else:
        raise PromptError(
            f"a prompt is text, a list of texts or token ids, not {type(prompt).__name__}"
        )
    return _check_ids(tokens, model)


def hook_name(layer: int, suffix: str) -> str:
    """``blocks.{layer}.{suffix}``: a layer's hook name."""
    return f"blocks.{layer}.{suffix}"


def check_hook_names(model, names: Sequence[str]) -> None:
    """Raise for hook names the model does not have or only fires behind a flag."""
    available = model.hook_dict
    for name in names:
        if name not in available:
            close = difflib.get_close_matches(name, list(available), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise KeyError(f"unknown hook name '{name}'{hint}")
        reason = model._gated_hook_reason(name)
        if reason is not None:
            hint = "; pass head_outputs=True instead" if name.endswith("attn.hook_result") else ""
            if not hint and callable(getattr(model, f"set_{reason}", None)):
                hint = f"; model.set_{reason}(True) turns it on"
            raise KeyError(
                f"hook '{name}' does not fire on this model as configured: {reason}{hint}"
            )


def _no_resid_mid(model) -> str:
    """Why a model has no residual stream between its attention and its MLP."""
    if getattr(model.cfg, "attn_only", False):
        return (
            "this model is attention-only: there is no resid_mid between attention and "
            "MLP; ask for resid 'pre' or 'post'"
        )
    return (
        "this model has a parallel residual (attention and MLP both read resid_pre, as in "
        "GPT-J, Pythia, Phi): there is no resid_mid; ask for resid 'pre' or 'post'"
    )


def pair_tokens(model, clean, corrupted) -> tuple[Int[Tensor, "1 pos"], Int[Tensor, "1 pos"]]:
    """Tokenise a clean and a corrupted prompt; refuse different lengths, showing both."""
    pair = []
    for role, prompt in (("clean", clean), ("corrupted", corrupted)):
        tokens = to_tokens(model, prompt)
        if tokens.shape[0] != 1:
            raise PromptError(f"pass one {role} prompt, not a batch of {tokens.shape[0]}")
        pair.append(tokens.to(model.cfg.device))
    if pair[0].shape != pair[1].shape:
        shown = [token_strings(model, tokens[0]) for tokens in pair]
        raise PromptError(
            f"the clean and corrupted prompts must have the same number of tokens "
            f"(positions are patched one for one): clean has {pair[0].shape[1]} "
            f"{shown[0]}, corrupted has {pair[1].shape[1]} {shown[1]}; "
            "change the corrupted prompt"
        )
    return pair[0], pair[1]


def token_strings(model, tokens: Int[Tensor, " pos"]) -> list[str]:
    """Each id as its text (the ids themselves when the model has no tokenizer)."""
    if model.tokenizer is None:
        return [str(t) for t in tokens.tolist()]
    return [model.tokenizer.decode([t]) for t in tokens.tolist()]


def resolve_token(model, token: str | int, *, role: str = "answer") -> int:
    """The vocabulary id of a single-token ``token`` (text, or an id that is checked)."""
    d_vocab = int(model.cfg.d_vocab)
    if isinstance(token, bool) or not isinstance(token, (str, numbers.Integral)):
        raise TokenError(f"the {role} must be text or a token id, not {type(token).__name__}")
    if isinstance(token, numbers.Integral):
        token = int(token)
        if not 0 <= token < d_vocab:
            raise TokenError(f"the {role} id {token} is outside the vocabulary [0, {d_vocab - 1}]")
        return token
    if not token:
        raise TokenError(f"the {role} is empty; pass a single-token {role} such as ' Paris'")
    if model.tokenizer is None:
        raise TokenError(f"this model has no tokenizer; pass the {role} as a token id")
    ids = model.to_tokens(token, prepend_bos=False, truncate=False)[0]
    if len(ids) != 1:
        raise TokenError(
            f"{token!r} tokenises to {len(ids)} tokens {token_strings(model, ids)}; "
            f"pass a single-token {role}"
        )
    return int(ids[0])
