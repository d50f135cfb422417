"""One row of a task: a clean/corrupted prompt pair, its answer(s), and what travels with it.

A row is checked here for what can be checked without a tokenizer: the columns are there,
prompts are non-empty text or non-empty lists of token ids, answers are one token (text or
id) or a non-empty list of them, positions map labels to integers. Whether text really is one
token, and whether the two prompts have the same length, needs the model's tokenizer:
:mod:`interp.tasks.tokens` checks that.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TaskError", "TaskRow", "COLUMNS", "REQUIRED", "row_from_record", "describe"]

REQUIRED = ("clean", "corrupted", "answer")  # every row has these
COLUMNS = ("clean", "corrupted", "answer", "wrong", "positions")  # the rest is metadata

Prompt = str | tuple[int, ...]  # text, or token ids taken as they are
Answer = str | int | tuple[str | int, ...]  # one token, or a list of tokens


class TaskError(ValueError):
    """A task that cannot be used: a malformed file or row, or prompts and answers that do not
    tokenise as a task needs. The message names the row (1-based) and what to change."""


@dataclass(frozen=True)
class TaskRow:
    """A clean/corrupted prompt pair with the answer the clean prompt should produce.

    ``answer`` and ``wrong`` are one token (text such as ``" Mary"``, or an id) or a tuple
    of two or more tokens whose probabilities are summed (greater-than: every year above vs
    every year at or below); a list of one token is stored as that token. ``positions`` maps
    labels to indices into the prompt's own tokens (not counting a BOS the model prepends to
    text; negative counts from the end). ``meta`` keeps every other column of the row
    (``template``, ...).
    """

    clean: Prompt
    corrupted: Prompt
    answer: Answer
    wrong: Answer | None = None
    positions: dict[str, int] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The row as a JSON-ready dict: lists for tuples, ``wrong``/``positions`` only if set."""
        out: dict[str, Any] = {
            "clean": _plain(self.clean),
            "corrupted": _plain(self.corrupted),
            "answer": _plain(self.answer),
        }
        if self.wrong is not None:
            out["wrong"] = _plain(self.wrong)
        if self.positions:
            out["positions"] = dict(self.positions)
        out.update(self.meta)
        return out


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def describe(value) -> str:
    """A short, one-line ``repr`` of a cell for error messages."""
    text = repr(_plain(value))
    return text if len(text) <= 80 else text[:77] + "..."


def _missing(value) -> bool:
    """None, or the NaN a DataFrame or a CSV reader puts in an empty cell."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _is_id(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _prompt(value, column: str, where: str) -> Prompt:
    if isinstance(value, str):
        if not value:
            raise TaskError(f"{where}: '{column}' is empty; give some text or token ids")
        return value
    if isinstance(value, (list, tuple)) and value and all(_is_id(v) for v in value):
        ids = tuple(int(v) for v in value)
        if min(ids) < 0:
            raise TaskError(f"{where}: '{column}' has a negative token id {min(ids)}")
        return ids
    if isinstance(value, (list, tuple)) and not value:
        raise TaskError(f"{where}: '{column}' is an empty list; give some text or token ids")
    raise TaskError(
        f"{where}: '{column}' must be text or a list of token ids, got {describe(value)}"
    )


def _token(value, column: str, where: str) -> str | int:
    if _is_id(value):
        if value < 0:
            raise TaskError(f"{where}: '{column}' has a negative token id {value}")
        return int(value)
    if isinstance(value, str):
        if not value:
            raise TaskError(f"{where}: '{column}' is empty; give one token such as ' Mary'")
        return value
    raise TaskError(
        f"{where}: '{column}' must be one token (text or an id) or a list of "
        f"tokens, got {describe(value)}"
    )


def _answer(value, column: str, where: str) -> Answer:
    if isinstance(value, (list, tuple)):
        if not value:
            raise TaskError(f"{where}: '{column}' is an empty list; give at least one token")
        items = tuple(_token(v, column, where) for v in value)
        return items[0] if len(items) == 1 else items  # a list of one token is that token
    return _token(value, column, where)


def _positions(value, where: str) -> dict[str, int]:
    if _missing(value):
        return {}
    if not isinstance(value, Mapping):
        raise TaskError(
            f"{where}: 'positions' must map labels to token indices, e.g. "
            f'{{"IO": 4, "END": -1}}, got {describe(value)}'
        )
    out = {}
    for label, index in value.items():
        if not isinstance(label, str) or not label:
            raise TaskError(f"{where}: position labels must be non-empty text, got {label!r}")
        if not _is_id(index):
            raise TaskError(
                f"{where}: position {label!r} must be an integer index, got {describe(index)}"
            )
        out[label] = int(index)
    return out


def row_from_record(record: Mapping[str, Any], where: str) -> TaskRow:
    """Check one record (a JSON object, a CSV row, a dict) and build its row.

    ``where`` names the row in messages, e.g. ``"task.jsonl row 3"``.
    """
    if not isinstance(record, Mapping):
        raise TaskError(
            f"{where}: a row must be an object with the columns "
            f"{', '.join(REQUIRED)}, got {describe(record)}"
        )
    for column in REQUIRED:
        if column in record and _missing(record[column]):
            raise TaskError(f"{where}: '{column}' is empty; every row needs {', '.join(REQUIRED)}")
        if column not in record:
            present = ", ".join(map(str, record)) or "none"
            raise TaskError(
                f"{where} has no '{column}' column (columns: {present}); a task "
                f"row needs {', '.join(REQUIRED)} (wrong, positions optional)"
            )
    wrong = record.get("wrong")
    meta = {str(k): v for k, v in record.items() if k not in COLUMNS and not _missing(v)}
    return TaskRow(
        clean=_prompt(record["clean"], "clean", where),
        corrupted=_prompt(record["corrupted"], "corrupted", where),
        answer=_answer(record["answer"], "answer", where),
        wrong=None if _missing(wrong) else _answer(wrong, "wrong", where),
        positions=_positions(record.get("positions"), where),
        meta=meta,
    )
