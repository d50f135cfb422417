"""``--executor local|ray|slurm --shards N``: the done-when of issue 32 (``interp discover --task
FILE --method eap-ig --executor ray --shards 8`` on a local Ray cluster writes the whole run's
files and survives a killed worker), the same through local processes and submitit's local
executor, and every refusal before any model loads."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import interp.models.loading
from interp import Task
from interp.cli import main
from interp.tasks import induction
from tests.forked import forked_workers

ATOL = 1e-6  # float32 metrics summed per shard in float64, then divided: rounding of the order


@pytest.fixture(scope="module")
def task_file(tmp_path_factory, bundled_model) -> Path:
    path = tmp_path_factory.mktemp("task") / "induction.jsonl"
    induction(bundled_model, 9, seed=1, seq_len=5).to_jsonl(path)
    return path


def read(folder: Path, name: str) -> dict:
    return json.loads((folder / name).read_text(encoding="utf-8"))


def kill_one_ray_worker(stop: threading.Event, killed: list[int]) -> None:
    """SIGKILL the first Ray worker seen running a shard (its process title names the task)."""
    while not stop.is_set() and not killed:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                title = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if title.startswith("ray::call_shard"):
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(int(proc.name))
                return
        time.sleep(0.2)


@pytest.mark.slow
def test_discover_on_ray_with_8_shards_writes_the_whole_runs_files_despite_a_killed_worker(
    ray_cluster, task_file, tmp_path
):
    argv = ["discover", "--task", str(task_file), "--method", "eap-ig", "--top-n", "12"]
    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    assert main([*argv, "--out", str(whole)]) == 0
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=kill_one_ray_worker, args=(stop, killed))
    killer.start()
    try:
        code = main([*argv, "--executor", "ray", "--shards", "8", "--out", str(sharded)])
    finally:
        stop.set()
        killer.join()
    assert code == 0 and len(killed) == 1  # a worker died mid-run, its shard was retried
    assert sorted(p.name for p in sharded.iterdir()) == sorted(p.name for p in whole.iterdir())
    one, two = pd.read_csv(whole / "edges.csv"), pd.read_csv(sharded / "edges.csv")
    assert list(one["edge"]) == list(two["edge"])
    assert list(one["in_circuit"]) == list(two["in_circuit"])
    assert np.allclose(one["score"], two["score"], atol=ATOL, rtol=0)
    a, b = read(whole, "circuit.json"), read(sharded, "circuit.json")
    assert b["task"].pop("shards") == 8 and a["task"].pop("shards") == 1
    for key in ("faithfulness", "cpr", "cmd"):
        assert b.pop(key) == pytest.approx(a.pop(key), abs=ATOL), key
    assert a == b  # edges, parameters, task, ablation: the same
    curves = [pd.read_csv(d / "curve.csv") for d in (whole, sharded)]
    assert np.allclose(curves[0]["faithfulness"], curves[1]["faithfulness"], atol=ATOL, rtol=0)


@pytest.mark.slow
def test_attribute_on_local_processes_and_patch_on_submitit_equal_their_whole_runs(
    task_file, tmp_path, monkeypatch, fork_server
):
    forked_workers(monkeypatch, fork_server)  # the workers: processes forked from a warm server
    argv = ["attribute", "--task", str(task_file)]
    assert main([*argv, "--out", str(tmp_path / "a1")]) == 0
    # two shards (rows 5 + 4): each is a process that loads the model, and two already make a
    # merge of unequal parts to compare with the whole run
    assert main([*argv, "--executor", "local", "--shards", "2", "--out", str(tmp_path / "a2")]) == 0
    one, two = (pd.read_csv(tmp_path / d / "attribution.csv") for d in ("a1", "a2"))
    assert np.allclose(one["contribution"], two["contribution"], atol=ATOL, rtol=0)
    assert not (tmp_path / "a2" / ".interp-shards").exists()  # removed once merged

    import interp.cli.executor_run as executor_run
    from interp.cli.executor_options import sharding_of

    def local_slurm(args, out):  # submitit's local executor: the slurm code path, no cluster
        from dataclasses import replace

        return replace(sharding_of(args, out), slurm_cluster="local")

    monkeypatch.setattr(executor_run, "sharding_of", local_slurm)
    monkeypatch.setattr("interp.cli.executor_options.sbatch_found", lambda: True)
    argv = ["patch", "--task", str(task_file), "--sites", "resid_pre"]
    assert main([*argv, "--out", str(tmp_path / "p1")]) == 0
    assert main([*argv, "--executor", "slurm", "--shards", "2", "--out", str(tmp_path / "p2")]) == 0
    one, two = (pd.read_csv(tmp_path / d / "patching.csv") for d in ("p1", "p2"))
    assert np.allclose(one["metric"], two["metric"], atol=ATOL, rtol=0)
    assert read(tmp_path / "p2", "summary.json")["task"]["shards"] == 2


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--executor", "local"], "--executor local needs --shards N"),
        (["--shards", "3"], "--shards need --executor"),
        (["--executor", "local", "--shards", "2", "--shard", "0/2"], "leave out --shard"),
        (["--executor", "local", "--shards", "10"], "the task has 9 rows"),
        (
            ["--executor", "local", "--shards", "2", "--ray-address", "auto"],
            "is for --executor ray",
        ),
        (
            ["--executor", "slurm", "--shards", "2", "--gpus-per-shard", "1"],
            "--gpus-per-shard 1 with --device cpu: the shards would hold GPUs they never use",
        ),
    ],
)
def test_refusals_before_loading(extra, message, task_file, tmp_path, capsys, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(interp.models.loading, "load_model", refuse)
    argv = ["discover", "--task", str(task_file), "--method", "eap", "--top-n", "3", *extra]
    assert main([*argv, "--out", str(tmp_path / "never")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_a_missing_extra_is_refused_with_its_install_line(task_file, tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    argv = ["discover", "--task", str(task_file), "--method", "eap", "--top-n", "3"]
    code = main([*argv, "--executor", "ray", "--shards", "2", "--out", str(tmp_path / "never")])
    assert code == 2 and 'pip install "interp[ray]"' in capsys.readouterr().err
    argv = ["discover", "--task", str(task_file), "--method", "acdc", "--threshold", "0.1"]
    code = main([*argv, "--executor", "local", "--shards", "2", "--out", str(tmp_path / "never")])
    assert code == 2 and "acdc has no shards" in capsys.readouterr().err
    assert Task.from_jsonl(task_file)  # the file itself is fine


def test_a_cuda_model_on_ray_without_gpus_per_shard_is_refused_before_loading(
    task_file, tmp_path, capsys, monkeypatch
):
    import interp.cli.options

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(interp.models.loading, "load_model", refuse)
    # a machine with a GPU, as --device sees it (this test never starts CUDA)
    monkeypatch.setattr(interp.cli.options, "_available_devices", lambda: (["cpu", "cuda"], ""))
    argv = ["discover", "--task", str(task_file), "--method", "eap", "--top-n", "3"]
    argv += ["--device", "cuda", "--executor", "ray", "--shards", "2"]
    assert main([*argv, "--out", str(tmp_path / "never")]) == 2
    assert "pass --gpus-per-shard 1" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()
