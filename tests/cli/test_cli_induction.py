"""`interp induction`: the files it writes, byte-for-byte reruns, and clean failures."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from interp.cli import main
from interp.induction.detect import COLUMNS


@pytest.fixture(scope="module")
def report_dir(gpt2_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("induction")
    argv = [
        "induction",
        "--model",
        str(gpt2_dir),
        "--out",
        str(out),
        "--seed",
        "3",
        "--seq-lens",
        "5,10",
        "--ablate-top",
        "2",
    ]
    assert main(argv) == 0
    return out, argv


def test_writes_csv_json_and_report(report_dir):
    out, _ = report_dir
    table = pd.read_csv(out / "head_scores.csv")
    assert list(table.columns[: len(COLUMNS)]) == COLUMNS
    assert len(table) == 8
    document = json.loads((out / "head_scores.json").read_text())
    assert document["settings"]["seed"] == 3 and len(document["heads"]) == 8
    assert document["heads"][0]["induction_score"] == pytest.approx(table["induction_score"][0])
    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "L0H0" in page


def test_same_seed_same_bytes(report_dir, tmp_path):
    out, argv = report_dir
    argv = [a if a != str(out) else str(tmp_path) for a in argv]
    assert main(argv) == 0
    assert (tmp_path / "head_scores.csv").read_bytes() == (out / "head_scores.csv").read_bytes()


def test_bad_model_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["induction", "--model", str(tmp_path / "nope"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("interp induction: error: no such directory")
    assert not out.exists()


def test_failure_while_rendering_leaves_no_files(gpt2_dir, tmp_path, monkeypatch, capsys):
    import interp.pages.induction as report

    def broken(*args, **kwargs):
        raise RuntimeError("renderer broke")

    monkeypatch.setattr(report, "build_report", broken)
    out = tmp_path / "out"
    code = main(
        [
            "induction",
            "--model",
            str(gpt2_dir),
            "--out",
            str(out),
            "--seq-lens",
            "5",
            "--no-ablation",
        ]
    )
    assert code == 1 and "renderer broke" in capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir())


def test_bad_option_values(gpt2_dir, capsys):
    with pytest.raises(SystemExit):
        main(["induction", "--seq-lens", "five"])
    assert "comma-separated whole numbers" in capsys.readouterr().err
    assert main(["induction", "--model", str(gpt2_dir), "--seq-lens", "40"]) == 2
    assert "context" in capsys.readouterr().err
