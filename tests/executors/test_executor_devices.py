"""Each worker on its own device with its own threads, and no retry of an error that would
come back: tested with a fake GPU set-up on CPU (torch told it has GPUs, CUDA never started):
what each worker process receives is read back from the worker itself."""

from __future__ import annotations

import pytest
import torch

from interp.foundation.executors import LocalExecutor, ShardError, run_shards
from interp.foundation.executors import devices as devices_module
from interp.foundation.executors.call import WORKER_GPU, call_shard, transient
from interp.models.workers import worker_device
from tests.support_executors import EnvJob

KEY = {"task": "environments"}


@pytest.fixture
def fake_gpus(monkeypatch):
    """Torch says it has ``n`` GPUs (CUDA is never started), this machine 8 cores, and no
    CUDA_VISIBLE_DEVICES / OMP_NUM_THREADS of the driver's own."""

    def make(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(devices_module, "cpu_cores", lambda: 8)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    return make


def overlapping(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def test_each_local_worker_gets_its_own_gpu_and_a_share_of_the_cores(fake_gpus, tmp_path):
    fake_gpus(2)
    job = EnvJob("cuda:1", str(tmp_path))
    seen = run_shards(job, 4, LocalExecutor(2), tmp_path / "work", key=KEY, progress=False)
    assert sorted({s["cuda_visible"] for s in seen}) == ["0", "1"]
    assert all(s["worker_gpu"] == "1" for s in seen)  # each loads onto "cuda": its own GPU
    assert all(s["omp"] == "4" for s in seen)  # 8 cores, 2 workers at once
    pairs = [(a, b) for a in seen for b in seen if a["shard"] < b["shard"] and overlapping(a, b)]
    assert pairs  # the workers did run at the same time ...
    assert all(a["cuda_visible"] != b["cuda_visible"] for a, b in pairs)  # ... never on one GPU


def test_workers_are_capped_at_one_per_gpu_and_take_the_gpus_this_process_sees(
    fake_gpus, tmp_path, monkeypatch, caplog
):
    fake_gpus(8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")  # the driver was given two of the eight
    job = EnvJob("cuda:0", str(tmp_path))
    with caplog.at_level("WARNING"):
        seen = run_shards(job, 3, LocalExecutor(3), tmp_path / "work", key=KEY, progress=False)
    assert "3 workers asked for, 2 GPUs seen" in caplog.text
    assert sorted({s["cuda_visible"] for s in seen}) == ["3", "5"]
    assert not any(overlapping(a, b) and a["cuda_visible"] == b["cuda_visible"]
                   for a in seen for b in seen if a is not b)  # fmt: skip
    assert all(s["omp"] == "4" for s in seen)  # at most 2 at once: 8 cores / 2


def test_cpu_jobs_get_no_gpu_and_threads_never_above_the_drivers(fake_gpus, tmp_path, monkeypatch):
    fake_gpus(2)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    job = EnvJob("cpu", str(tmp_path), hold_s=0.0)
    seen = run_shards(job, 2, LocalExecutor(2), tmp_path / "work", key=KEY, progress=False)
    assert [s["cuda_visible"] for s in seen] == [None, None]
    assert [s["worker_gpu"] for s in seen] == [None, None]
    assert [s["omp"] for s in seen] == ["3", "3"]  # 8 cores / 2 = 4, capped at the driver's 3


def test_a_cuda_job_with_no_gpu_to_give_is_refused_before_anything_starts(fake_gpus, tmp_path):
    fake_gpus(0)
    with pytest.raises(ValueError, match="sees no GPU to give the workers"):
        run_shards(EnvJob("cuda", str(tmp_path)), 2, LocalExecutor(2), tmp_path / "work",
                   key=KEY, progress=False)  # fmt: skip
    assert not (tmp_path / "work").exists() and not list(tmp_path.glob("seen-*"))


@pytest.mark.parametrize("name", ["ray", "slurm"])
def test_ray_and_slurm_refuse_a_cuda_model_whose_shards_ask_for_no_gpu(name, tmp_path):
    from interp.foundation.executors import RayExecutor, SlurmExecutor

    pytest.importorskip({"ray": "ray", "slurm": "submitit"}[name])
    make = {"ray": lambda **g: RayExecutor(**g), "slurm": lambda **g: SlurmExecutor(**g)}[name]
    for device, gpus, message in [
        ("cuda:0", 0, "the shards ask for none: pass --gpus-per-shard 1"),
        ("cpu", 1, "--gpus-per-shard 1 with a model on cpu"),
    ]:
        with pytest.raises(ValueError, match=message):
            run_shards(EnvJob(device, str(tmp_path)), 2, make(gpus_per_shard=gpus),
                       tmp_path / "work", key=KEY, progress=False)  # fmt: skip
        assert not (tmp_path / "work").exists()  # refused before anything was written
    executor = make(gpus_per_shard=1)
    executor.check(EnvJob("cuda:2", str(tmp_path)), 2)
    assert executor.setup == {"threads": 1, "own_gpu": True}  # one CPU each, the GPU it got


def test_a_worker_given_its_gpu_loads_onto_it(monkeypatch):
    monkeypatch.delenv(WORKER_GPU, raising=False)
    assert worker_device("cuda:3") == "cuda:3"  # the driver's own process: as given
    monkeypatch.setenv(WORKER_GPU, "1")
    assert worker_device("cuda:3") == "cuda"  # its one visible GPU
    assert worker_device("cpu") == "cpu"


def test_only_transient_errors_are_retried(tmp_path):
    for name, tries in [("TypeError", 1), ("MemoryError", 3)]:
        log = tmp_path / name
        log.mkdir()
        job = EnvJob("cpu", str(log), raise_in=name)
        with pytest.raises(ShardError, match=f"failed \\({tries} tr"):
            run_shards(job, 1, LocalExecutor(1), log / "work", key=KEY, retries=2,
                       progress=False)  # fmt: skip
        assert len(list(log.glob("try-*"))) == tries


def test_what_counts_as_transient(tmp_path):
    assert not transient(ValueError()) and not transient(TypeError())
    assert not transient(FileNotFoundError()) and not transient(KeyError())
    assert transient(MemoryError()) and transient(torch.OutOfMemoryError("CUDA out of memory"))
    assert transient(ConnectionResetError()) and transient(TimeoutError())
    answer = call_shard(EnvJob("cpu", str(tmp_path), raise_in="TypeError"), 0, 1)
    assert answer == {"error": "TypeError: no", "transient": False}
