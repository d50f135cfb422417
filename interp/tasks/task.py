"""``Task``: a dataset of clean/corrupted prompt pairs, each with its own answer, validated once.

A task is the unit of a causal experiment: patching runs the corrupted prompt of every row
with activations from its clean prompt and reads each row's metric (its own answer against its
own wrong answer) at its own last token. Building a task checks its structure (no tokenizer
needed); :meth:`Task.tokens` checks it against a model's tokenizer and returns the padded
batches, before any forward pass.

    task = Task.from_jsonl("ioi.jsonl")
    batch = task.tokens(model)        # TaskTokens: clean/corrupted [batch pos], lengths, ...
    batch.logit_diff(model(batch.clean))
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from interp.tasks.formats import read_csv, read_jsonl, write_csv, write_jsonl
from interp.tasks.rows import COLUMNS, TaskError, TaskRow, row_from_record
from interp.tasks.tokens import TaskTokens, tokenize_rows

__all__ = ["Task"]


def _plain_scalar(value: Any) -> Any:
    """numpy scalars (from a DataFrame) as Python values, so rows compare and serialise."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:
        return item()
    if isinstance(value, (list, tuple)):
        return type(value)(_plain_scalar(v) for v in value)
    if isinstance(value, Mapping):
        return {k: _plain_scalar(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Task:
    """Rows of ``clean``, ``corrupted``, ``answer`` and optional ``wrong`` (see
    :class:`interp.tasks.TaskRow`). Either every row has ``wrong`` or none does.

    Build one with :meth:`from_jsonl`, :meth:`from_csv`, :meth:`from_records`,
    :meth:`from_frame`, or a generator (:func:`interp.tasks.ioi`, ...).
    """

    rows: tuple[TaskRow, ...]
    source: str | None = field(default=None, compare=False)  # where it was read, for messages

    def __post_init__(self):
        rows = tuple(self.rows)
        object.__setattr__(self, "rows", rows)
        where = f"{self.source} " if self.source else ""
        if not rows:
            raise TaskError(f"{where}task has no rows; give at least one clean/corrupted pair")
        for number, row in enumerate(rows, start=1):
            if not isinstance(row, TaskRow):
                raise TaskError(
                    f"{where}row {number} is a {type(row).__name__}, not a TaskRow; "
                    "build tasks with Task.from_records"
                )
        with_wrong = [row.wrong is not None for row in rows]
        if any(with_wrong) and not all(with_wrong):
            first = with_wrong.index(not with_wrong[0]) + 1
            has = (
                "has no 'wrong' but row 1 has one"
                if with_wrong[0]
                else "has a 'wrong' but row 1 has none"
            )
            raise TaskError(f"{where}row {first} {has}; give every row a wrong answer or none")

    # ---- building --------------------------------------------------------------------------

    @classmethod
    def from_records(
        cls, records: Iterable[Mapping[str, Any]], *, source: str | None = None
    ) -> Task:
        """A task from dicts with the columns ``clean``, ``corrupted``, ``answer`` (and
        ``wrong``, ``positions``; other keys become metadata)."""
        prefix = f"{source} " if source else ""
        rows = [
            row_from_record(
                _plain_scalar(dict(r)) if isinstance(r, Mapping) else r, f"{prefix}row {i}"
            )
            for i, r in enumerate(records, start=1)
        ]
        return cls(tuple(rows), source=source)

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> Task:
        """A task from a DataFrame with one row per pair (columns as :meth:`from_records`)."""
        return cls.from_records(frame.to_dict(orient="records"))

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike) -> Task:
        """A task from a JSONL file: one JSON object per line (docs/tasks.md)."""
        return cls(tuple(read_jsonl(path)), source=str(path))

    @classmethod
    def from_csv(cls, path: str | os.PathLike) -> Task:
        """A task from a CSV file with a header row (docs/tasks.md says how lists are written)."""
        return cls(tuple(read_csv(path)), source=str(path))

    # ---- reading ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[TaskRow]:
        return iter(self.rows)

    def __getitem__(self, index: int | slice) -> TaskRow | Task:
        if isinstance(index, slice):
            return Task(self.rows[index], source=self.source)
        return self.rows[index]

    @property
    def has_wrong(self) -> bool:
        """Whether the rows have wrong answers (all of them do, or none)."""
        return self.rows[0].wrong is not None

    @property
    def labels(self) -> tuple[str, ...]:
        """Every position label used by some row, in order of first use."""
        return tuple(dict.fromkeys(label for row in self.rows for label in row.positions))

    def __repr__(self) -> str:
        def kind(value) -> str:
            return "ids" if isinstance(value, tuple) and isinstance(value[0], int) else "text"

        prompts = sorted(
            {kind(r.clean) for r in self.rows} | {kind(r.corrupted) for r in self.rows}
        )
        lists = any(isinstance(r.answer, tuple) for r in self.rows)
        meta = list(dict.fromkeys(k for r in self.rows for k in r.meta))
        parts = [
            f"{len(self)} rows",
            f"prompts as {'+'.join(prompts)}",
            f"answers {'as lists' if lists else 'single'}",
            "wrong answers" if self.has_wrong else "no wrong answers",
        ]
        if self.labels:
            parts.append(f"positions {', '.join(self.labels)}")
        if meta:
            parts.append(f"metadata {', '.join(meta)}")
        source = f" from {self.source}" if self.source else ""
        return f"Task({'; '.join(parts)}{source})"

    # ---- using -----------------------------------------------------------------------------

    def tokens(self, model) -> TaskTokens:
        """Check every row against ``model``'s tokenizer and return padded batches.

        Raises :class:`TaskError` naming the first row whose pair tokenises to different
        lengths, whose answer or wrong is not one token (unless given as a list), whose
        position is out of range, or whose prompt cannot run on the model. Needs only the
        tokenizer and config: no forward pass.
        """
        return tokenize_rows(model, self.rows, source=self.source)

    # ---- writing ---------------------------------------------------------------------------

    def to_records(self) -> list[dict[str, Any]]:
        """Rows as JSON-ready dicts (lists for token lists; metadata keys at the end)."""
        return [row.record() for row in self.rows]

    def to_frame(self) -> pd.DataFrame:
        """One row per pair: the task columns present, then the metadata columns."""
        records = self.to_records()
        extra = list(dict.fromkeys(k for r in records for k in r if k not in COLUMNS))
        present = [c for c in COLUMNS if any(c in r for r in records)]
        frame = pd.DataFrame(records, columns=present + extra)
        return frame.astype(object).where(frame.notna(), None)

    def to_jsonl(self, path: str | os.PathLike, *, model=None) -> Path:
        """Write the task as JSONL; with ``model``, check it against its tokenizer first.
        Nothing is written when the task is refused."""
        if model is not None:
            self.tokens(model)
        return write_jsonl(self.rows, path)

    def to_csv(self, path: str | os.PathLike, *, model=None) -> Path:
        """Write the task as CSV (lists and ids as JSON cells); with ``model``, check first.
        Nothing is written when the task is refused."""
        if model is not None:
            self.tokens(model)
        return write_csv(self.rows, path)
