"""`interp patch`: the files it writes, their agreement with the library, clean failures."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import interp.models.loading
from interp.cli import main
from interp.interventions import COLUMNS, logit_diff, patch_activations

CLEAN = "def add(a, b): return add(a, b)"
CORRUPTED = "def sub(x, y): return add(a, b)"


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    out = tmp_path_factory.mktemp("patch") / "result"
    argv = [
        "patch",
        "--clean",
        CLEAN,
        "--corrupted",
        CORRUPTED,
        "--answer",
        ")",
        "--wrong",
        ",",
        "--sites",
        "resid_pre,heads",
        "--method",
        "both",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    return out


def test_writes_csv_summary_and_report(out):
    table = pd.read_csv(out / "patching.csv")
    assert list(table.columns) == COLUMNS
    assert set(table["method"]) == {"exact", "attribution"}
    summary = json.loads((out / "summary.json").read_text())
    for key in ("clean_metric", "corrupted_metric", "sites", "method", "direction", "metric"):
        assert key in summary
    assert summary["sites"] == ["resid_pre", "heads"] and summary["direction"] == "denoising"
    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "Activation patching" in page
    assert sorted(p.name for p in out.iterdir()) == ["patching.csv", "report.html", "summary.json"]


def test_numbers_equal_the_library(out, bundled_model):
    model = bundled_model
    answer, wrong = (int(model.to_tokens(t, prepend_bos=False)[0, 0]) for t in (")", ","))
    frame = patch_activations(
        model,
        CLEAN,
        CORRUPTED,
        logit_diff(answer, wrong),
        sites=["resid_pre", "heads"],
        method="both",
    )
    table = pd.read_csv(out / "patching.csv")
    assert (table["metric"] - frame["metric"]).abs().max() < 1e-9
    summary = json.loads((out / "summary.json").read_text())
    assert summary["clean_metric"] == pytest.approx(frame.attrs["clean_metric"])
    heads = table[table["site"] == "head"]
    assert heads["pos"].isna().all() and heads["head"].notna().all()


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--corrupted", "def sub(x): return add(a, b)"], "same number of tokens"),
        (["--answer", "return add"], "tokenises to"),
        (["--wrong", ")"], "same token as --answer"),
    ],
)
def test_usage_errors_after_loading_are_one_line_and_write_nothing(tmp_path, capsys, argv, match):
    base = {"--clean": CLEAN, "--corrupted": CORRUPTED, "--answer": ")"}
    base.update(dict(zip(argv[::2], argv[1::2], strict=True)))
    out = tmp_path / "never"
    args = ["patch", *[x for pair in base.items() for x in pair], "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("interp patch: error:") and match in err[-1]
    assert not out.exists()


@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(interp.models.loading, "load_model", refuse)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--sites", "resid_pre,everything"], "unknown"),
        (["--clean", ""], "--clean is empty"),
        (["--wrong", ""], "--wrong is empty"),
    ],
)
def test_bad_arguments_are_refused_before_loading(tmp_path, capsys, no_loading, argv, match):
    base = {"--clean": CLEAN, "--corrupted": CORRUPTED, "--answer": ")"}
    base.update(dict(zip(argv[::2], argv[1::2], strict=True)))
    args = ["patch", *[x for pair in base.items() for x in pair], "--out", str(tmp_path / "x")]
    assert main(args) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_the_length_error_shows_both_tokenisations(tmp_path, capsys):
    args = [
        "patch",
        "--clean",
        CLEAN,
        "--corrupted",
        "def f(): pass",
        "--answer",
        ")",
        "--out",
        str(tmp_path / "x"),
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "clean has" in err and "corrupted has" in err and "'def'" in err and "pass" in err


def test_out_must_be_a_folder(tmp_path, no_loading):
    target = tmp_path / "file"
    target.write_text("keep me")
    args = [
        "patch",
        "--clean",
        CLEAN,
        "--corrupted",
        CORRUPTED,
        "--answer",
        ")",
        "--out",
        str(target),
    ]
    assert main(args) == 2
    assert target.read_text() == "keep me"


def test_a_rerun_replaces_its_files_and_keeps_others(out, tmp_path):
    target = tmp_path / "again"
    target.mkdir()
    for name in ("patching.csv", "summary.json", "report.html", "notes.txt"):
        (target / name).write_text(f"old {name}")
    args = [
        "patch",
        "--clean",
        CLEAN,
        "--corrupted",
        CORRUPTED,
        "--answer",
        ")",
        "--wrong",
        ",",
        "--sites",
        "resid_pre,heads",
        "--method",
        "both",
        "--out",
        str(target),
    ]
    assert main(args) == 0
    assert (target / "notes.txt").read_text() == "old notes.txt"
    assert (target / "patching.csv").read_bytes() == (out / "patching.csv").read_bytes()
    assert not [p for p in target.iterdir() if p.name.startswith(".")]
