"""Where a shard's worker runs: its own GPU and its share of the CPUs.

A job says where its model lives with a ``device`` attribute (``"cpu"``, ``"cuda:0"``; none:
CPU). A CUDA job's workers each get a GPU of their own: the local executor hands each process
one of the GPUs this process sees (``CUDA_VISIBLE_DEVICES``, at most one process per GPU), Ray
and SLURM give each shard the ``gpus_per_shard`` they ask for, which must then be at least 1:
:func:`check_gpus` refuses a CUDA job with none (and a CPU job that asks for some) before any
shard starts. A worker given its own GPU loads the model onto ``"cuda"``, its first visible
device (:func:`interp.models.workers.worker_model`).

CPU threads: each worker gets ``cores // workers running at once`` (at least 1; at most the
``OMP_NUM_THREADS`` this process was started with, when set), so N workers do not each start
a thread per core. Ray and SLURM workers get the CPUs their shard asks for.
"""

from __future__ import annotations

import os
import sys

__all__ = ["check_gpus", "cpu_cores", "job_device", "threads_per_worker", "visible_gpus"]


def job_device(job) -> str:
    """The device ``job``'s model runs on (its ``device`` attribute; ``"cpu"`` without one)."""
    return str(getattr(job, "device", None) or "cpu")


def cpu_cores() -> int:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def threads_per_worker(workers: int) -> int:
    """Threads for each of ``workers`` processes running at once (module docstring)."""
    threads = max(1, cpu_cores() // max(1, workers))
    inherited = os.environ.get("OMP_NUM_THREADS", "")
    if inherited.isdigit() and int(inherited) >= 1:
        threads = min(threads, int(inherited))
    return threads


def visible_gpus() -> list[str]:
    """The CUDA indices this process sees: ``CUDA_VISIBLE_DEVICES`` when set, else as many as
    torch counts (torch is asked only when it is already imported: a CUDA model has been)."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [g.strip() for g in given.split(",") if g.strip() and g.strip() != "-1"]
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return []
    return [str(i) for i in range(torch.cuda.device_count())]


def check_gpus(job, gpus_per_shard: float, executor: str) -> None:
    """A ValueError, before any shard starts, when ``gpus_per_shard`` does not fit ``job``'s
    device: a CUDA model whose shards would get no GPU, or a CPU model whose shards would hold
    GPUs they never use."""
    device = job_device(job)
    if device.startswith("cuda") and not gpus_per_shard:
        raise ValueError(
            f"the model is on {device} and each {executor} shard loads it on a GPU of its own, "
            "but the shards ask for none: pass --gpus-per-shard 1 (Python: "
            "Sharding(..., gpus_per_shard=1)), or load the model with --device cpu"
        )
    if not device.startswith("cuda") and gpus_per_shard:
        raise ValueError(
            f"--gpus-per-shard {gpus_per_shard:g} with a model on {device}: the shards would "
            "hold GPUs they never use; load the model with --device cuda, or leave out "
            "--gpus-per-shard"
        )
