"""Shards on this machine: in this process one after the other, or as processes of their own.

Both have the executor methods :func:`interp.foundation.executors.run_shards` calls (``check``,
``start``, ``submit``, ``wait``, ``close``; :mod:`interp.foundation.executors.backends`). Each
process gets its share of the CPU threads and, for a job on CUDA, a GPU of its own
(:mod:`interp.foundation.executors.devices`).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from interp.foundation.executors.call import call_shard
from interp.foundation.executors.devices import job_device, threads_per_worker, visible_gpus

__all__ = ["InlineExecutor", "LocalExecutor"]

logger = logging.getLogger(__name__)

POLL_S = 0.05  # how often the processes are looked at


def _last_line(path: Path) -> str:
    with contextlib.suppress(OSError):
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
        if lines:
            return lines[-1].strip()
    return "no message"


class InlineExecutor:
    """Shards one after the other in this process: no worker to start, nothing to pickle (the
    Python API's default where no executor is given; what the CLI never needs)."""

    def check(self, job, count: int) -> None:
        pass

    def start(self, work_dir: Path) -> None:
        self._queue: collections.deque = collections.deque()

    def submit(self, job, index: int, count: int) -> None:
        self._queue.append((job, index, count))

    def wait(self) -> list[tuple[int, dict | None, str | None, bool]]:
        job, index, count = self._queue.popleft()
        answer = call_shard(job, index, count)
        return [(index, answer.get("result"), answer.get("error"), answer.get("transient", True))]

    def close(self) -> None:
        pass


class LocalExecutor:
    """Shards as ``python -m interp.foundation.executors.child`` processes on this machine, at most
    ``workers`` at a time (default: one per CPU; for a CUDA job at most one per GPU seen here).
    They inherit the environment (PYTHONPATH); each is given ``cores // workers at once``
    threads and, for a CUDA job, one GPU of its own (``CUDA_VISIBLE_DEVICES``). A process that
    dies (killed, out of memory) is a failed shard, tried again."""

    def __init__(self, workers: int | None = None):
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._dir: Path | None = None
        self._jobs: dict[int, Path] = {}  # id(job) -> its pickle
        self._queue: collections.deque = collections.deque()
        self._running: dict[subprocess.Popen, tuple[int, Path, Path, str | None]] = {}
        self._gpus: list[str] | None = None  # a CUDA job's GPUs, one process each; None: CPU
        self._threads: int | None = None  # each process's threads
        self._tries = 0

    def check(self, job, count: int) -> None:
        """Refuse a CUDA job where no GPU is visible, before any shard starts."""
        self._plan(job)

    def _plan(self, job) -> None:
        device = job_device(job)
        if not device.startswith("cuda"):
            return
        gpus = visible_gpus()
        if not gpus:
            raise ValueError(
                f"the model is on {device} but this process sees no GPU to give the workers "
                "(CUDA_VISIBLE_DEVICES is empty, or CUDA is not available); load it with "
                "--device cpu"
            )
        if self.workers > len(gpus):
            logger.warning(
                "%d workers asked for, %d GPUs seen: running %d at a time, one per GPU",
                self.workers, len(gpus), len(gpus),
            )  # fmt: skip
        self._gpus = gpus

    def start(self, work_dir: Path) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix=".local-", dir=work_dir))

    def submit(self, job, index: int, count: int) -> None:
        if id(job) not in self._jobs:
            if not self._jobs:
                self._plan(job)
            path = self._dir / f"job-{len(self._jobs)}.pkl"
            path.write_bytes(pickle.dumps(job))
            self._jobs[id(job)] = path
        self._queue.append((self._jobs[id(job)], index, count))  # started by wait()

    def _fill(self) -> None:
        at_once = self.workers if self._gpus is None else min(self.workers, len(self._gpus))
        while self._queue and len(self._running) < at_once:
            job_file, index, count = self._queue.popleft()
            self._tries += 1
            out = self._dir / f"result-{index}-{self._tries}.json"
            log = self._dir / f"stderr-{index}-{self._tries}.txt"
            if self._threads is None:  # decided once: the processes that will run together
                self._threads = threads_per_worker(min(at_once, 1 + len(self._queue)))
            setup = {"threads": self._threads}
            gpu = None
            if self._gpus is not None:
                held = {g for *_, g in self._running.values()}
                gpu = next(g for g in self._gpus if g not in held)
                setup["gpus"] = gpu
            with open(log, "wb") as err:
                argv = [sys.executable, "-m", "interp.foundation.executors.child", str(job_file)]
                proc = subprocess.Popen(
                    [*argv, str(index), str(count), str(out), json.dumps(setup)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
            self._running[proc] = (index, out, log, gpu)

    def wait(self) -> list[tuple[int, dict | None, str | None, bool]]:
        self._fill()
        while True:
            ended = [p for p in self._running if p.poll() is not None]
            if ended:
                break
            time.sleep(POLL_S)
        done = []
        for proc in ended:
            index, out, log, _ = self._running.pop(proc)
            if out.is_file():
                answer = json.loads(out.read_text(encoding="utf-8"))
                error = answer.get("error")
                done.append((index, answer.get("result"), error, answer.get("transient", True)))
            elif proc.returncode < 0:
                error = f"the worker process was killed (signal {-proc.returncode})"
                done.append((index, None, error, True))
            else:
                code = proc.returncode
                error = f"the worker process exited with code {code}: {_last_line(log)}"
                done.append((index, None, error, True))
        self._fill()
        return done

    def close(self) -> None:
        for proc in self._running:
            proc.kill()
            proc.wait()
        self._running.clear()
        self._queue.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
