"""Per-row task metrics: each row has its own answers, wrong answers and last real token.

For a row with answer tokens ``A`` and wrong tokens ``W``, read at the row's last real token:

- :func:`task_logit_diff`  ``log Σ_{a∈A} p(a) - log Σ_{w∈W} p(w)``. With one token on each side
  the softmax normaliser cancels and this is the plain logit difference
  ``logit[a] - logit[w]``; with lists it is the difference of the two sets' log-probabilities
  (computed as ``logsumexp(logits[A]) - logsumexp(logits[W])``, the normaliser again cancelling).
  Without wrong answers: ``logsumexp(logits[A])``, the answer's logit for one token (the same
  as :func:`interp.interventions.logit_diff` with no wrong token).
- :func:`task_prob_diff`  ``Σ_{a∈A} p(a) - Σ_{w∈W} p(w)`` (greater-than's probability
  difference); without wrong answers ``Σ p(a)``.

Both are differentiable (gradient methods can use them) and computed in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

__all__ = ["task_logit_diff", "task_prob_diff", "last_logits", "TaskMetric", "METRICS"]

TokenSets = Sequence[Sequence[int]]  # row i's token ids


def last_logits(
    logits: Float[Tensor, "batch pos d_vocab"] | Float[Tensor, "batch d_vocab"],
    lengths: Int[Tensor, " batch"] | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """Each row's logits at its last real token ``lengths - 1`` (the last position when
    ``lengths`` is None; 2-D logits are taken as already read)."""
    if logits.ndim == 2:
        return logits
    if logits.ndim != 3:
        raise ValueError(
            f"logits must be [batch pos d_vocab] or [batch d_vocab], got shape "
            f"{tuple(logits.shape)}"
        )
    if lengths is None:
        return logits[:, -1]
    lengths = torch.as_tensor(lengths, device=logits.device)
    if lengths.shape != (logits.shape[0],):
        raise ValueError(
            f"lengths must have one entry per row ({logits.shape[0]}), got shape "
            f"{tuple(lengths.shape)}"
        )
    if int(lengths.min()) < 1 or int(lengths.max()) > logits.shape[1]:
        raise ValueError(
            f"lengths must lie in [1, {logits.shape[1]}] (the logits' positions), "
            f"got {int(lengths.min())} to {int(lengths.max())}"
        )
    rows = torch.arange(logits.shape[0], device=logits.device)
    return logits[rows, lengths.long() - 1]


def _index(sets: TokenSets, n_rows: int, device) -> tuple[Tensor, Tensor]:
    """``(ids [batch k], real [batch k])``: ragged token sets padded with their first id."""
    if len(sets) != n_rows:
        raise ValueError(f"need one token set per row ({n_rows}), got {len(sets)}")
    if any(len(s) == 0 for s in sets):
        raise ValueError("every row needs at least one token in each set")
    width = max(len(s) for s in sets)
    ids = torch.tensor([list(s) + [s[0]] * (width - len(s)) for s in sets], device=device)
    real = torch.tensor([[j < len(s) for j in range(width)] for s in sets], device=device)
    return ids, real


def _set_logsumexp(at: Float[Tensor, "batch d_vocab"], sets: TokenSets) -> Float[Tensor, " batch"]:
    ids, real = _index(sets, at.shape[0], at.device)
    picked = at.gather(1, ids).masked_fill(~real, float("-inf"))
    return torch.logsumexp(picked, dim=-1)


def _set_probability(
    log_probs: Float[Tensor, "batch d_vocab"], sets: TokenSets
) -> Float[Tensor, " batch"]:
    ids, real = _index(sets, log_probs.shape[0], log_probs.device)
    return (log_probs.gather(1, ids).exp() * real).sum(-1)


def task_logit_diff(
    logits: Float[Tensor, "batch pos d_vocab"] | Float[Tensor, "batch d_vocab"],
    answers: TokenSets,
    wrong: TokenSets | None = None,
    *,
    lengths: Int[Tensor, " batch"] | None = None,
) -> Float[Tensor, " batch"]:
    """``log Σ p(answers) - log Σ p(wrong)`` per row at its last real token (module docstring).

    ``answers[i]`` and ``wrong[i]`` are row ``i``'s token ids; one id each gives the plain
    logit difference.
    """
    at = last_logits(logits, lengths).float()
    value = _set_logsumexp(at, answers)
    return value if wrong is None else value - _set_logsumexp(at, wrong)


def task_prob_diff(
    logits: Float[Tensor, "batch pos d_vocab"] | Float[Tensor, "batch d_vocab"],
    answers: TokenSets,
    wrong: TokenSets | None = None,
    *,
    lengths: Int[Tensor, " batch"] | None = None,
) -> Float[Tensor, " batch"]:
    """``Σ p(answers) - Σ p(wrong)`` per row at its last real token (module docstring)."""
    log_probs = torch.log_softmax(last_logits(logits, lengths).float(), dim=-1)
    value = _set_probability(log_probs, answers)
    return value if wrong is None else value - _set_probability(log_probs, wrong)


METRICS = {"logit_diff": task_logit_diff, "prob_diff": task_prob_diff}  # kind -> function


@dataclass(frozen=True, eq=False)  # holds a tensor: compare fields, not objects
class TaskMetric:
    """A task's per-row metric as a callable ``logits [batch pos d_vocab] -> [batch]`` (the
    metric protocol of :mod:`interp.interventions`), printable, with a ``name``."""

    kind: str
    answers: tuple[tuple[int, ...], ...]
    wrong: tuple[tuple[int, ...], ...] | None
    lengths: Int[Tensor, " batch"] | None = None

    def __post_init__(self):
        if self.kind not in METRICS:
            raise ValueError(f"kind must be one of {', '.join(METRICS)}, got {self.kind!r}")

    @property
    def name(self) -> str:
        if self.wrong is None:
            return "answer_logit" if self.kind == "logit_diff" else "answer_prob"
        return self.kind

    def __repr__(self) -> str:
        return f"TaskMetric({self.name}, {len(self.answers)} rows)"

    def __call__(self, logits: Float[Tensor, "batch pos d_vocab"]) -> Float[Tensor, " batch"]:
        return METRICS[self.kind](logits, self.answers, self.wrong, lengths=self.lengths)

    def select(self, rows: Int[Tensor, " batch"]) -> TaskMetric:
        """This metric for a batch whose row ``b`` is task row ``rows[b]`` (rows repeated once
        per patched run, or a chunk of them)."""
        picked = rows.tolist()
        wrong = None if self.wrong is None else tuple(self.wrong[i] for i in picked)
        lengths = None if self.lengths is None else self.lengths[rows]
        return TaskMetric(self.kind, tuple(self.answers[i] for i in picked), wrong, lengths)
