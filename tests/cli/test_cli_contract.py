"""Every command keeps the same contract (docs/commands.md): arguments and --out checked before
any model loads; exit codes 0 / 1 / 2 / 130; a failed or interrupted run leaves --out as it
was, with no staging folder."""

from __future__ import annotations

import errno
import tempfile

import pytest

import interp.models.loading
import interp.pages.html as html
from interp.cli import main

FOLDER_COMMANDS = {  # command -> (fast arguments, the files it owns)
    "induction": (
        ["--seq-lens", "4", "--batch-size", "2", "--no-ablation"],
        ["head_scores.csv", "head_scores.json", "report.html"],
    ),
    "attribute": (["--prompt", "a b c a b", "--answer", " c"], ["attribution.csv", "report.html"]),
    "circuits": (
        ["--baseline-samples", "4"],
        ["composition_scores.csv", "copying_scores.csv", "report.html"],
    ),
    "patch": (
        [
            "--clean",
            "a b c a b",
            "--corrupted",
            "a c b a b",
            "--answer",
            " c",
            "--sites",
            "resid_pre",
        ],
        ["patching.csv", "report.html", "summary.json"],
    ),
    "discover": (
        ["--task", "induction", "--n", "2", "--method", "eap", "--top-n", "3"],
        ["circuit.json", "curve.csv", "edges.csv", "report.html", "summary.json"],
    ),
}
ATTENTION_ARGS = ["--prompt", "a b c a b"]


def argv_for(command: str, model, out) -> list[str]:
    extra = ATTENTION_ARGS if command == "attention" else FOLDER_COMMANDS[command][0]
    return [command, "--model", str(model), "--out", str(out), *extra]


def staging_left(folder) -> list:
    return [p for p in folder.rglob("*") if ".interp-staging-" in p.name or p.suffix == ".tmp"]


@pytest.fixture
def no_loading(monkeypatch):
    """Fails the test if any command loads a model."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(interp.models.loading, "load_model", refuse)


def old_state(out, names) -> dict[str, str]:
    out.mkdir()
    for name in names:
        (out / name).write_text(f"old {name}")
    (out / "notes.txt").write_text("the user's own file")
    return {p.name: p.read_text() for p in out.iterdir()}


# -- exit code 0, and a rerun over the old folder ---------------------------------------------


@pytest.mark.parametrize("command", sorted(FOLDER_COMMANDS))
def test_success_replaces_every_owned_file_and_keeps_others(command, gpt2_dir, tmp_path, capsys):
    out = tmp_path / "out"
    names = FOLDER_COMMANDS[command][1]
    before = old_state(out, names)
    assert main(argv_for(command, gpt2_dir, out)) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([*names, "notes.txt"])
    assert all((out / n).read_text() != before[n] for n in names)
    assert (out / "notes.txt").read_text() == before["notes.txt"]
    assert staging_left(tmp_path) == []
    printed = capsys.readouterr().out
    assert all(f"wrote {out / n}" in printed for n in names)
    assert "<NA>" not in printed and "nan" not in printed.lower().split()


def test_attention_and_models_exit_0(gpt2_dir, tmp_path, capsys):
    page = tmp_path / "page.html"
    page.write_text("old page")
    assert main(argv_for("attention", gpt2_dir, page)) == 0
    assert page.read_text().startswith("<!DOCTYPE html>")
    assert main(["models"]) == 0
    assert "tiny-induction" in capsys.readouterr().out
    assert staging_left(tmp_path) == []


def test_circuits_no_report_removes_the_stale_report(gpt2_dir, tmp_path):
    """The folder never mixes two runs: a report.html of an earlier run goes."""
    out = tmp_path / "out"
    old_state(out, FOLDER_COMMANDS["circuits"][1])
    assert main(argv_for("circuits", gpt2_dir, out) + ["--no-report"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "composition_scores.csv",
        "copying_scores.csv",
        "notes.txt",
    ]


# -- exit code 2, before any model loads ------------------------------------------------------


@pytest.mark.parametrize("command", [*sorted(FOLDER_COMMANDS), "attention"])
def test_out_that_cannot_work_is_refused_before_loading(
    command, tmp_path, capsys, no_loading, monkeypatch
):
    a_file, a_folder = tmp_path / "file.html", tmp_path / "folder.html"
    a_file.write_text("x")
    a_folder.mkdir()
    wrong = a_folder if command == "attention" else a_file
    assert main(argv_for(command, "tiny-induction", wrong)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"interp {command}: error: --out {wrong} is a ")

    # a read-only place (simulated: the tests may run as root, who writes anywhere)
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    target = tmp_path / "ro" / ("page.html" if command == "attention" else "out")
    assert main(argv_for(command, "tiny-induction", target)) == 2
    err = capsys.readouterr().err
    assert f"--out {target}: cannot write in {tmp_path}" in err and "read-only" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.html", "folder.html"]


BAD_ARGUMENTS = [
    (["induction", "--top-k", "5"], "unrecognized arguments"),
    (["induction", "--seq-lens", "0"], "each value must be at least 1, got 0"),
    (["induction", "--seq-lens", "x"], "expected comma-separated whole numbers"),
    (["induction", "--batch-size", "0"], "--batch-size: must be from 1 to 1024, got 0"),
    (["induction", "--ablate-top", "-1"], "--ablate-top: must be at least 0, got -1"),
    (["induction", "--seed", "-3"], "--seed: must be from 0 to"),
    (["induction", "--seed", "1.5"], "--seed: expected a whole number, got '1.5'"),
    (["induction", "--device", "gpu"], "unknown device 'gpu'"),
    (
        ["circuits", "--baseline-samples", "x"],
        "--baseline-samples: expected a whole number, got 'x'",
    ),
    (["circuits", "--baseline-samples", "1"], "must be from 2 to 100000, got 1"),
    (["circuits", "--kinds", "QX"], "expected some of Q, K, V"),
    (
        ["attribute", "--prompt", "a", "--answer", "b", "--top-k", "100000"],
        "--top-k: must be from 1 to 100, got 100000",
    ),
    (["attribute", "--prompt", "a", "--answer", "b", "--top-k", "0"], "must be from 1 to 100"),
    (
        ["attention", "--prompt", "a", "--layers", "-1"],
        "--layers: each value must be at least 0, got -1",
    ),
    (["induction", "--model", ""], "--model: is empty; pass a hub name"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_ARGUMENTS)
def test_bad_options_exit_2_with_a_clear_message(argv, message, tmp_path, capsys, no_loading):
    out = tmp_path / ("o.html" if argv[0] == "attention" else "o")
    with pytest.raises(SystemExit) as info:
        main([*argv, "--out", str(out)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "_positive" not in err and "invalid" not in err
    assert list(tmp_path.iterdir()) == []


REFUSED_AFTER_PARSING = [
    (["attribute", "--prompt", "", "--answer", " c"], "--prompt is empty"),
    (["attribute", "--prompt", "a", "--answer", ""], "--answer is empty"),
    (["attribute", "--prompt", "a", "--answer", " c", "--wrong", " c"], "same token"),
    (["attribute", "--prompt", "a", "--answer", " c", "--wrong", ""], "--wrong is empty"),
    (["attention", "--prompt", ""], "--prompt is empty"),
    (["induction", "--no-ablation", "--ablate-top", "2"], "contradict"),
]


@pytest.mark.parametrize(("argv", "message"), REFUSED_AFTER_PARSING)
def test_empty_and_contradictory_input_exit_2_before_loading(
    argv, message, tmp_path, capsys, no_loading
):
    out = tmp_path / ("o.html" if argv[0] == "attention" else "o")
    assert main([*argv, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_device_names_are_checked_against_this_torch(tmp_path, capsys, no_loading, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(SystemExit) as info:
        main(["circuits", "--device", "cuda", "--out", str(tmp_path / "o")])
    assert info.value.code == 2
    assert "this torch build has no CUDA; use --device cpu" in capsys.readouterr().err


MODEL_BOUNDS = [  # checked right after loading, before any work
    (["attention", "--prompt", "a b", "--layers", "0", "7"], "--layers 7: at most 1"),
    (["induction", "--seq-lens", "5,200"], "--seq-lens 200: at most"),
    (["induction", "--ablate-top", "99"], "--ablate-top 99: at most 8 (the model has 8 heads)"),
    (["attribute", "--prompt", "a b", "--answer", " c", "--pos", "5"], "--pos 5 is outside"),
]
LONG = " ".join(["a"] * 80)  # past the test model's 64-token context
TOO_LONG = [  # one rule (docs/commands.md): refused before any work, exit 2, nothing printed
    ["attribute", "--prompt", LONG, "--answer", " c"],
    ["attention", "--prompt", LONG],
    ["patch", "--clean", LONG, "--corrupted", LONG, "--answer", " c"],
]


@pytest.mark.parametrize("argv", TOO_LONG, ids=[a[0] for a in TOO_LONG])
def test_a_prompt_longer_than_the_context_exits_2_before_any_work(argv, gpt2_dir, tmp_path, capsys):
    out = tmp_path / ("o.html" if argv[0] == "attention" else "o")
    assert main([argv[0], "--model", str(gpt2_dir), *argv[1:], "--out", str(out)]) == 2
    captured = capsys.readouterr()
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith(f"interp {argv[0]}: error: ") and "context" in last
    assert "attributing" not in captured.err and "patching" not in captured.err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("argv", "message"), MODEL_BOUNDS)
def test_bounds_that_need_the_model_exit_2(argv, message, gpt2_dir, tmp_path, capsys):
    out = tmp_path / ("o.html" if argv[0] == "attention" else "o")
    assert main([argv[0], "--model", str(gpt2_dir), *argv[1:], "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_duplicates_are_dropped(gpt2_dir, tmp_path):
    page = tmp_path / "page.html"
    assert (
        main(
            [
                "attention",
                "--model",
                str(gpt2_dir),
                "--prompt",
                "a b",
                "--out",
                str(page),
                "--layers",
                "1",
                "0",
                "0",
            ]
        )
        == 0
    )
    assert page.read_text().count('data-interp-kind="attention"') == 2  # layers 0 and 1
    out = tmp_path / "scan"
    assert (
        main(
            [
                "induction",
                "--model",
                str(gpt2_dir),
                "--out",
                str(out),
                "--seq-lens",
                "4,3,4",
                "--batch-size",
                "1",
                "--no-ablation",
            ]
        )
        == 0
    )
    import json

    assert json.loads((out / "head_scores.json").read_text())["settings"]["seq_lens"] == [3, 4]


# -- exit codes 1 and 130: the work failed or was interrupted; nothing changed ----------------


@pytest.mark.parametrize("command", [*sorted(FOLDER_COMMANDS), "attention"])
def test_missing_model_exits_2(command, tmp_path, capsys):
    out = tmp_path / ("o.html" if command == "attention" else "o")
    assert main(argv_for(command, tmp_path / "no-such-model", out)) == 2  # before any work
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"interp {command}: error: ")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [*sorted(FOLDER_COMMANDS), "attention"])
def test_interrupt_while_loading_exits_130(command, tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(interp.models.loading, "load_model", interrupted)
    out = tmp_path / ("o.html" if command == "attention" else "o")
    assert main(argv_for(command, "tiny-induction", out)) == 130
    assert "interrupted; nothing was written" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "error",
    [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()],
    ids=["disk-full", "ctrl-c"],
)
@pytest.mark.parametrize("command", sorted(FOLDER_COMMANDS))
def test_failure_on_the_last_file_keeps_the_old_folder(
    command, error, gpt2_dir, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "out"
    names = FOLDER_COMMANDS[command][1]
    before = old_state(out, names)
    real = html.write_text_atomic
    last = sorted(names)[-1]

    def fails_on_last(path, text):
        if path.name == last:
            raise error
        return real(path, text)

    monkeypatch.setattr(html, "write_text_atomic", fails_on_last)
    code = main(argv_for(command, gpt2_dir, out))
    assert code == (130 if isinstance(error, KeyboardInterrupt) else 1)
    assert {p.name: p.read_text() for p in out.iterdir()} == before
    assert staging_left(tmp_path) == []
    err = capsys.readouterr().err
    if code == 1:  # the user's path, a plain reason, never the staging folder
        assert f"could not write {out / last}: no space left on the device" in err
        assert ".interp-staging-" not in err


@pytest.mark.parametrize(
    "error",
    [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()],
    ids=["disk-full", "ctrl-c"],
)
def test_attention_failure_keeps_the_old_page(error, gpt2_dir, tmp_path, monkeypatch, capsys):
    page = tmp_path / "page.html"
    page.write_text("old page")
    real = html.write_text_atomic

    def broken(path, text):
        if isinstance(error, KeyboardInterrupt):  # interrupted mid-write: real() cleans up

            def stop(*args):
                raise error

            monkeypatch.setattr(html.os, "fsync", stop)
            return real(path, text)
        raise error

    monkeypatch.setattr(html, "write_text_atomic", broken)
    code = main(argv_for("attention", gpt2_dir, page))
    assert code == (130 if isinstance(error, KeyboardInterrupt) else 1)
    assert page.read_text() == "old page"
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]
    if code == 1:
        assert f"could not write {page}: no space left" in capsys.readouterr().err


# -- a real Ctrl-C: SIGINT to a running command ------------------------------------------------

SLOW_WRITER = """
import pathlib, sys, time
import interp.pages.html as html
real = html.write_text_atomic
def slow(path, text):  # the last file waits, so the signal lands mid-write
    if path.name == "report.html":
        pathlib.Path(sys.argv[1]).write_text("writing")
        time.sleep(120)
    return real(path, text)
html.write_text_atomic = slow
from interp.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("fresh", [True, False], ids=["new-folder", "old-folder"])
def test_sigint_mid_write_exits_130_and_changes_nothing(fresh, gpt2_dir, tmp_path, fork_server):
    """A command of its own (forked from the warm server, tests/forked.py: its imports done),
    sent a real SIGINT while it writes its last file."""
    import signal
    import subprocess
    import time

    from tests.forked import ROOT, python, served_env

    out, marker = tmp_path / "out", tmp_path / "marker"
    names = FOLDER_COMMANDS["circuits"][1]
    before = {} if fresh else old_state(out, names)
    script = tmp_path / "slow_writer.py"
    script.write_text(SLOW_WRITER, encoding="utf-8")
    process = subprocess.Popen(
        python(fork_server, str(script), str(marker), *argv_for("circuits", gpt2_dir, out)),
        cwd=ROOT,
        env=served_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), process.communicate()
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "interrupted; nothing was written" in err
    if fresh:
        assert not out.exists()
    else:
        assert {p.name: p.read_text() for p in out.iterdir()} == before
    assert staging_left(tmp_path) == []
