"""Shards on every executor (local processes, a real Ray cluster of 2 CPUs, submitit's local
executor for the SLURM path): the results are the shards' own, computed once each; a worker
killed mid-run is retried; a re-run does only the missing shards; an exception of the job is
not retried and reaches the user as one line naming its shard; a folder of another run is
refused."""

from __future__ import annotations

import json

import pytest

from interp.foundation.executors import (
    LocalExecutor,
    RayExecutor,
    ShardError,
    SlurmExecutor,
    run_shards,
)
from interp.foundation.executors.backends import missing_extra
from tests.optional import require_module
from tests.support_executors import SumJob, runs

VALUES = tuple(float(v) * 0.1 for v in range(11))  # 11 rows: shards of 3, 3, 3, 2
KEY = {"task": "sums of VALUES"}


@pytest.fixture(
    params=[
        "local",
        pytest.param("ray", marks=pytest.mark.slow),
        pytest.param("slurm", marks=pytest.mark.slow),
    ]
)
def executor(request, monkeypatch):
    """A fresh executor of each kind (Ray: on the session's cluster, left running)."""
    if request.param == "local":
        return lambda: LocalExecutor(workers=2)
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
        return RayExecutor
    submitit = require_module("submitit", "slurm")
    # a job that died without a result: submitit waits 15 s for its result file to appear (a
    # cluster's shared file system may lag); here the file system is local, nothing lags
    monkeypatch.setattr(submitit.core.core.Job, "_results_timeout_s", 1)
    return lambda: SlurmExecutor(cluster="local")


def whole(job: SumJob, count: int) -> list[dict]:
    """The shards run here, one after the other, in this process."""
    return [job(i, count) for i in range(count)]


def test_results_are_the_shards_own_and_each_runs_once(executor, tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    job = SumJob(VALUES, str(log))
    parts = run_shards(job, 4, executor(), tmp_path / "work", key=KEY, progress=False)
    assert parts == whole(SumJob(VALUES, str(tmp_path)), 4)  # the same sums, bit for bit
    assert sorted(r for p in parts for r in p["rows"]) == list(range(len(VALUES)))
    assert runs(log) == [0, 1, 2, 3]
    assert json.loads((tmp_path / "work" / "run.json").read_text()) == {**KEY, "shards": 4}


def test_a_killed_worker_is_retried(executor, tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    job = SumJob(VALUES, str(log), kill_shard=1)
    parts = run_shards(job, 4, executor(), tmp_path / "work", key=KEY, progress=False)
    assert parts == whole(SumJob(VALUES, str(tmp_path)), 4)
    assert runs(log) == [0, 1, 1, 2, 3]  # shard 1 twice: killed, then done


def test_an_exception_names_its_shard_and_a_rerun_does_only_the_missing_ones(executor, tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    failing = SumJob(VALUES, str(log), fail_shard=2)
    with pytest.raises(ShardError) as caught:
        run_shards(failing, 4, executor(), tmp_path / "work", key=KEY, retries=1, progress=False)
    message = str(caught.value)
    assert message == (
        "shard 2/4 failed (1 try, not retried: it would fail the same way): ValueError: row 2 "
        "has no answer token"
    )
    assert runs(log).count(2) == 1  # the analysis's own exception: the same on every try
    kept = sorted(p.name for p in (tmp_path / "work").glob("shard-*"))
    assert kept == ["shard-0-of-4.json", "shard-1-of-4.json", "shard-3-of-4.json"]
    again = tmp_path / "again"
    again.mkdir()
    job = SumJob(VALUES, str(again))
    parts = run_shards(job, 4, executor(), tmp_path / "work", key=KEY, progress=False)
    assert runs(again) == [2]  # only the missing shard
    assert parts == whole(SumJob(VALUES, str(tmp_path)), 4)


def test_a_folder_of_another_run_is_refused(tmp_path):
    job = SumJob(VALUES, str(tmp_path))
    run_shards(job, 2, LocalExecutor(2), tmp_path / "work", key=KEY, progress=False)
    with pytest.raises(ValueError, match="another run .*differ in shards, task"):
        run_shards(job, 3, LocalExecutor(2), tmp_path / "work", key={"task": "x"}, progress=False)


def test_missing_extras_are_named_with_their_install_line(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    assert missing_extra("ray") == (
        '--executor ray needs ray, which is not installed: pip install "interp[ray]"'
    )
    assert missing_extra("local") is None
