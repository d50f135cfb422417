"""`interp attribute --task`, `--shard` and `interp merge`: the files equal the library's task
attribution; 3 shards merged equal the whole run; a task of one row equals the pair command;
every row's components add up to its logit; bad task files and option mixes are refused
before loading (or, for the tokenizer's checks, before any forward pass) and write nothing."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import interp.models.loading
from interp import Task, logit_attribution
from interp.cli import main
from interp.tasks import induction

ATOL = 1e-6  # float32 contributions; whole vs library differ only in float64 summation
PROMPT = "import os\nimport sys\nimport os\nimport"  # docs/attribution.md's pair
KEYS = ["component", "layer", "head"]


@pytest.fixture(scope="module")
def task_file(tmp_path_factory, bundled_model):
    path = tmp_path_factory.mktemp("task") / "induction.jsonl"
    induction(bundled_model, 7, seed=0, seq_len=5).to_jsonl(path)
    return path


@pytest.fixture(scope="module")
def whole(task_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "out"
    assert main(["attribute", "--task", str(task_file), "--out", str(out)]) == 0
    return out


@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(interp.models.loading, "load_model", refuse)


def read(folder) -> pd.DataFrame:
    return pd.read_csv(folder / "attribution.csv").astype({"layer": "Int64", "head": "Int64"})


def test_task_run_equals_the_library(whole, task_file, bundled_model):
    frame = logit_attribution(bundled_model, Task.from_jsonl(task_file))
    table = read(whole)
    assert list(table.columns) == [*KEYS, "contribution", "contribution_sem"]
    pd.testing.assert_frame_equal(table[KEYS], frame[KEYS].reset_index(drop=True))
    for column in ("contribution", "contribution_sem"):
        assert np.allclose(table[column], frame[column], atol=ATOL, rtol=0), column
    # the mean of every row's components is the mean of every row's logit (the identity)
    summary = json.loads((whole / "summary.json").read_text())
    total = table.loc[table["component"] == "total", "contribution"].item()
    parts = table.loc[table["component"] != "total", "contribution"].sum()
    assert parts == pytest.approx(total, abs=1e-4)
    assert total == pytest.approx(np.mean(summary["reference_rows"]), abs=1e-4)
    assert summary["identity_error"] == max(summary["identity_rows"]) <= 1e-4
    assert summary["task"]["n_rows"] == 7 and summary["task"]["shards"] == 1
    assert summary["explained"] == "answer's logit"  # induction rows have no wrong token
    page = (whole / "report.html").read_text()
    assert "standard error" in page and "contribution_sem" in page and "identity" in page


def test_the_induction_head_carries_the_answer(whole):
    table = read(whole).set_index(["component", "layer", "head"])
    heads = table.loc["head"]
    best = heads["contribution"].idxmax()
    assert best == (1, 0)  # L1H0, the bundled model's induction head
    assert heads.loc[best, "contribution"] > 5 * heads.loc[best, "contribution_sem"] > 0


def test_three_shards_merge_into_the_whole_run(whole, task_file, tmp_path, capsys):
    folders = []
    for i in range(3):
        folder = tmp_path / f"shard{i}"
        argv = ["attribute", "--task", str(task_file), "--shard", f"{i}/3"]
        assert main([*argv, "--out", str(folder)]) == 0
        assert [p.name for p in folder.iterdir()] == ["partial.json"]
        folders.append(str(folder))
    merged = tmp_path / "merged"
    assert main(["merge", *folders[::-1], "--out", str(merged)]) == 0
    names = sorted(p.name for p in merged.iterdir())
    assert names == ["attribution.csv", "report.html", "summary.json"]
    one, three = read(whole), read(merged)
    pd.testing.assert_frame_equal(one[KEYS], three[KEYS])
    for column in ("contribution", "contribution_sem"):  # float64 sums in another order
        assert np.allclose(one[column], three[column], atol=1e-12, rtol=0), column
    first, second = (json.loads((d / "summary.json").read_text()) for d in (whole, merged))
    assert second["task"]["shards"] == 3
    assert second["reference_rows"] == first["reference_rows"]  # row order restored
    assert main(["merge", *folders[:2], "--out", str(tmp_path / "never")]) == 2
    assert "shard(s) 2 missing" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_per_row_writes_each_rows_table_and_shards_keep_it(task_file, tmp_path, bundled_model):
    rows = logit_attribution(bundled_model, Task.from_jsonl(task_file), per_row=True)
    whole = tmp_path / "whole"
    argv = ["attribute", "--task", str(task_file), "--per-row"]
    assert main([*argv, "--out", str(whole)]) == 0
    table = pd.read_csv(whole / "attribution_rows.csv").astype({"layer": "Int64", "head": "Int64"})
    assert list(table.columns) == ["row", *KEYS, "contribution"]
    pd.testing.assert_frame_equal(table[["row", *KEYS]], rows[["row", *KEYS]])
    assert np.allclose(table["contribution"], rows["contribution"], atol=ATOL, rtol=0)
    # each row's components (not the total) add up to that row's own logit
    summary = json.loads((whole / "summary.json").read_text())
    parts = table[table["component"] != "total"].groupby("row")["contribution"].sum()
    assert np.allclose(parts.to_numpy(), summary["reference_rows"], atol=1e-4, rtol=0)
    # the mean of the rows is the table without --per-row
    means = table.groupby(KEYS, sort=False, dropna=False)["contribution"].mean().to_numpy()
    assert np.allclose(means, read(whole)["contribution"], atol=1e-12, rtol=0)
    folders = []
    for i in range(2):
        folders.append(str(tmp_path / f"s{i}"))
        assert main([*argv, "--shard", f"{i}/2", "--out", folders[-1]]) == 0
    merged = tmp_path / "merged"
    assert main(["merge", *folders, "--out", str(merged)]) == 0
    assert (merged / "attribution_rows.csv").read_text() == (
        whole / "attribution_rows.csv"
    ).read_text()


def test_a_task_of_one_row_equals_the_pair_command(tmp_path, bundled_model):
    path = tmp_path / "one.jsonl"
    row = {"clean": PROMPT, "corrupted": PROMPT, "answer": " sys", "wrong": " os"}
    path.write_text(json.dumps(row) + "\n")
    task, pair = tmp_path / "task", tmp_path / "pair"
    assert main(["attribute", "--task", str(path), "--out", str(task)]) == 0
    argv = ["attribute", "--prompt", PROMPT, "--answer", " sys", "--wrong", " os"]
    assert main([*argv, "--out", str(pair)]) == 0
    one, two = read(task), read(pair)
    pd.testing.assert_frame_equal(one[KEYS], two[KEYS])
    assert np.allclose(one["contribution"], two["contribution"], atol=ATOL, rtol=0)
    assert one["contribution_sem"].isna().all()  # no spread over one row
    summary = json.loads((task / "summary.json").read_text())
    assert summary["explained"] == "logit difference answer - wrong"


BAD_FILES = {
    "empty.jsonl": ("", "is empty"),
    "broken.jsonl": (
        '{"clean": "a", "corrupted": "b", "answer": "c"}\n{"clean": \n',
        "line 2: malformed JSON",
    ),
    "missing.jsonl": ('{"clean": "a", "corrupted": "b"}\n', "has no 'answer' column"),
    "lists.jsonl": (
        '{"clean": "a", "corrupted": "b", "answer": " c"}\n'
        '{"clean": "a", "corrupted": "b", "answer": [" c", " d"]}\n',
        "row 2: 'answer' is a list of 2 tokens",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_task_files_are_refused_before_loading(name, tmp_path, capsys, no_loading):
    text, message = BAD_FILES[name]
    (tmp_path / name).write_text(text)
    out = tmp_path / "out"
    assert main(["attribute", "--task", str(tmp_path / name), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("interp attribute: error: --task")
    assert message in err[0]
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--prompt", "a b"], "leave out --prompt"),
        (["--answer", " b", "--wrong", " c"], "leave out --answer, --wrong"),
        (["--pos", "-2", "--top-k", "3"], "leave out --pos, --top-k"),
        (["--shard", "7/8"], "--shard 7/8 has no rows"),
    ],
)
def test_option_mixes_are_refused_before_loading(
    extra, message, task_file, tmp_path, capsys, no_loading
):
    out = tmp_path / "out"
    assert main(["attribute", "--task", str(task_file), *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shard", "0/2", "--prompt", "a", "--answer", "b"], "--shard is for --task"),
        (["--prompt", "a"], "pass --prompt and --answer"),
        (["--per-row", "--prompt", "a", "--answer", "b"], "--per-row is for --task"),
        ([], "or --task FILE.jsonl"),
    ],
)
def test_pair_options_without_a_task(argv, message, tmp_path, capsys, no_loading):
    assert main(["attribute", *argv, "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err


def test_the_tokenizer_refuses_a_row_before_any_forward_pass(tmp_path, capsys, monkeypatch):
    from transformer_lens.model_bridge import TransformerBridge

    def refuse(*args, **kwargs):
        raise AssertionError("a forward pass ran before the task was checked")

    monkeypatch.setattr(TransformerBridge, "forward", refuse)
    path = tmp_path / "t.jsonl"
    row = {"clean": "def f(a, b):", "corrupted": "def g(a, b):", "answer": " return x"}
    path.write_text(json.dumps(row) + "\n")
    out = tmp_path / "out"
    assert main(["attribute", "--task", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("interp attribute: error: --task") and "row 1: 'answer'" in err
    assert not out.exists()


def test_the_report_draws_error_bars_and_keeps_the_page_rules(whole):
    from tests.pages.test_html import parse
    from tests.pages.test_pages import figures

    path = whole / "report.html"
    drawn = figures(path)
    assert all(f["layout"]["title"]["text"].strip() for f in drawn)
    bars = next(f["data"][0] for f in drawn if f["data"][0]["type"] == "bar")
    table = read(whole)
    sems = table.set_index(table["contribution"].round(10))["contribution_sem"]
    for value, error in zip(bars["x"], bars["error_x"]["array"], strict=True):
        assert error == pytest.approx(sems[round(value, 10)], abs=1e-9)  # each bar's own sem
    heat = next(f["data"][0] for f in drawn if f["data"][0]["type"] == "heatmap")
    assert heat["zmid"] == 0 and heat["zmin"] == -heat["zmax"]
    parser = parse(path.read_text(encoding="utf-8"))
    assert "" not in parser.text["th"] and "<NA>" not in parser.text["td"]


def test_a_row_longer_than_the_context_is_refused_before_any_forward_pass(
    tmp_path, capsys, monkeypatch, bundled_model
):
    from transformer_lens.model_bridge import TransformerBridge

    def refuse(*args, **kwargs):
        raise AssertionError("a forward pass ran before the task was checked")

    monkeypatch.setattr(TransformerBridge, "forward", refuse)
    n = int(bundled_model.cfg.n_ctx) + 1
    rows = [{"clean": [3] * 4, "corrupted": [4] * 4, "answer": 5}]
    rows.append({"clean": [3] * n, "corrupted": [4] * n, "answer": 5})
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert main(["attribute", "--task", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("interp attribute: error: --task") and "row 2" in err
    assert f"{n} tokens but the model's context is {n - 1}" in err
    assert not out.exists()
