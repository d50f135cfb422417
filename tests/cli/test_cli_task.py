"""`interp task`: the file it writes is the generator's task, checked; refusals write nothing."""

from __future__ import annotations

import pytest

from interp import Task
from interp.cli import main
from interp.tasks import greater_than, induction


def test_induction_file_is_the_generators_task(tmp_path, bundled_model, capsys):
    out = tmp_path / "induction.jsonl"
    assert main(["task", "induction", "--n", "6", "--seed", "3", "--out", str(out)]) == 0
    assert Task.from_jsonl(out) == induction(bundled_model, 6, seed=3)
    assert f"wrote {out}" in capsys.readouterr().out


def test_greater_than_and_a_rerun_replaces_the_file(tmp_path, bundled_model):
    out = tmp_path / "years.jsonl"
    out.write_text("old")
    assert main(["task", "greater-than", "--n", "3", "--out", str(out)]) == 0
    assert Task.from_jsonl(out) == greater_than(bundled_model, 3, seed=0)
    assert [p.name for p in tmp_path.iterdir()] == ["years.jsonl"]


def test_ioi_without_names_for_this_tokenizer_exits_2(tmp_path, capsys):
    out = tmp_path / "ioi.jsonl"
    assert main(["task", "ioi", "--n", "4", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("interp task: error: ioi needs 5 or more names") and "--names" in err
    assert not out.exists()
    names = "self,file,data,list,name,key"
    assert main(["task", "ioi", "--n", "4", "--names", names, "--out", str(out)]) == 0
    assert len(Task.from_jsonl(out)) == 4


@pytest.fixture
def no_loading(monkeypatch):
    import interp.models.loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(interp.models.loading, "load_model", refuse)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["induction", "--out", "t.csv"], "should end in .jsonl"),
        (["greater-than", "--seq-len", "4", "--out", "t.jsonl"], "--seq-len is for induction"),
        (["induction", "--names", "a,b", "--out", "t.jsonl"], "--names is for ioi"),
        (["ioi", "--names", " , ", "--out", "t.jsonl"], "--names ' , ' is empty"),
    ],
)
def test_refused_before_loading(argv, message, tmp_path, monkeypatch, capsys, no_loading):
    monkeypatch.chdir(tmp_path)
    assert main(["task", *argv]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv", [["induction", "--n", "0"], ["nonsense"], ["induction", "--seed", "-1"]]
)
def test_bad_options_exit_2(argv, tmp_path, no_loading):
    with pytest.raises(SystemExit) as info:
        main(["task", *argv, "--out", str(tmp_path / "t.jsonl")])
    assert info.value.code == 2
    assert list(tmp_path.iterdir()) == []


def test_a_folder_is_refused(tmp_path, no_loading, capsys):
    assert main(["task", "induction", "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
