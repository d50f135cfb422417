"""Task files: JSONL (one JSON object per line) and CSV, with the columns ``clean``,
``corrupted``, ``answer`` and optionally ``wrong`` and ``positions``; any other column is
metadata, kept with its row.

JSON says what a cell is. CSV cells are text, so a CSV cell is read as JSON only where text
would be ambiguous: a prompt or answer cell that starts with ``[`` or ``"`` and parses as JSON
(``[50256, 464]`` are token ids, ``[" 18", " 19"]`` a list of answers, ``[464]`` one answer
id: a bare ``464`` is the text "464"), the ``positions`` cell (a JSON object), and metadata
cells that parse as JSON (``3`` is a number, ``ABBA`` text). Writing does the reverse, so a
CSV round trip gives back the same rows. An empty cell is a missing value.

Files are written whole or not at all: to a temporary file beside the target, then renamed.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from interp.tasks.rows import COLUMNS, REQUIRED, TaskError, TaskRow, row_from_record

__all__ = ["read_jsonl", "read_csv", "write_jsonl", "write_csv"]

_TOKEN_COLUMNS = ("clean", "corrupted", "answer", "wrong")


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise TaskError(f"no task file {path}") from exc
    except UnicodeDecodeError as exc:
        raise TaskError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


def _empty(path: Path) -> TaskError:
    return TaskError(
        f"{path} is empty: a task file needs at least one row with the columns "
        f"{', '.join(REQUIRED)}"
    )


def read_jsonl(path: str | os.PathLike) -> list[TaskRow]:
    """The rows of a JSONL task file; blank lines are skipped."""
    path = Path(path)
    rows = []
    for line_no, line in enumerate(_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskError(
                f"{path} line {line_no}: malformed JSON ({exc.msg} at column "
                f"{exc.colno}); each line must be one JSON object"
            ) from exc
        rows.append(row_from_record(record, f"{path} row {len(rows) + 1} (line {line_no})"))
    if not rows:
        raise _empty(path)
    return rows


def _decode_cell(column: str, cell: str) -> Any:
    if cell == "":
        return None
    if column in _TOKEN_COLUMNS and not cell.startswith(("[", '"')):
        return cell
    try:
        return json.loads(cell)
    except json.JSONDecodeError:
        if column == "positions":
            raise
        return cell


def _encode_cell(column: str, value: Any) -> str:
    if value is None:
        return ""
    if column in _TOKEN_COLUMNS and isinstance(value, int):
        return json.dumps([value])  # a bare number in a token column would read as text
    if isinstance(value, str):
        if column not in _TOKEN_COLUMNS or value.startswith(("[", '"')):
            try:
                json.loads(value)
            except json.JSONDecodeError:
                return value
            return json.dumps(value, ensure_ascii=False)  # would be read as JSON: quote it
        return value
    return json.dumps(value, ensure_ascii=False)


def read_csv(path: str | os.PathLike) -> list[TaskRow]:
    """The rows of a CSV task file (a header row, then one row per pair)."""
    path = Path(path)
    reader = csv.DictReader(io.StringIO(_text(path), newline=""))
    header = reader.fieldnames
    if not header:
        raise _empty(path)
    for column in REQUIRED:
        if column not in header:
            raise TaskError(
                f"{path} has no '{column}' column (columns: {', '.join(header)}); "
                f"a task file needs {', '.join(REQUIRED)} (wrong, positions "
                "optional)"
            )
    rows = []
    for number, raw in enumerate(reader, start=1):
        where = f"{path} row {number} (line {reader.line_num})"
        if None in raw:
            raise TaskError(f"{where}: more cells than the header's {len(header)} columns")
        record = {}
        for column, cell in raw.items():
            try:
                record[column] = _decode_cell(column, cell or "")
            except json.JSONDecodeError as exc:
                raise TaskError(
                    f"{where}: '{column}' is not a JSON object ({exc.msg}); write "
                    'positions as {"IO": 4, "END": -1}'
                ) from exc
        rows.append(row_from_record(record, where))
    if not rows:
        raise _empty(path)
    return rows


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as file:
            file.write(text)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _lines(rows: Iterable[TaskRow]) -> Iterator[str]:
    for row in rows:
        yield json.dumps(row.record(), ensure_ascii=False) + "\n"


def write_jsonl(rows: Iterable[TaskRow], path: str | os.PathLike) -> Path:
    """Write rows as JSONL (UTF-8, one object per line); returns the path."""
    path = Path(path)
    try:
        text = "".join(_lines(rows))
    except TypeError as exc:  # metadata that JSON cannot hold
        raise TaskError(f"cannot write {path}: {exc}; metadata must be JSON values") from exc
    _write_atomic(path, text)
    return path


def write_csv(rows: Iterable[TaskRow], path: str | os.PathLike) -> Path:
    """Write rows as CSV: the task columns present, then metadata columns in order of first
    appearance; returns the path."""
    path = Path(path)
    records = [row.record() for row in rows]
    extra = list(dict.fromkeys(k for r in records for k in r if k not in COLUMNS))
    present = [c for c in COLUMNS if any(c in r for r in records)]
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=present + extra, lineterminator="\n")
    writer.writeheader()
    try:
        for record in records:
            writer.writerow({k: _encode_cell(k, v) for k, v in record.items()})
    except TypeError as exc:
        raise TaskError(f"cannot write {path}: {exc}; metadata must be JSON values") from exc
    _write_atomic(path, buffer.getvalue())
    return path
