"""interp.tasks: Task files and records, their round trips, and structure errors.

Structure is checked without a tokenizer; the example file is also validated on a GPT-2-like
tokenizer (tests/task_models.py, where names and two-digit years are one token). Tokenisation,
padded batches and metrics: tests/tasks/test_tasks_tokens.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

import interp
from interp.tasks import (
    Task,
    TaskError,
    TaskRow,
)
from tests.task_models import IOI, SHORT, gpt2_like_model

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "task.jsonl"


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return gpt2_like_model(tmp_path_factory.mktemp("gpt2-like"))


def _records():
    """Every feature: text and ids, single and list answers, positions, metadata."""
    return [
        dict(IOI, template="ioi", pattern="ABBA"),
        {
            "clean": [0, 5, 6, 7],
            "corrupted": [0, 8, 9, 7],
            "answer": [11, 12],
            "wrong": 13,
            "positions": {"END": 3},
            "template": "ids",
        },
        {
            "clean": "[1, 2]",
            "corrupted": '"quoted"',
            "answer": ["32", "33"],
            "wrong": "17",
            "template": "32",
            "year": 32,
        },  # text that looks like JSON
    ]


def _one_line(exc) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


# ---- building and round trips ----------------------------------------------------------------


def test_from_records_keeps_every_column():
    task = Task.from_records(_records())
    assert len(task) == 3 and task.has_wrong and task.labels == ("IO", "S1", "S2", "END")
    row = task[1]
    assert row.clean == (0, 5, 6, 7) and row.answer == (11, 12) and row.wrong == 13
    assert task[0].meta == {"template": "ioi", "pattern": "ABBA"}
    assert task[2].meta == {"template": "32", "year": 32}
    assert Task.from_records(task.to_records()) == task
    assert isinstance(task[1:], Task) and len(task[1:]) == 2
    assert interp.Task is Task
    assert "3 rows" in repr(task) and "positions IO, S1, S2, END" in repr(task)


def test_a_list_of_one_token_is_that_token():
    task = Task.from_records([dict(SHORT, answer=[" to"], wrong=[7])])
    assert task[0].answer == " to" and task[0].wrong == 7


def test_jsonl_round_trip(tmp_path):
    task = Task.from_records(_records())
    path = task.to_jsonl(tmp_path / "sub" / "task.jsonl")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3 and json.loads(lines[1])["clean"] == [0, 5, 6, 7]
    assert Task.from_jsonl(path) == task


def test_csv_round_trip_keeps_types(tmp_path):
    task = Task.from_records(_records())
    path = task.to_csv(tmp_path / "task.csv")
    again = Task.from_csv(path)
    assert again == task
    assert again[2].clean == "[1, 2]" and again[2].corrupted == '"quoted"'  # still text
    assert again[2].meta == {"template": "32", "year": 32}
    assert again[1].wrong == 13  # an id, written as [13]: a bare 13 would be the text "13"
    header = path.read_text(encoding="utf-8").splitlines()[0]
    assert header == "clean,corrupted,answer,wrong,positions,template,pattern,year"


def test_hand_written_csv(tmp_path):
    path = tmp_path / "task.csv"
    path.write_text(
        "clean,corrupted,answer,positions,note\n"
        'When Mary and John went,When Alice and Eric went, to,"{""END"": -1}",a\n'
        'The war lasted,The war lasted,"["" 17"", ""32""]",,\n',
        encoding="utf-8",
    )
    task = Task.from_csv(path)
    assert not task.has_wrong and task[0].positions == {"END": -1}
    assert task[0].meta == {"note": "a"} and task[1].meta == {}
    assert task[1].answer == (" 17", "32")


def test_frame_round_trip():
    task = Task.from_records(_records())
    frame = task.to_frame()
    assert list(frame.columns) == [
        "clean",
        "corrupted",
        "answer",
        "wrong",
        "positions",
        "template",
        "pattern",
        "year",
    ]
    assert frame.loc[1, "pattern"] is None  # missing metadata is absent, not NaN
    assert Task.from_frame(frame) == task
    # a frame read from elsewhere: numpy ints and NaN for missing metadata
    other = pd.DataFrame(
        {
            "clean": ["a b", "c d"],
            "corrupted": ["e f", "g h"],
            "answer": [" x", " y"],
            "year": [17, float("nan")],
        }
    )
    rows = Task.from_frame(other).rows
    assert rows[0].meta == {"year": 17.0} and rows[1].meta == {}


# ---- structure errors (no tokenizer needed) --------------------------------------------------


def test_empty_files_are_refused(tmp_path):
    for name, text in [
        ("a.jsonl", ""),
        ("b.jsonl", "\n  \n"),
        ("c.csv", ""),
        ("d.csv", "clean,corrupted,answer\n"),
    ]:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        read = Task.from_csv if name.endswith("csv") else Task.from_jsonl
        with pytest.raises(TaskError, match=f"{name} is empty"):
            read(path)
    with pytest.raises(TaskError, match="no rows"):
        Task.from_records([])


def test_malformed_json_line_names_its_line(tmp_path):
    path = tmp_path / "task.jsonl"
    good = json.dumps(SHORT)
    path.write_text(f"{good}\n\n{good[:-5]}\n", encoding="utf-8")
    with pytest.raises(TaskError) as exc:
        Task.from_jsonl(path)
    assert re.search(r"task\.jsonl line 3: malformed JSON \(.+ at column \d+\)", _one_line(exc))


def test_missing_columns_are_named(tmp_path):
    path = tmp_path / "task.jsonl"
    row = {k: v for k, v in SHORT.items() if k != "answer"}
    path.write_text(f"{json.dumps(SHORT)}\n\n{json.dumps(row)}\n", encoding="utf-8")
    with pytest.raises(TaskError) as exc:
        Task.from_jsonl(path)
    assert "row 2 (line 3) has no 'answer' column (columns: clean, corrupted, wrong)" in _one_line(
        exc
    )
    csv_path = tmp_path / "task.csv"
    csv_path.write_text("clean,answer\na,b\n", encoding="utf-8")
    with pytest.raises(TaskError, match="has no 'corrupted' column"):
        Task.from_csv(csv_path)
    with pytest.raises(TaskError, match="row 1: 'answer' is empty"):
        Task.from_frame(pd.DataFrame([dict(SHORT, answer=None)]))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"clean": ""}, "row 2: 'clean' is empty"),
        ({"corrupted": [1, "a"]}, "row 2: 'corrupted' must be text or a list of token ids"),
        ({"answer": []}, "row 2: 'answer' is an empty list"),
        ({"answer": 1.5}, "row 2: 'answer' must be one token"),
        ({"wrong": [-3, 4]}, "row 2: 'wrong' has a negative token id -3"),
        ({"positions": [1, 2]}, "row 2: 'positions' must map labels to token indices"),
        ({"positions": {"IO": "one"}}, "row 2: position 'IO' must be an integer index"),
        ({"wrong": None}, "row 2 has no 'wrong' but row 1 has one"),
    ],
)
def test_malformed_rows_are_refused(change, message):
    with pytest.raises(TaskError) as exc:
        Task.from_records([SHORT, dict(SHORT, **change)])
    assert message in _one_line(exc)


def test_the_example_file_loads_and_validates(gpt2):
    task = Task.from_jsonl(EXAMPLE)
    assert len(task) == 3 and task.has_wrong
    batch = task.tokens(gpt2)
    ids = batch.clean.tolist()
    for i in (0, 1):  # IOI rows: the positions point at the names
        assert ids[i][batch.positions["IO"][i]] == batch.answers[i][0]
        assert (
            ids[i][batch.positions["S1"][i]]
            == ids[i][batch.positions["S2"][i]]
            == batch.wrong[i][0]
        )
    assert gpt2.tokenizer.decode(ids[2][batch.positions["YY"][2]]) == "32"
    assert len(batch.answers[2]) + len(batch.wrong[2]) == 100
    # docs/tasks.md shows this file as it is
    doc = (ROOT / "docs" / "tasks.md").read_text(encoding="utf-8")
    shown = re.search(r"```jsonl\n(.*?)```", doc, re.S)[1]
    assert shown == EXAMPLE.read_text(encoding="utf-8")


def test_a_task_row_records_only_what_is_set():
    row = TaskRow(clean="a", corrupted="b", answer=" c")
    assert row.record() == {"clean": "a", "corrupted": "b", "answer": " c"}


def test_subpackages_are_reached_from_the_package():
    """``interp.tasks.ioi(...)`` after a bare ``import interp`` (a fresh interpreter: in this
    one another test may already have imported the subpackage)."""
    import subprocess
    import sys

    code = (
        "import interp; assert callable(interp.tasks.ioi); "
        "assert interp.interventions.patch_activations\n"
        "try:\n    interp.no_such_name\nexcept AttributeError:\n    pass\n"
        "else:\n    raise SystemExit('an unknown name must raise AttributeError')"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
