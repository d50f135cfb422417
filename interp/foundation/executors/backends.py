"""Where shards run: processes on this machine, Ray tasks, or SLURM jobs through submitit.

Each executor has the same five methods, which :func:`interp.foundation.executors.run_shards`
calls: ``check(job, count)`` (refuses, before anything starts, a job its workers cannot run:
a CUDA model whose shards get no GPU), ``start(work_dir)``, ``submit(job, index, count)``,
``wait()`` (blocks until at least one submitted shard ends; returns ``(index, result, error,
transient)`` for each, ``error`` a one-line text or None, ``transient`` whether another try may
help) and ``close()`` (cancels what still runs). Local processes (and the in-process
:class:`InlineExecutor`) are in :mod:`interp.foundation.executors.local`. Every worker runs
:func:`interp.foundation.executors.call.call_shard`, which sets the worker up (threads, its own
GPU: :mod:`interp.foundation.executors.devices`) and turns an exception into its one line, so a
failure reads the same on every executor. Ray and submitit are optional: imported when an
executor is made, refused with the install line when missing (:func:`require`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import shutil
import time
from pathlib import Path

from interp.foundation.executors.call import call_shard
from interp.foundation.executors.devices import check_gpus, job_device
from interp.foundation.executors.local import LocalExecutor

__all__ = [
    "EXECUTORS",
    "RayExecutor",
    "SlurmExecutor",
    "make_executor",
    "missing_extra",
    "require",
]

EXECUTORS = ("local", "ray", "slurm")  # the --executor names
EXTRAS = {"ray": ("ray", "ray"), "slurm": ("submitit", "slurm")}  # executor: (module, extra)
POLL_S = 0.5  # how often SLURM jobs are looked at (submitit asks sacct, rate-limited)


def missing_extra(name: str) -> str | None:
    """The install line when executor ``name`` needs a package that is not installed."""
    if name not in EXTRAS:
        return None
    module, extra = EXTRAS[name]
    if importlib.util.find_spec(module) is not None:
        return None
    return (
        f'--executor {name} needs {module}, which is not installed: pip install "interp[{extra}]"'
    )


def require(name: str):
    """The module executor ``name`` runs on; ImportError with the install line when missing."""
    line = missing_extra(name)
    if line is not None:
        raise ImportError(line)
    return importlib.import_module(EXTRAS[name][0])


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or ["no message"])[0]


def _died(exc: BaseException) -> str:
    return f"the Ray worker died ({type(exc).__name__}: {_first_line(exc)})"


def _job_lost(job_id, exc: BaseException) -> str:
    return f"SLURM job {job_id} ended without a result ({_first_line(exc)})"


def _collect(index: int, get, errors, lost) -> tuple:
    """``(index, result, error, transient)`` of a finished shard: its worker's answer from
    ``get()``, or where that raises one of ``errors``, the transient error ``lost(exc)``."""
    try:
        answer = get()
    except errors as exc:
        return index, None, lost(exc), True
    return index, answer.get("result"), answer.get("error"), answer.get("transient", True)


class RayExecutor:
    """Shards as Ray tasks: on the cluster at ``address`` (``"auto"``, ``"ray://host:10001"``),
    or on a local one started here (and stopped by :meth:`close`) when None and none runs.
    Ray places them; each asks for ``cpus_per_shard`` CPUs (its threads) and ``gpus_per_shard``
    GPUs (Ray sets its ``CUDA_VISIBLE_DEVICES``; at least 1 for a CUDA model)."""

    def __init__(
        self, address: str | None = None, *, cpus_per_shard: float = 1, gpus_per_shard: float = 0
    ):
        self.ray = require("ray")
        self.address = address
        self.resources = {"num_cpus": cpus_per_shard, "num_gpus": gpus_per_shard}
        self.setup = {"threads": max(1, int(cpus_per_shard))}
        self._started = False
        self._refs: dict = {}  # object ref -> shard index
        self._jobs: dict[int, object] = {}  # id(job) -> its ref in the object store

    def check(self, job, count: int) -> None:
        check_gpus(job, self.resources["num_gpus"], "ray")
        if job_device(job).startswith("cuda"):
            self.setup["own_gpu"] = True

    def start(self, work_dir: Path) -> None:
        ray = self.ray
        if not ray.is_initialized():
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
            self._started = True
        self._remote = ray.remote(max_retries=0, **self.resources)(call_shard)

    def submit(self, job, index: int, count: int) -> None:
        if id(job) not in self._jobs:
            self._jobs[id(job)] = self.ray.put(job)
        ref = self._remote.remote(self._jobs[id(job)], index, count, self.setup)
        self._refs[ref] = index

    def wait(self) -> list[tuple[int, dict | None, str | None, bool]]:
        ready, _ = self.ray.wait(list(self._refs), num_returns=1)
        done = []
        for ref in ready:
            index = self._refs.pop(ref)
            get = functools.partial(self.ray.get, ref)
            done.append(_collect(index, get, self.ray.exceptions.RayError, _died))
        return done

    def close(self) -> None:
        for ref in self._refs:
            with contextlib.suppress(Exception):
                self.ray.cancel(ref, force=True)
        self._refs.clear()
        self._jobs.clear()
        if self._started:
            self.ray.shutdown()
            self._started = False


class SlurmExecutor:
    """Shards as SLURM jobs through submitit, each in ``partition`` for at most ``time_min``
    minutes with ``gpus_per_shard`` GPUs (SLURM sets their ``CUDA_VISIBLE_DEVICES``; at least 1
    for a CUDA model) and ``cpus_per_shard`` CPUs (their threads); their logs go under
    ``work_dir/slurm``, which must be on a file system the nodes share. ``cluster="local"``:
    submitit's local executor (the same code path, processes on this machine; what the tests
    run)."""

    def __init__(
        self,
        *,
        partition: str | None = None,
        time_min: int = 60,
        gpus_per_shard: int = 0,
        cpus_per_shard: int = 1,
        cluster: str | None = None,
    ):
        self.submitit = require("slurm")
        self.params = {
            "timeout_min": time_min,
            "gpus_per_node": gpus_per_shard,
            "cpus_per_task": cpus_per_shard,
            "name": "interp-shard",
        }
        if partition is not None:
            self.params["slurm_partition"] = partition
        self.setup = {"threads": max(1, int(cpus_per_shard))}
        self.cluster = cluster or "slurm"  # never submitit's silent fallback to local
        self._jobs: dict = {}  # submitit job -> shard index

    def check(self, job, count: int) -> None:
        check_gpus(job, self.params["gpus_per_node"], "slurm")
        if job_device(job).startswith("cuda"):
            self.setup["own_gpu"] = True

    def start(self, work_dir: Path) -> None:
        if self.cluster in (None, "slurm") and shutil.which("sbatch") is None:
            raise RuntimeError(
                "--executor slurm needs SLURM's sbatch here: run it on a login node of the "
                "cluster (or use --executor local)"
            )
        self._ex = self.submitit.AutoExecutor(folder=Path(work_dir) / "slurm", cluster=self.cluster)
        self._ex.update_parameters(**self.params)

    def submit(self, job, index: int, count: int) -> None:
        self._jobs[self._ex.submit(call_shard, job, index, count, self.setup)] = index

    def wait(self) -> list[tuple[int, dict | None, str | None, bool]]:
        while True:
            ended = [j for j in self._jobs if j.done()]
            if ended:
                break
            time.sleep(POLL_S)
        done = []
        for job in ended:
            index = self._jobs.pop(job)
            # submitit's UncompletedJobError, FailedJobError: timed out, preempted, node lost
            lost = functools.partial(_job_lost, job.job_id)
            done.append(_collect(index, job.result, Exception, lost))
        return done

    def close(self) -> None:
        for job in self._jobs:
            with contextlib.suppress(Exception):
                job.cancel(check=False)
        self._jobs.clear()


def make_executor(
    name: str,
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    slurm_partition: str | None = None,
    slurm_time: int = 60,
    gpus_per_shard: int = 0,
    slurm_cluster: str | None = None,
):
    """The executor called ``name`` (one of :data:`EXECUTORS`) with its options."""
    if name == "local":
        return LocalExecutor(workers)
    if name == "ray":
        return RayExecutor(ray_address, gpus_per_shard=gpus_per_shard)
    if name == "slurm":
        return SlurmExecutor(
            partition=slurm_partition,
            time_min=slurm_time,
            gpus_per_shard=gpus_per_shard,
            cluster=slurm_cluster,
        )
    raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got {name!r}")
