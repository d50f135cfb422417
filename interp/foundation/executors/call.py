"""What every worker runs: its set-up (threads, its own GPU), then one shard of a job, an
exception turned into its one line and whether trying again could help.

A shard fails for one of two reasons. The analysis raised (a ValueError on a bad row, a
TypeError, a missing file): the same job on the same rows raises the same way each time, so
it is not retried. Or the worker's resources gave out (a process killed, out of memory, a lost
connection, a preempted job): another try may succeed. :func:`transient` tells them apart;
the executors report a worker that died without an answer as transient too.
"""

from __future__ import annotations

import os
import sys

__all__ = ["TRANSIENT", "WORKER_GPU", "call_shard", "one_line", "set_up_worker", "transient"]

# exceptions of a worker's resources, by class name (torch's OutOfMemoryError is not imported
# here: the foundation imports no torch); OSError's subclasses of a lost connection or a pipe
TRANSIENT = (
    "MemoryError",
    "OutOfMemoryError",  # torch.cuda.OutOfMemoryError, torch.OutOfMemoryError
    "ConnectionError",  # and its subclasses: reset, aborted, refused, broken pipe
    "TimeoutError",
    "InterruptedError",
)
WORKER_GPU = "INTERP_WORKER_GPU"  # "1": this worker was given its own GPU(s); it loads onto "cuda"


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``: what the user sees of a worker's exception."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` may not happen again on another try (module docstring)."""
    return any(cls.__name__ in TRANSIENT for cls in type(exc).__mro__)


def set_up_worker(
    threads: int | None = None, gpus: str | None = None, own_gpu: bool = False
) -> None:
    """Give this worker process ``threads`` CPU threads and the GPUs ``gpus`` (CUDA's indices,
    ``"0"`` or ``"2,3"``), before its job runs; ``own_gpu``: its scheduler (Ray, SLURM) has
    set ``CUDA_VISIBLE_DEVICES`` to this worker's own GPUs already. ``OMP_NUM_THREADS`` is
    read when torch is imported; a worker forked with torch already imported is told with
    ``set_num_threads``.
    ``CUDA_VISIBLE_DEVICES`` is read when CUDA starts, which no worker has done yet."""
    if threads is not None:
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[name] = str(threads)
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(threads)
    if gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus
    if gpus is not None or own_gpu:
        os.environ[WORKER_GPU] = "1"


def call_shard(job, index: int, count: int, setup: dict | None = None) -> dict:
    """``{"result": job(index, count)}``, or ``{"error": one line, "transient": bool}`` when it
    raises; ``setup``: :func:`set_up_worker`'s arguments, applied first."""
    try:
        if setup:
            set_up_worker(**setup)
        return {"result": job(index, count)}
    except Exception as exc:  # the worker reports it; the driver retries or names the shard
        return {"error": one_line(exc), "transient": transient(exc)}
