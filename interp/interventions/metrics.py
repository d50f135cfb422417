"""Metrics for patching: a metric is any callable from logits to one number per batch row.

``metric(logits: [batch pos d_vocab]) -> [batch]``. The built-ins are small frozen objects
(printable, with a ``name``) reading one position (default the last):

- :func:`logit_diff` ``logit[answer] - logit[wrong]`` (or the answer's logit alone),
- :func:`probability` ``softmax(logits)[answer]``,
- :func:`answer_loss` ``-log softmax(logits)[answer]``.

Tokens are ids or text (``logit_diff(" data", " text")``). Text is resolved with the model's
tokenizer when the metric is given to an analysis (:func:`resolve_metric`, as
:func:`interp.logit_attribution` resolves its answer); text that is not exactly one token is
refused there in one line showing its tokenisation. Call :meth:`Metric.resolve` to use a
metric with text on logits by hand.

A metric may also return one number for the whole batch (a TransformerLens-style metric,
``logits[:, -1, a].mean() - ...``): :func:`is_scalar` tells, and the analyses then run it on
one patched run's rows at a time, so its numbers are those of the per-row metric's mean.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, replace

import torch
from jaxtyping import Float
from torch import Tensor

from interp.engine.batched import MetricFn, per_row
from interp.engine.tokens import resolve_token

__all__ = [
    "Metric",
    "logit_diff",
    "probability",
    "answer_loss",
    "metric_name",
    "per_row",
    "resolve_metric",
    "is_scalar",
    "row_by_row",
]

Token = int | str  # a token id, or single-token text resolved with the model's tokenizer


def _token(value, role: str) -> Token:
    if isinstance(value, str):
        if not value:
            raise ValueError(f"the {role} is empty; pass a single-token {role} such as ' Paris'")
        return value
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, Tensor)):
        raise ValueError(f"the {role} must be a token id or text, not {type(value).__name__}")
    return int(value)


@dataclass(frozen=True)
class Metric:
    """A built-in metric: ``kind`` in logit_diff, probability, loss; tokens as ids or text."""

    kind: str
    answer: Token
    wrong: Token | None = None
    pos: int = -1

    @property
    def name(self) -> str:
        if self.kind == "logit_diff":
            return "logit" if self.wrong is None else "logit_diff"
        return self.kind

    @property
    def resolved(self) -> bool:
        """Whether every token is an id (text resolved)."""
        return not isinstance(self.answer, str) and not isinstance(self.wrong, str)

    def resolve(self, model) -> Metric:
        """This metric with text tokens replaced by their ids in ``model``'s vocabulary
        (:class:`interp.attribution.TokenError` for text that is not one token)."""
        if self.resolved:
            return self
        answer = resolve_token(model, self.answer)
        wrong = None if self.wrong is None else resolve_token(model, self.wrong, role="wrong token")
        return replace(self, answer=answer, wrong=wrong)

    def __call__(self, logits: Float[Tensor, "batch pos d_vocab"]) -> Float[Tensor, " batch"]:
        if not self.resolved:
            raise ValueError(
                f"{self} holds token text; call metric.resolve(model) to look it up in the "
                "model's vocabulary (patch_activations and path_patch do this themselves)"
            )
        at = logits[:, self.pos].float()
        if self.kind == "logit_diff":
            value = at[:, self.answer]
            return value if self.wrong is None else value - at[:, self.wrong]
        log_probs = torch.log_softmax(at, dim=-1)[:, self.answer]
        return log_probs.exp() if self.kind == "probability" else -log_probs


def logit_diff(answer: Token, wrong: Token | None = None, *, pos: int = -1) -> Metric:
    """``logit[answer] - logit[wrong]`` at ``pos`` (the answer's logit when ``wrong`` is None);
    tokens are ids or single-token text such as ``" Mary"``."""
    return Metric(
        "logit_diff",
        _token(answer, "answer"),
        None if wrong is None else _token(wrong, "wrong"),
        pos,
    )


def probability(answer: Token, *, pos: int = -1) -> Metric:
    """The probability of ``answer`` (an id or single-token text) at ``pos``."""
    return Metric("probability", _token(answer, "answer"), None, pos)


def answer_loss(answer: Token, *, pos: int = -1) -> Metric:
    """Cross-entropy of ``answer`` (an id or single-token text) at ``pos``: ``-log p(answer)``."""
    return Metric("loss", _token(answer, "answer"), None, pos)


def resolve_metric(model, metric: MetricFn) -> MetricFn:
    """``metric`` ready for ``model``: a built-in :class:`Metric`'s text resolved to token ids
    (refused in one line when it is not one token); any other callable as it is."""
    return metric.resolve(model) if isinstance(metric, Metric) else metric


def is_scalar(metric: MetricFn, logits: Float[Tensor, "batch pos d_vocab"]) -> bool:
    """Whether ``metric`` returns one number for a batch of two or more rows (a
    TransformerLens-style metric averaging over the batch) instead of one per row. ``logits``
    is any batch of two rows or more (the caller's clean run, say)."""
    if logits.shape[0] < 2:
        logits = logits.expand(2, *logits.shape[1:])
    with torch.no_grad():
        value = metric(logits)
    return torch.as_tensor(value).ndim == 0


@dataclass(frozen=True)
class RowByRow:
    """A batch-averaging metric read on one batch row at a time: one value per row, each the
    metric of that row alone (the mean over a batch of one is that row's value)."""

    metric: MetricFn

    @property
    def name(self) -> str:
        return metric_name(self.metric)

    def __call__(self, logits: Float[Tensor, "batch pos d_vocab"]) -> Float[Tensor, " batch"]:
        values = [torch.as_tensor(self.metric(logits[i : i + 1])) for i in range(len(logits))]
        return torch.stack([v.reshape(()) for v in values]).float()


def row_by_row(model, metric: MetricFn, logits: Float[Tensor, "batch pos d_vocab"]) -> MetricFn:
    """``metric`` resolved for ``model`` (:func:`resolve_metric`) and, when it averages over the
    batch (:func:`is_scalar` on ``logits``), read one batch row at a time (:class:`RowByRow`),
    so that per-row and TransformerLens-style metrics give the same numbers."""
    metric = resolve_metric(model, metric)
    return RowByRow(metric) if is_scalar(metric, logits) else metric


def metric_name(metric: MetricFn) -> str:
    """A metric's name for tables: its ``name``, else its ``__name__``, else its type."""
    return getattr(metric, "name", getattr(metric, "__name__", type(metric).__name__))
