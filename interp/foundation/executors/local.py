"""Shards on this machine: in this process one after the other, or as processes of their own.

Both have the executor methods :func:`interp.foundation.executors.run_shards` calls (``start``,
``submit``, ``wait``, ``close``; :mod:`interp.foundation.executors.backends`).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from interp.foundation.executors.call import call_shard

__all__ = ["InlineExecutor", "LocalExecutor"]

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

    def start(self, work_dir: Path) -> None:
        self._queue: collections.deque = collections.deque()

    def submit(self, job, index: int, count: int) -> None:
        self._queue.append((job, index, count))

    def wait(self) -> list[tuple[int, dict | None, str | None]]:
        job, index, count = self._queue.popleft()
        answer = call_shard(job, index, count)
        return [(index, answer.get("result"), answer.get("error"))]

    def close(self) -> None:
        pass


class LocalExecutor:
    """Shards as ``python -m interp.foundation.executors.child`` processes on this machine, at most
    ``workers`` at a time (default: one per CPU). They inherit the environment (PYTHONPATH,
    threads); a process that dies (killed, out of memory) is a failed shard."""

    def __init__(self, workers: int | None = None):
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._dir: Path | None = None
        self._jobs: dict[int, Path] = {}  # id(job) -> its pickle
        self._queue: collections.deque = collections.deque()
        self._running: dict[subprocess.Popen, tuple[int, Path, Path]] = {}
        self._tries = 0

    def start(self, work_dir: Path) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix=".local-", dir=work_dir))

    def submit(self, job, index: int, count: int) -> None:
        if id(job) not in self._jobs:
            path = self._dir / f"job-{len(self._jobs)}.pkl"
            path.write_bytes(pickle.dumps(job))
            self._jobs[id(job)] = path
        self._queue.append((self._jobs[id(job)], index, count))
        self._fill()

    def _fill(self) -> None:
        while self._queue and len(self._running) < self.workers:
            job_file, index, count = self._queue.popleft()
            self._tries += 1
            out = self._dir / f"result-{index}-{self._tries}.json"
            log = self._dir / f"stderr-{index}-{self._tries}.txt"
            with open(log, "wb") as err:
                argv = [sys.executable, "-m", "interp.foundation.executors.child", str(job_file)]
                proc = subprocess.Popen(
                    [*argv, str(index), str(count), str(out)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
            self._running[proc] = (index, out, log)

    def wait(self) -> list[tuple[int, dict | None, str | None]]:
        while True:
            ended = [p for p in self._running if p.poll() is not None]
            if ended:
                break
            time.sleep(POLL_S)
        done = []
        for proc in ended:
            index, out, log = self._running.pop(proc)
            if out.is_file():
                answer = json.loads(out.read_text(encoding="utf-8"))
                done.append((index, answer.get("result"), answer.get("error")))
            elif proc.returncode < 0:
                done.append(
                    (index, None, f"the worker process was killed (signal {-proc.returncode})")
                )
            else:
                code = proc.returncode
                done.append(
                    (index, None, f"the worker process exited with code {code}: {_last_line(log)}")
                )
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
