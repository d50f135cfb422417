"""A task tokenised for one model: padded clean and corrupted batches, ready for a forward pass.

Everything here needs only the model's tokenizer and config, never a forward pass, so a task
is refused before any model work. Each refusal is one line that names the row (1-based) and
shows its tokenisation.

Prompts are tokenised exactly as :func:`interp.engine.to_tokens` tokenises them: text gets
the model's BOS when the model prepends one, token ids are taken as they are. Rows of a task
may differ in length (each pair may not); they are padded on the **right**, so every real
token keeps its position (learned and rotary positions alike) and causal attention never lets
a real token see padding. A row's metric is read at its own last real token, ``lengths - 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.engine import PromptError, to_tokens
from interp.tasks.metrics import TaskMetric
from interp.tasks.rows import Prompt, TaskError, TaskRow, describe

__all__ = ["TaskTokens", "tokenize_rows", "pad_id", "encode"]

MAX_SHOWN = 48  # tokens shown of a tokenisation in a message; longer ones are elided


@dataclass(frozen=True, eq=False)  # tensors have no single truth value: compare fields
class TaskTokens:
    """A task's rows as padded token batches for one model.

    ``positions[label]`` holds each row's index of that label in the padded batch (BOS
    counted), ``-1`` for rows without it. ``answers[i]`` / ``wrong[i]`` are row ``i``'s token
    ids (one or more). ``prefix[i]`` is 1 where the model prepended BOS to row ``i``'s text.
    """

    clean: Int[Tensor, "batch pos"]
    corrupted: Int[Tensor, "batch pos"]
    lengths: Int[Tensor, " batch"]  # real tokens per row; the rest is pad_id on the right
    answers: tuple[tuple[int, ...], ...]
    wrong: tuple[tuple[int, ...], ...] | None  # None: the task has no wrong answers
    pad_id: int  # the tokenizer's pad id, or 0 when it has none
    positions: dict[str, Int[Tensor, " batch"]]
    prefix: Int[Tensor, " batch"]

    def __len__(self) -> int:
        return int(self.clean.shape[0])

    def __repr__(self) -> str:
        labels = ", ".join(self.positions) or "none"
        wrong = "none" if self.wrong is None else f"{max(map(len, self.wrong))} max"
        return (
            f"TaskTokens({len(self)} rows, pos {self.clean.shape[1]}, lengths "
            f"{int(self.lengths.min())}-{int(self.lengths.max())}, answers "
            f"{max(map(len, self.answers))} max per row, wrong {wrong}, positions "
            f"{labels}, pad_id {self.pad_id})"
        )

    @property
    def last(self) -> Int[Tensor, " batch"]:
        """Each row's last real position, where its metric is read."""
        return self.lengths - 1

    @property
    def mask(self) -> Bool[Tensor, "batch pos"]:
        """True at real tokens, False at padding."""
        return torch.arange(self.clean.shape[1])[None, :] < self.lengths[:, None]

    def to(self, device: torch.device | str) -> TaskTokens:
        """The same batches on ``device`` (e.g. ``model.cfg.device``); metrics follow the
        logits' device by themselves."""
        return replace(
            self,
            clean=self.clean.to(device),
            corrupted=self.corrupted.to(device),
            lengths=self.lengths.to(device),
            positions={k: v.to(device) for k, v in self.positions.items()},
            prefix=self.prefix.to(device),
        )

    def select(self, rows: Sequence[int] | slice | Tensor) -> TaskTokens:
        """A sub-batch of rows (for chunked runs), its padding trimmed to its longest row."""
        index = (
            torch.arange(len(self))[rows]
            if isinstance(rows, slice)
            else torch.as_tensor(rows, dtype=torch.long).reshape(-1)
        )
        keep = index.tolist()
        if not keep:
            raise ValueError(f"select at least one of the {len(self)} rows, got {rows!r}")
        width = int(self.lengths[index].max())
        return TaskTokens(
            clean=self.clean[index, :width],
            corrupted=self.corrupted[index, :width],
            lengths=self.lengths[index],
            answers=tuple(self.answers[i] for i in keep),
            wrong=None if self.wrong is None else tuple(self.wrong[i] for i in keep),
            pad_id=self.pad_id,
            positions={k: v[index] for k, v in self.positions.items()},
            prefix=self.prefix[index],
        )

    def metric(self, kind: str = "logit_diff") -> TaskMetric:
        """Per-row metric on logits ``[batch pos d_vocab]`` (read at ``lengths - 1``):
        ``"logit_diff"`` or ``"prob_diff"`` (see :mod:`interp.tasks.metrics`)."""
        return TaskMetric(kind, self.answers, self.wrong, self.lengths)

    def logit_diff(self, logits: Float[Tensor, "batch pos d_vocab"]) -> Float[Tensor, " batch"]:
        """:func:`interp.tasks.task_logit_diff` of these rows' answers at their last tokens."""
        return self.metric("logit_diff")(logits)

    def prob_diff(self, logits: Float[Tensor, "batch pos d_vocab"]) -> Float[Tensor, " batch"]:
        """:func:`interp.tasks.task_prob_diff` of these rows' answers at their last tokens."""
        return self.metric("prob_diff")(logits)


def pad_id(model) -> int:
    """The tokenizer's pad id, or 0 when there is no tokenizer or it has none."""
    value = getattr(getattr(model, "tokenizer", None), "pad_token_id", None)
    return 0 if value is None else int(value)


def encode(model, text: str) -> list[int]:
    """Token ids of ``text`` alone, without BOS (as an answer or a piece of a prompt)."""
    return model.to_tokens(text, prepend_bos=False, truncate=False)[0].tolist()


def _pieces(model, ids: Sequence[int]) -> str:
    """``['When', ' Mary', ...]``: each token as text, elided in the middle when long."""
    tokenizer = getattr(model, "tokenizer", None)
    shown = [tokenizer.decode([i]) if tokenizer is not None else i for i in ids]
    if len(shown) > MAX_SHOWN:
        half = MAX_SHOWN // 2
        return f"{shown[:half]!r} ... {len(shown) - MAX_SHOWN} more ... {shown[-half:]!r}"
    return repr(shown)


def _prompt_tokens(model, prompt: Prompt, where: str, column: str) -> tuple[list[int], int]:
    """``(ids as run, tokens the model prepended)``; ids are run as given, text as to_tokens."""
    try:
        if isinstance(prompt, str):
            run = to_tokens(model, prompt)[0].tolist()
            own = to_tokens(model, prompt, prepend_bos=False)[0].tolist()
            return run, len(run) - len(own)
        return to_tokens(model, list(prompt))[0].tolist(), 0
    except PromptError as exc:
        raise TaskError(f"{where}: '{column}' {describe(prompt)} cannot be run: {exc}") from exc


def _answer_ids(model, answer, where: str, column: str) -> tuple[int, ...]:
    items = answer if isinstance(answer, tuple) else (answer,)
    d_vocab = int(model.cfg.d_vocab)
    ids = []
    for item in items:
        if isinstance(item, int):
            if item >= d_vocab:
                raise TaskError(
                    f"{where}: '{column}' id {item} is outside the vocabulary [0, {d_vocab - 1}]"
                )
            ids.append(item)
            continue
        if getattr(model, "tokenizer", None) is None:
            raise TaskError(f"{where}: this model has no tokenizer; give '{column}' as ids")
        got = encode(model, item)
        if len(got) != 1:
            listed = (
                " (each item of a list must be one token)"
                if isinstance(answer, tuple)
                else ", or a list of tokens"
            )
            raise TaskError(
                f"{where}: '{column}' {item!r} tokenises to {len(got)} tokens "
                f"{_pieces(model, got)}; give a single token{listed}"
            )
        unknown = getattr(model.tokenizer, "unk_token_id", None)
        if got[0] == unknown and item != model.tokenizer.unk_token:
            raise TaskError(
                f"{where}: '{column}' {item!r} is not in the vocabulary (it "
                f"tokenises to the unknown token {_pieces(model, got)})"
            )
        ids.append(got[0])
    if len(set(ids)) != len(ids):
        twice = next(i for i in ids if ids.count(i) > 1)
        raise TaskError(
            f"{where}: '{column}' lists the token {_pieces(model, [twice])} twice; "
            "a summed probability would count it twice"
        )
    return tuple(ids)


class _Checked(NamedTuple):
    """One row, checked: its ids as run and what the batch needs of it."""

    clean: list[int]
    corrupted: list[int]
    prefix: int  # tokens the model put before the row's text (BOS)
    answers: tuple[int, ...]
    wrong: tuple[int, ...] | None
    positions: dict[str, int]  # label -> index among the ids as run


def _check_row(model, row: TaskRow, where: str) -> _Checked:
    clean, prefix = _prompt_tokens(model, row.clean, where, "clean")
    corrupted, _ = _prompt_tokens(model, row.corrupted, where, "corrupted")
    if len(clean) != len(corrupted):
        raise TaskError(
            f"{where}: clean and corrupted tokenise to different lengths "
            f"({len(clean)} vs {len(corrupted)}): clean {_pieces(model, clean)}, "
            f"corrupted {_pieces(model, corrupted)}; a pair must have equal lengths"
        )
    answers = _answer_ids(model, row.answer, where, "answer")
    wrong = None if row.wrong is None else _answer_ids(model, row.wrong, where, "wrong")
    if wrong is not None and set(answers) & set(wrong):
        shared = sorted(set(answers) & set(wrong))
        raise TaskError(
            f"{where}: answer and wrong share the token(s) {_pieces(model, shared)}; "
            "a token cannot be both"
        )
    own = len(clean) - prefix  # positions count the prompt's own tokens
    positions = {}
    for label, index in row.positions.items():
        if not -own <= index < own:
            raise TaskError(
                f"{where}: position {label!r} = {index} is outside the prompt's "
                f"{own} tokens {_pieces(model, clean[prefix:])} (valid: 0 to "
                f"{own - 1}, or -{own} to -1 from the end)"
            )
        positions[label] = prefix + index % own
    return _Checked(clean, corrupted, prefix, answers, wrong, positions)


def tokenize_rows(model, rows: Sequence[TaskRow], *, source: str | None = None) -> TaskTokens:
    """Check every row against ``model``'s tokenizer and build the padded batches.

    Raises :class:`TaskError` for the first row that cannot be used.
    """
    checked = []
    for number, row in enumerate(rows, start=1):
        where = f"{source} row {number}" if source else f"row {number}"
        checked.append(_check_row(model, row, where))
    if not checked:
        raise TaskError("the task has no rows")
    width = max(len(c.clean) for c in checked)
    pad = pad_id(model)
    clean = torch.full((len(checked), width), pad, dtype=torch.long)
    corrupted = clean.clone()
    for i, c in enumerate(checked):
        clean[i, : len(c.clean)] = torch.tensor(c.clean)
        corrupted[i, : len(c.corrupted)] = torch.tensor(c.corrupted)
    labels = list(dict.fromkeys(label for c in checked for label in c.positions))
    return TaskTokens(
        clean=clean,
        corrupted=corrupted,
        lengths=torch.tensor([len(c.clean) for c in checked], dtype=torch.long),
        answers=tuple(c.answers for c in checked),
        wrong=None if checked[0].wrong is None else tuple(c.wrong for c in checked),
        pad_id=pad,
        positions={
            label: torch.tensor([c.positions.get(label, -1) for c in checked]) for label in labels
        },
        prefix=torch.tensor([c.prefix for c in checked], dtype=torch.long),
    )
