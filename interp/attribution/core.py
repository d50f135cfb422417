"""Direct logit attribution of one prompt: the rows, and the identity that checks them.

:func:`interp.attribution.logit_attribution` and :func:`interp.logit_attribution_batch` both
build their frames here, from the residual parts of the folded model
(:mod:`interp.attribution.residual`); every frame's rows must add up to the model's own logit
(or logit difference) within ``IDENTITY_ATOL + IDENTITY_RTOL * |logit|``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from jaxtyping import Float
from torch import Tensor

from interp.attribution.residual import ResidualParts, check_within
from interp.engine import Prompt, TokenError, to_tokens
from interp.engine import resolve_token as _resolve_token
from interp.models.layernorm import fold_info
from interp.models.norms import effective_bias, effective_weight, is_rms, normalise, param, soft_cap

__all__ = ["COMPONENTS", "TokenError", "IDENTITY_ATOL", "IDENTITY_RTOL"]

# row kinds, in the order they appear; "total" is the sum of all others
COMPONENTS = (
    "embed",
    "pos_embed",
    "head",
    "attn_bias",
    "mlp",
    "neuron",
    "mlp_bias",
    "unembed_bias",
    "mean_logit",
    "total",
)
# The rows must add up to the logit the model computes. float32 activations summed in float64
# agree with a float32 forward pass to ~1e-6 on logits of order 1; rounding grows with the
# logits' size, hence the relative part. A real mistake (an unfolded LayerNorm) is ~0.1.
IDENTITY_ATOL = 1e-4
IDENTITY_RTOL = 1e-5  # relative part of the identity's tolerance, times |logit|


def _decode(model, token_id: int) -> str:
    return model.tokenizer.decode([token_id]) if model.tokenizer is not None else str(token_id)


def _single_prompt(model, prompt: Prompt) -> Tensor:
    tokens = to_tokens(model, prompt)
    if tokens.shape[0] != 1:
        raise ValueError(f"pass one prompt, not a batch of {tokens.shape[0]}")
    return tokens


def _position(pos: int, n_pos: int) -> int:
    if not -n_pos <= pos < n_pos:
        raise ValueError(f"pos {pos} is out of range for a prompt of {n_pos} tokens")
    return pos % n_pos


@dataclass(frozen=True)
class _Target:
    answer: int
    wrong: int | None

    def direction(self, W_U: Float[Tensor, "d_model d_vocab"]) -> Float[Tensor, " d_model"]:
        d = W_U[:, self.answer].double()
        return d if self.wrong is None else d - W_U[:, self.wrong].double()

    def read(self, logits: Float[Tensor, " d_vocab"]) -> float:
        value = logits[self.answer].double()
        return float(value if self.wrong is None else value - logits[self.wrong].double())


def _check_identity(total: float, reference: float, logits: Tensor, against: str) -> float:
    return check_within(
        abs(total - reference),
        float(logits.abs().max()),
        IDENTITY_ATOL,
        IDENTITY_RTOL,
        f"the attributions add up to {total:.6g} but {against} is {reference:.6g}; refusing to "
        "return numbers that do not add up",
    )


def _note(model) -> str | None:
    cap = soft_cap(model)
    if cap is None:
        return None
    return (
        f"this model soft-caps its logits (cap * tanh(logit / cap), cap = {cap:g}), which is "
        "not linear: the rows decompose the logit before the cap; the model's output is "
        "attrs['output']"
    )


def _target(model, answer: str | int, wrong: str | int | None) -> _Target:
    target = _Target(
        _resolve_token(model, answer),
        None if wrong is None else _resolve_token(model, wrong, role="wrong answer"),
    )
    if target.wrong == target.answer:
        raise TokenError(
            "the answer and the wrong token are the same token; their logit "
            "difference is 0 by definition"
        )
    return target


def logit_direction(folded, target: _Target) -> Float[Tensor, " d_model"]:
    """The direction a residual-stream vector is dotted with (then divided by the final norm's
    frozen scale) to give its contribution to ``target`` in the folded model: the unembedding's
    answer (minus wrong) column times what is left of ``ln_final``'s weight, centred for a
    LayerNorm, since ``(c - mean c) · d == c · (d - mean d)``."""
    final = folded.ln_final
    direction = effective_weight(final) * target.direction(folded.W_U.detach().cpu())
    return direction if is_rms(final) else direction - direction.mean()


def _attribute(
    model,
    folded,
    tokens: Tensor,
    target: _Target,
    position: int,
    parts: ResidualParts,
    logits: Tensor | None,
    neurons: bool,
) -> pd.DataFrame:
    """The attribution frame of one prompt from its residual parts (of the folded model) and
    the unfolded model's pre-cap ``logits`` at ``position`` (None when ``model`` is folded)."""
    info = fold_info(folded)
    final = folded.ln_final
    raw_direction = target.direction(folded.W_U.detach().cpu())
    direction = logit_direction(folded, target)
    contributions = parts.stack @ direction / parts.scale
    b_U = param(folded, "b_U")
    bias = float(effective_bias(final) @ raw_direction)
    if b_U is not None:
        bias += float(b_U[target.answer] - (0.0 if target.wrong is None else b_U[target.wrong]))
    labels = parts.labels + [("unembed_bias", None, None, None)]
    values = contributions.tolist() + [bias]
    folded_total = sum(values)
    _check_identity(
        folded_total, target.read(parts.logits), parts.logits, "the folded model's logit"
    )
    if target.wrong is None and info.center_unembed:
        labels.append(("mean_logit", None, None, None))
        values.append(float(info.mean_logit(normalise(final, parts.x, parts.scale))))
    total = sum(values)
    cap = soft_cap(model)
    capped = "" if cap is None else " before soft-capping"
    if folded is model:
        mean = " plus its vocabulary mean" if info.center_unembed and target.wrong is None else ""
        reference, against = total, f"the folded model's logit{capped}{mean}"
        error = abs(folded_total - target.read(parts.logits))
    else:
        reference, against = target.read(logits), f"the model's logit{capped}"
        error = _check_identity(total, reference, logits, against)
    # folding never centres a soft-capped unembedding, so the folded output is the model's
    output = reference if cap is None else target.read(parts.output)
    labels.append(("total", None, None, None))
    values.append(total)

    columns = ["component", "layer", "head"] + (["neuron"] if neurons else [])
    frame = pd.DataFrame(
        [label[:3] + ((label[3],) if neurons else ()) for label in labels], columns=columns
    )
    for column in columns[1:]:
        frame[column] = frame[column].astype("Int64")
    frame["contribution"] = pd.Series(values, dtype="float64")
    frame.attrs.update(
        answer=_decode(model, target.answer),
        answer_id=target.answer,
        wrong=None if target.wrong is None else _decode(model, target.wrong),
        wrong_id=target.wrong,
        pos=position,
        n_tokens=int(tokens.shape[1]),
        reference=reference,
        reference_is=against,
        identity_error=error,
        normalization="RMSNorm" if is_rms(final) else "LayerNorm",
        soft_cap=cap,
        output=output,
        note=_note(model),
    )
    return frame
