"""`interp patch --task`, `--shard` and `interp merge`: the files equal the library's task
patching; 3 shards merged equal the whole run; bad task files and option mixes are refused
before loading (or, for the tokenizer's checks, before any forward pass) and write nothing."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import interp.models.loading
from interp import Task, patch_activations
from interp.cli import main
from interp.interventions.patching import TASK_COLUMNS
from interp.tasks import induction

SITES = "heads,resid_pre"
ATOL = 1e-6  # float32 per-row metrics; batches of different rows round differently


@pytest.fixture(scope="module")
def task_file(tmp_path_factory, bundled_model):
    path = tmp_path_factory.mktemp("task") / "induction.jsonl"
    induction(bundled_model, 7, seed=0, seq_len=5).to_jsonl(path)
    return path


@pytest.fixture(scope="module")
def whole(task_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "out"
    assert main(["patch", "--task", str(task_file), "--sites", SITES, "--out", str(out)]) == 0
    return out


def close(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a[TASK_COLUMNS[:5]], b[TASK_COLUMNS[:5]])
    for column in ("metric", "recovered", "recovered_sem"):
        assert np.allclose(a[column], b[column], atol=ATOL, rtol=0, equal_nan=True), column


def test_task_run_equals_the_library(whole, task_file, bundled_model):
    frame = patch_activations(bundled_model, Task.from_jsonl(task_file), sites=SITES.split(","))
    table = pd.read_csv(whole / "patching.csv")
    assert list(table.columns) == TASK_COLUMNS
    close(table.astype({"head": "Int64", "pos": "Int64"}), frame)
    summary = json.loads((whole / "summary.json").read_text())
    assert summary["task"]["n_rows"] == 7 and summary["task"]["source"] == str(task_file)
    assert summary["clean_metric"] == pytest.approx(frame.attrs["clean_metric"], abs=ATOL)
    assert summary["sanity"] == [] and len(summary["corrupted_tokens"]) == len(summary["tokens"])
    page = (whole / "report.html").read_text()
    assert "standard error" in page and "recovered_sd" in page


def test_three_shards_merge_into_the_whole_run(whole, task_file, tmp_path, capsys):
    folders = []
    for i in range(3):
        folder = tmp_path / f"shard{i}"
        argv = ["patch", "--task", str(task_file), "--sites", SITES, "--shard", f"{i}/3"]
        assert main([*argv, "--out", str(folder)]) == 0
        assert [p.name for p in folder.iterdir()] == ["partial.json"]
        folders.append(str(folder))
    merged = tmp_path / "merged"
    assert main(["merge", *folders[::-1], "--out", str(merged)]) == 0
    assert sorted(p.name for p in merged.iterdir()) == [
        "patching.csv",
        "report.html",
        "summary.json",
    ]
    close(pd.read_csv(merged / "patching.csv"), pd.read_csv(whole / "patching.csv"))
    one, three = (json.loads((d / "summary.json").read_text()) for d in (whole, merged))
    assert three["task"]["shards"] == 3 and three["tokens"] == one["tokens"]
    assert "merged" not in capsys.readouterr().err
    # a shard missing is refused, nothing written
    assert main(["merge", *folders[:2], "--out", str(tmp_path / "never")]) == 2
    assert "shard(s) 2 missing" in capsys.readouterr().err
    assert main(["merge", str(tmp_path), "--out", str(tmp_path / "never")]) == 2
    assert "has no partial.json" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_pair_summary_lists_corrupted_tokens_and_pos_shows_its_token(tmp_path, capsys):
    out = tmp_path / "pair"
    argv = ["patch", "--clean", "the data open path of the data open"]
    argv += ["--corrupted", "the data value path of the data open", "--answer", " path"]
    assert main([*argv, "--sites", "resid_pre", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["corrupted_tokens"][2] == " value" and summary["tokens"][2] == " open"
    captured = capsys.readouterr()
    assert "3 ' path'" in captured.out or "7 ' open'" in captured.out
    assert "warning: Without --wrong" in captured.err  # the probability alone: a warning
    assert any("Without --wrong" in w for w in summary["sanity"])


def test_sanity_warnings_reach_the_terminal_and_the_report(tmp_path, bundled_model, capsys):
    records = induction(bundled_model, 4, seed=0, seq_len=5).to_records()
    records[1]["clean"], records[1]["corrupted"] = records[1]["corrupted"], records[1]["clean"]
    path = tmp_path / "swapped.jsonl"
    Task.from_records(records).to_jsonl(path)
    out = tmp_path / "out"
    assert main(["patch", "--task", str(path), "--sites", "heads", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert (
        "warning: The clean answer_logit is not above the corrupted one (1 of 4 rows: row 2)" in err
    )
    assert 'class="interp-warning"' in (out / "report.html").read_text()


@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(interp.models.loading, "load_model", refuse)


BAD_FILES = {
    "empty.jsonl": ("", "is empty"),
    "broken.jsonl": (
        '{"clean": "a", "corrupted": "b", "answer": "c"}\n{"clean": \n',
        "line 2: malformed JSON",
    ),
    "missing.jsonl": ('{"clean": "a", "corrupted": "b"}\n', "has no 'answer' column"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_task_files_are_refused_before_loading(name, tmp_path, capsys, no_loading):
    text, message = BAD_FILES[name]
    (tmp_path / name).write_text(text)
    out = tmp_path / "out"
    assert main(["patch", "--task", str(tmp_path / name), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("interp patch: error: --task") and message in err[0]
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--clean", "a b"], "leave out --clean"),
        (["--answer", " b", "--wrong", " c"], "leave out --answer, --wrong"),
        (["--shard", "7/8"], "--shard 7/8 has no rows"),
    ],
)
def test_option_mixes_are_refused_before_loading(
    extra, message, task_file, tmp_path, capsys, no_loading
):
    out = tmp_path / "out"
    assert main(["patch", "--task", str(task_file), *extra, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--shard", "0/2", "--clean", "a", "--corrupted", "b", "--answer", "c"],
            "--shard is for --task",
        ),
        (["--clean", "a", "--corrupted", "b"], "pass --answer"),
    ],
)
def test_task_options_without_a_task_are_refused(argv, message, tmp_path, capsys, no_loading):
    assert main(["patch", *argv, "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("text", ["3/3", "x/2", "1", "-1/2"])
def test_bad_shard_exits_2(text, task_file, tmp_path, no_loading):
    with pytest.raises(SystemExit) as info:
        main(["patch", "--task", str(task_file), "--shard", text, "--out", str(tmp_path / "o")])
    assert info.value.code == 2


def test_the_tokenizer_refuses_a_row_before_any_forward_pass(tmp_path, capsys, monkeypatch):
    from transformer_lens.model_bridge import TransformerBridge

    def refuse(*args, **kwargs):
        raise AssertionError("a forward pass ran before the task was checked")

    monkeypatch.setattr(TransformerBridge, "forward", refuse)
    path = tmp_path / "t.jsonl"
    row = {"clean": "def f(a, b):", "corrupted": "def g(a, b):", "answer": " return x"}
    path.write_text(json.dumps(row) + "\n")
    out = tmp_path / "out"
    assert main(["patch", "--task", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("interp patch: error: --task") and "row 1: 'answer'" in err
    assert not out.exists()


@pytest.mark.parametrize("command", ["patch", "attribute", "discover"])
def test_a_negative_shard_is_a_one_line_refusal_saying_what_a_shard_is(
    command, task_file, tmp_path, capsys, no_loading
):
    out = tmp_path / "o"
    argv = [command, "--task", str(task_file), "--shard", "-1/2", "--out", str(out)]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"interp {command}: error: argument --shard: a shard is I/N")
    assert "0 <= I < N" in last and "'-1/2'" in last
    assert not out.exists()


GENERATED = {  # interp task's kinds, as the bundled model can make them
    "induction": [],
    "greater-than": [],
    "ioi": ["--names", "self,file,data,list,name,key"],
}


@pytest.mark.parametrize("kind", sorted(GENERATED))
def test_every_task_interp_task_writes_is_patched(kind, tmp_path, bundled_model, capsys):
    path = tmp_path / f"{kind}.jsonl"
    assert main(["task", kind, "--n", "4", *GENERATED[kind], "--out", str(path)]) == 0
    task = Task.from_jsonl(path)
    named = ["--positions", "named"] if task.tokens(bundled_model).positions else []
    out = tmp_path / "out"
    argv = ["patch", "--task", str(path), "--sites", SITES, *named, "--out", str(out)]
    assert main(argv) == 0
    got = pd.read_csv(out / "patching.csv", dtype={"pos": "string"}).astype({"head": "Int64"})
    want = patch_activations(
        bundled_model, task, sites=SITES.split(","), positions="named" if named else None
    )
    labels = want["pos"].astype("string")  # IO, S2, ... or indices, as the file writes them
    assert got["pos"].fillna("").tolist() == labels.fillna("").tolist()
    close(got.assign(pos=want["pos"]), want)
    if kind == "greater-than":  # rows of 18 to 21 tokens: by index, the cells mean nothing
        assert main(["patch", "--task", str(path), "--sites", SITES, "--out", str(out)]) == 2
        assert "pass --positions named" in capsys.readouterr().err.strip().splitlines()[-1]
