"""Metrics for patching: a metric is any callable from logits to one number per batch row.

``metric(logits: [batch pos d_vocab]) -> [batch]``. The built-ins are small frozen objects
(printable, with a ``name``) reading one position (default the last):

- :func:`logit_diff` ``logit[answer] - logit[wrong]`` (or the answer's logit alone),
- :func:`probability` ``softmax(logits)[answer]``,
- :func:`answer_loss` ``-log softmax(logits)[answer]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from interp.engine.batched import MetricFn, per_row

__all__ = ["Metric", "logit_diff", "probability", "answer_loss", "metric_name", "per_row"]


@dataclass(frozen=True)
class Metric:
    """A built-in metric: ``kind`` in logit_diff, probability, loss."""

    kind: str
    answer: int
    wrong: int | None = None
    pos: int = -1

    @property
    def name(self) -> str:
        if self.kind == "logit_diff":
            return "logit" if self.wrong is None else "logit_diff"
        return self.kind

    def __call__(self, logits: Float[Tensor, "batch pos d_vocab"]) -> Float[Tensor, " batch"]:
        at = logits[:, self.pos].float()
        if self.kind == "logit_diff":
            value = at[:, self.answer]
            return value if self.wrong is None else value - at[:, self.wrong]
        log_probs = torch.log_softmax(at, dim=-1)[:, self.answer]
        return log_probs.exp() if self.kind == "probability" else -log_probs


def logit_diff(answer: int, wrong: int | None = None, *, pos: int = -1) -> Metric:
    """``logit[answer] - logit[wrong]`` at ``pos`` (the answer's logit when ``wrong`` is None)."""
    return Metric("logit_diff", int(answer), None if wrong is None else int(wrong), pos)


def probability(answer: int, *, pos: int = -1) -> Metric:
    """The probability of ``answer`` at ``pos``."""
    return Metric("probability", int(answer), None, pos)


def answer_loss(answer: int, *, pos: int = -1) -> Metric:
    """Cross-entropy of ``answer`` at ``pos``: ``-log p(answer)``."""
    return Metric("loss", int(answer), None, pos)


def metric_name(metric: MetricFn) -> str:
    """A metric's name for tables: its ``name``, else its ``__name__``, else its type."""
    return getattr(metric, "name", getattr(metric, "__name__", type(metric).__name__))
