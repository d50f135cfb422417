"""``interp graph --task FILE``: the task graph's files, which equal the library's pruned task
graph; an unreadable or invalid task file exits 2 before the model loads."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import interp
from interp.cli import main
from interp.tasks import induction
from tests.cli.test_cli_contract import no_loading  # noqa: F401

BUNDLED = ["--model", "tiny-induction", "--transcoders", "tiny-induction-transcoders"]


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    model = interp.load_model("tiny-induction")
    path = tmp_path_factory.mktemp("task") / "task.jsonl"
    induction(model, 2, seed=0, seq_len=4).to_jsonl(path)
    return path


def test_task_graph_files_equal_the_library(task_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["graph", *BUNDLED, "--task", str(task_file), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["edges.csv", "nodes.csv", "summary.json"]
    model = interp.load_model("tiny-induction")
    tc = interp.load_transcoders("tiny-induction-transcoders")
    pruned = interp.attribution_graph(model, interp.Task.from_jsonl(task_file), tc).prune()
    nodes = pd.read_csv(out / "nodes.csv", keep_default_na=False, na_values=[""])
    assert nodes["position"].tolist() == pruned.nodes["position"].tolist()
    assert nodes["count"].tolist() == pruned.nodes["count"].tolist()
    edges = pd.read_csv(out / "edges.csv").sort_values(["target", "source"], ignore_index=True)
    expected = pruned.edges.sort_values(["target", "source"], ignore_index=True)
    assert edges[["target", "source", "count"]].equals(expected[["target", "source", "count"]])
    # CSV writes float64 with 17 significant digits: read back exactly
    assert (edges["weight"] == expected["weight"]).all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"] == 2 and summary["edges"]["kept"] == len(pruned.edges)
    assert "2 rows:" in capsys.readouterr().err


@pytest.mark.usefixtures("no_loading")
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "--task: no task file"),
        ("", "is empty"),
        ('{"clean": "a b"}\n', "has no 'corrupted' column"),
    ],
)
def test_bad_task_file_exits_2_before_loading(content, message, tmp_path, capsys):
    path = tmp_path / "missing.jsonl"
    if content is not None:
        path.write_text(content)
    code = main(["graph", *BUNDLED, "--task", str(path), "--out", str(tmp_path / "o")])
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.usefixtures("no_loading")
def test_text_with_task_exits_2(task_file, tmp_path, capsys):
    extra = ["--task", str(task_file), "--text", str(task_file), "--out", str(tmp_path / "o")]
    assert main(["graph", *BUNDLED, *extra]) == 2
    assert "--text is not used with --task" in capsys.readouterr().err


def test_attention_writes_head_loadings(task_file, tmp_path):
    out = tmp_path / "out"
    extra = ["--task", str(task_file), "--attention", "--out", str(out)]
    assert main(["graph", *BUNDLED, *extra]) == 0
    heads = pd.read_csv(out / "heads.csv")
    edges = pd.read_csv(out / "edges.csv").set_index(["target", "source"])["weight"]
    sums = heads.groupby(["target", "source"])["weight"].sum()
    # each row's loadings sum to its float32 edge within ~1e-5 of the largest weight
    assert (sums - edges.reindex(sums.index)).abs().max() <= 1e-5 * edges.abs().max()


def test_rows_the_tokenizer_refuses_exit_2(tmp_path, capsys):
    path = tmp_path / "task.jsonl"
    path.write_text('{"clean": [1, 2, 999999], "corrupted": [1, 2, 3], "answer": [4]}\n')
    code = main(["graph", *BUNDLED, "--task", str(path), "--out", str(tmp_path / "o")])
    assert code == 2 and "must lie in [0, 2047]" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
