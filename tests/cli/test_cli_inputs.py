"""Issue 40's bad inputs, each as a user meets it: the work done, or one line on stderr with
exit code 2 before any model loads, naming the file, key or flag (docs/commands.md)."""

from __future__ import annotations

import argparse
import json

import pytest
import yaml

from interp.cli import main
from tests.cli.test_cli_contract import no_loading  # noqa: F401
from tests.transcoder_folders import make_transcoder_folder


@pytest.fixture(scope="module")
def tc_dir(gpt2_model, tmp_path_factory):
    return make_transcoder_folder(tmp_path_factory.mktemp("tc") / "tc", gpt2_model, d_tc=32)


def _copy(folder, to):
    import shutil

    return shutil.copytree(folder, to)


def _graph(model, transcoders, out, *extra) -> list[str]:
    return ["graph", "--model", str(model), "--transcoders", str(transcoders), "--out", str(out),
            "--prompt", "a b c a b", *extra]  # fmt: skip


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# -- 1: a greater-than task (answers as lists of text) through interp discover ----------------


@pytest.mark.slow
def test_discover_takes_a_task_whose_answers_are_lists_of_text(tmp_path, capsys):
    task = tmp_path / "gt.jsonl"
    rows = [{"clean": "a b c d", "corrupted": "a b c a", "answer": [" a", " b"],
             "wrong": [" c", " d"]}] * 3  # fmt: skip
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "gt"
    argv = ["discover", "--task", str(task), "--method", "eap", "--top-n", "5", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    example = json.loads((out / "summary.json").read_text())["examples"][0]
    assert example["answer"] == " a |  b" and example["wrong"] == " c |  d"


@pytest.mark.slow
def test_discover_generates_greater_than(tmp_path, capsys):
    out = tmp_path / "gt"
    argv = ["discover", "--task", "greater-than", "--n", "4", "--method", "eap", "--top-n", "5",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"]["generated"] == {"n": 4, "seed": 0}
    assert "greater-than" in summary["task"]["source"]


def test_discover_help_names_greater_than(capsys):
    with pytest.raises(SystemExit):
        main(["discover", "--help"])
    assert "greater-than" in capsys.readouterr().out


# -- 2, 3, 4: transcoder folders that cannot be used, refused before the model loads -----------


@pytest.mark.usefixtures("no_loading")
@pytest.mark.parametrize("key", ["activaton", "input_hook", "output_hooks"])
def test_an_unknown_config_key_is_refused_naming_it(key, tc_dir, tmp_path, capsys):
    folder = _copy(tc_dir, tmp_path / "tc")
    config = yaml.safe_load((folder / "config.yaml").read_text())
    (folder / "config.yaml").write_text(yaml.safe_dump({**config, key: "topk"}))
    assert main(_graph("tiny-induction", folder, tmp_path / "o")) == 2
    err = _one_line(capsys)
    assert f"unknown key {key!r}" in err and str(folder / "config.yaml") in err
    assert not (tmp_path / "o").exists()


def test_the_loader_suggests_the_key_meant(tc_dir, tmp_path):
    from interp.transcoders.loading import TranscoderLoadError, load_transcoders

    folder = _copy(tc_dir, tmp_path / "tc")
    config = yaml.safe_load((folder / "config.yaml").read_text())
    (folder / "config.yaml").write_text(yaml.safe_dump({**config, "activaton": "topk", "k": 4}))
    with pytest.raises(TranscoderLoadError, match="did you mean 'activation'"):
        load_transcoders(folder)


@pytest.mark.usefixtures("no_loading")
@pytest.mark.parametrize(
    ("damage", "file", "message"),
    [
        ("truncate", "layer_0.safetensors", "cut short"),
        ("garbage", "config.yaml", "is not readable YAML"),
        ("list", "config.yaml", "is not a mapping"),
    ],
)
def test_a_damaged_transcoder_file_is_refused_naming_it(
    damage, file, message, tc_dir, tmp_path, capsys
):
    folder = _copy(tc_dir, tmp_path / "tc")
    path = folder / file
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:-100])
    else:
        path.write_text("{model_kind: [" if damage == "garbage" else "- a\n- b\n")
    assert main(_graph("tiny-induction", folder, tmp_path / "o")) == 2
    err = _one_line(capsys)
    assert str(path) in err and message in err and err.startswith("interp graph: error: ")
    assert not (tmp_path / "o").exists()


@pytest.mark.usefixtures("no_loading")
def test_a_truncated_model_folder_is_refused_naming_the_file(gpt2_dir, tc_dir, tmp_path, capsys):
    model = _copy(gpt2_dir, tmp_path / "model")
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert main(_graph(model, tc_dir, tmp_path / "o")) == 2  # refused before loading
    err = _one_line(capsys)
    assert str(weights) in err and "cut short" in err
    assert not (tmp_path / "o").exists()


def test_a_missing_layer_file_names_the_folder_given(gpt2_dir, tc_dir, tmp_path, capsys):
    folder = _copy(tc_dir, tmp_path / "tc")
    config = yaml.safe_load((folder / "config.yaml").read_text())
    (folder / "config.yaml").write_text(yaml.safe_dump({**config, "scan": "some-hub/scan"}))
    (folder / "layer_1.safetensors").unlink()
    assert main(_graph(gpt2_dir, folder, tmp_path / "o")) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after "loading ...": the model is needed
    assert f"--transcoders {folder}:" in err and "file missing" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.usefixtures("no_loading")
def test_graph_tokens_too_few_is_refused_before_loading(tc_dir, tmp_path, capsys):
    argv = ["graph", "--transcoders", str(tc_dir), "--tokens", "5", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "at least 2 tokens" in _one_line(capsys)


# -- 5: executor runs that did nothing leave nothing; kept shards of another run ---------------


@pytest.fixture(scope="module")
def task_file(tmp_path_factory, bundled_model):
    from interp.tasks import induction

    path = tmp_path_factory.mktemp("task") / "induction.jsonl"
    induction(bundled_model, 4, seed=1, seq_len=5).to_jsonl(path)
    return path


def _discover(task_file, out, *extra) -> list[str]:
    return ["discover", "--task", str(task_file), "--method", "eap", "--top-n", "3",
            "--out", str(out), *extra]  # fmt: skip


@pytest.mark.usefixtures("no_loading")
def test_slurm_without_sbatch_is_refused_before_loading(task_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("interp.cli.executor_options.sbatch_found", lambda: False, raising=False)
    monkeypatch.setattr("shutil.which", lambda name, *a, **k: None)
    out = tmp_path / "o"
    assert main(_discover(task_file, out, "--executor", "slurm", "--shards", "2")) == 2
    err = _one_line(capsys)
    assert "--executor slurm needs SLURM's sbatch" in err
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_before_any_shard_finished_leaves_no_folder(task_file, tmp_path, monkeypatch):
    from interp.foundation.executors.sharding import Sharding

    class Interrupted:
        def start(self, work_dir):
            assert (work_dir / "run.json").is_file()  # the runner wrote the run's key
            raise KeyboardInterrupt

        def close(self):
            pass

    monkeypatch.setattr(Sharding, "make", lambda self: Interrupted())
    out = tmp_path / "o"
    assert main(_discover(task_file, out, "--executor", "local", "--shards", "2")) == 130
    assert list(tmp_path.iterdir()) == []  # neither --out nor its .interp-shards/run.json


def _kept(out, command: dict | None, shards: int) -> None:
    work = out / ".interp-shards"
    work.mkdir(parents=True)
    key = {"kind": "discover", "model": "x", "task": "y", "shards": 2}
    (work / "run.json").write_text(json.dumps(key | ({"command": command} if command else {})))
    for i in range(shards):
        (work / f"shard-{i}-of-2.json").write_text("{}")


@pytest.mark.usefixtures("no_loading")
def test_kept_shards_of_another_run_are_refused_before_loading(task_file, tmp_path, capsys):
    out = tmp_path / "o"
    _kept(out, None, 1)
    assert main(_discover(task_file, out, "--executor", "local", "--shards", "2")) == 2
    err = _one_line(capsys)
    assert f"{out / '.interp-shards'} keeps 1 finished shard(s)" in err and "--restart" in err
    assert (out / ".interp-shards" / "shard-0-of-2.json").is_file()  # nothing discarded


@pytest.mark.usefixtures("no_loading")
@pytest.mark.parametrize("shards", [0, 1])
def test_restart_or_no_finished_shard_clears_the_stale_run_before_loading(
    shards, task_file, tmp_path, capsys
):
    out = tmp_path / "o"
    _kept(out, {"method": "exact"}, shards)
    extra = ["--restart"] if shards else []
    code = main(_discover(task_file, out, "--executor", "local", "--shards", "2", *extra))
    assert code == 1 and "a model was loaded" in capsys.readouterr().err  # got past the checks
    assert not (out / ".interp-shards").exists()


# -- 6: a Ctrl-C once the files are in place: exit 0 and the "wrote" lines, never 130 ----------


@pytest.mark.parametrize("fresh", [True, False], ids=["new-folder", "old-folder"])
def test_ctrl_c_after_the_files_are_in_place_exits_0(fresh, tmp_path, capsys, monkeypatch):
    import interp.cli.induction as induction

    def interrupted(*args, **kwargs):  # SIGINT's handler raises here, after the commit
        raise KeyboardInterrupt

    monkeypatch.setattr(induction, "terminal_table", interrupted)
    out = tmp_path / "out"
    if not fresh:
        out.mkdir()
        (out / "report.html").write_text("old")
    argv = ["induction", "--out", str(out), "--seq-lens", "4", "--no-ablation"]
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert f"wrote {out / 'report.html'}" in printed.out
    assert "nothing was written" not in printed.err
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


def test_ctrl_c_before_the_commit_still_exits_130(tmp_path, monkeypatch, capsys):
    import interp.pages.induction as pages

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pages, "render_outputs", interrupted)
    out = tmp_path / "out"
    assert main(["induction", "--out", str(out), "--seq-lens", "4", "--no-ablation"]) == 130
    assert "nothing was written" in capsys.readouterr().err and not out.exists()


# -- 7: text that is not UTF-8 on the command line ---------------------------------------------


@pytest.mark.usefixtures("no_loading")
@pytest.mark.parametrize("command", ["attention", "graph", "attribute"])
def test_a_prompt_that_is_not_utf8_exits_2_before_loading(command, tmp_path, capsys):
    import os

    prompt = os.fsdecode(b"a \xff\xfe b a")  # what Python makes of such argv bytes
    out = tmp_path / ("o.html" if command == "attention" else "o")
    extra = ["--answer", " a"] if command == "attribute" else []
    assert main([command, "--prompt", prompt, "--out", str(out), *extra]) == 2
    err = _one_line(capsys)
    assert err.startswith(f"interp {command}: error: --prompt is not valid UTF-8")
    assert list(tmp_path.iterdir()) == []


def test_a_real_command_line_with_such_bytes(tmp_path):
    import subprocess
    import sys

    argv = [sys.executable, "-m", "interp.cli", "attention", "--prompt", b"a \xff b",
            "--out", str(tmp_path / "o.html")]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        b"interp attention: error: --prompt is not valid UTF-8 text; pass it in UTF-8 (check the "
        b"terminal's or the script's encoding)"
    ]


# -- 9: errors name the options typed, not the library's parameters ----------------------------


@pytest.mark.parametrize(
    ("argv", "flags"),
    [
        (["induction", "--seq-lens", "4", "--max-bytes", "1000"], ["--max-bytes 1000 B"]),
        (
            ["graph", "--prompt", "a b c", "--max-bytes", "1000"],
            ["raise --max-bytes to", "lower --max-feature-nodes"],
        ),
    ],  # fmt: skip
)
def test_a_budget_error_names_the_flag(argv, flags, tmp_path, capsys):
    code = main([*argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code in (1, 2) and err.startswith(f"interp {argv[0]}: error: ")
    assert all(flag in err for flag in flags), err
    assert "max_bytes" not in err and "max_feature_nodes" not in err
    assert not (tmp_path / "o").exists()


def test_parameters_become_the_options_typed():
    from interp.cli import as_flags

    flags = {"names": "--names", "max_bytes": "--max-bytes", "n": "--n"}
    assert as_flags("pass other names=", flags) == "pass other --names"
    assert (
        as_flags("more than max_bytes=1000 B allows", flags)
        == "more than --max-bytes 1000 B allows"
    )
    assert as_flags("raise max_bytes to 2 MiB", flags) == "raise --max-bytes to 2 MiB"
    assert as_flags("n rows; --max-bytes given", flags) == "n rows; --max-bytes given"  # prose


# -- 10: interp features shows whitespace tokens as the contexts do ----------------------------


@pytest.mark.slow
def test_features_draws_whitespace_in_promotes_as_in_the_contexts(tmp_path, capsys):
    import re

    import pandas as pd

    out = tmp_path / "f"
    assert (
        main(["features", "--sae", "tiny-induction-sae", "--tokens", "1024", "--out", str(out)])
        == 0
    )
    table = pd.read_csv(out / "features.csv", keep_default_na=False)
    cells = table["top_promoted"].tolist() + table["top_suppressed"].tolist()
    tokens = [t for cell in cells for t in cell.split(" | ")]
    assert any("⏎" in t or "·" in t for t in tokens)  # there are whitespace tokens to draw
    assert not [t for t in tokens if re.search(r"\s", t)], "raw whitespace in a token"
    page = (out / "report.html").read_text(encoding="utf-8")
    shown = re.findall(r"promotes: ([^\n]*)\nsuppresses: ([^\n<]*)", page)
    assert len(shown) == len(table)  # each on one line of the page


# -- 11: attention --layers 0,1, one --device default, -v anywhere, --version, --help ----------


@pytest.mark.parametrize("layers", [["0,1"], ["0", "1"], ["1,0", "0"]])
def test_attention_takes_layers_comma_or_space_separated(layers, tmp_path, monkeypatch):
    import interp.cli.attention as attention

    seen = {}
    monkeypatch.setattr(attention, "write_attention_page", lambda **kw: seen.update(kw) or "x")
    argv = ["attention", "--prompt", "a b", "--out", str(tmp_path / "a.html"), "--layers"]
    assert main([*argv, *layers]) == 0
    assert sorted(set(seen["layers"])) == [0, 1]


@pytest.mark.slow
def test_attention_with_comma_separated_layers_writes_the_page(tmp_path, capsys):
    out = tmp_path / "a.html"
    assert main(["attention", "--prompt", "a b c a b", "--layers", "0,1", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_every_command_defaults_to_the_cpu_and_takes_v_after_it():
    from interp.cli import COMMANDS, build_parser

    parser = build_parser()
    for name in COMMANDS:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        device = [a for a in sub.choices[name]._actions if a.dest == "device"]
        assert not device or device[0].default == "cpu", name
    argv = ["attention", "--prompt", "a", "--out", "a.html"]
    assert parser.parse_args([*argv, "-v"]).verbose is True
    assert parser.parse_args(["-v", *argv]).verbose is True
    assert parser.parse_args(argv).verbose is False


def test_version(capsys):
    from interp import __version__

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"interp {__version__}"


def test_help_shows_every_default_and_range():
    from interp.cli import COMMANDS, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name in COMMANDS:
        for action in sub.choices[name]._actions:
            if not action.option_strings or action.nargs == 0:
                continue  # flags: present or not
            text = action.help or ""
            default = action.default
            shown = ",".join(map(str, default)) if isinstance(default, list) else str(default)
            if default is not None and shown not in text:
                missing.append(f"{name} {action.option_strings[-1]}: default {shown}")
            bounds = getattr(action.type, "bounds", None)
            if bounds and bounds.removeprefix("each ").removeprefix("from ") not in text:
                missing.append(f"{name} {action.option_strings[-1]}: {bounds}")
    assert missing == []
    assert sub.choices["discover"].format_help().count("(from 1 to 1000)") == 1  # --ig-steps


SLOW_AFTER_COMMIT = """
import pathlib, sys, time
import interp.cli.induction as induction
def slow(*args, **kwargs):  # the files are in place; the command still prints its table
    pathlib.Path(sys.argv[1]).write_text("committed")
    time.sleep(120)
induction.terminal_table = slow
from interp.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_a_real_sigint_after_the_commit_exits_0(tmp_path, fork_server):
    """A command of its own, sent a real SIGINT once its files are in place (the issue's
    "0.4-1.0 s after writing the report")."""
    import signal
    import subprocess
    import time

    from tests.forked import ROOT, python, served_env

    out, marker, script = tmp_path / "out", tmp_path / "marker", tmp_path / "slow.py"
    script.write_text(SLOW_AFTER_COMMIT, encoding="utf-8")
    argv = ["induction", "--out", str(out), "--seq-lens", "4", "--no-ablation"]
    process = subprocess.Popen(
        python(fork_server, str(script), str(marker), *argv), cwd=ROOT, env=served_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), process.communicate()
    process.send_signal(signal.SIGINT)
    printed, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert f"wrote {out / 'report.html'}" in printed and "nothing was written" not in err
    assert sorted(p.name for p in out.iterdir()) == ["head_scores.csv", "head_scores.json",
                                                     "report.html"]  # fmt: skip


def test_the_kept_shards_go_once_the_merged_files_are_in_place(tmp_path):
    from interp.cli.executor_run import _written
    from interp.cli.output import committed, staged_output

    out = tmp_path / "out"
    (out / ".interp-shards").mkdir(parents=True)
    committed(reset=True)

    def write():
        with staged_output(out, owns=["a.csv"]) as stage:
            stage.write_text("a.csv", "x\n")
        raise KeyboardInterrupt  # Ctrl-C right after the commit

    with pytest.raises(KeyboardInterrupt):
        _written(out, write)
    assert sorted(p.name for p in out.iterdir()) == ["a.csv"]
    committed(reset=True)
