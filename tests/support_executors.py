"""Jobs for the executor tests: plain Python (no model), picklable, so that what is tested is
the running of shards (resume, retries, killed workers, messages), in a second or two."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SumJob:
    """Shard ``i`` of ``n`` sums rows ``i, i + n, ...`` of ``values`` (as the task shards do),
    and leaves a mark in ``log`` each time it runs (to count what a re-run re-does)."""

    values: tuple[float, ...]
    log: str
    kill_shard: int | None = None  # this shard's process kills itself, once (a marker file)
    fail_shard: int | None = None  # this shard raises, every time

    def __call__(self, index: int, count: int) -> dict:
        Path(self.log, f"ran-{index}-{os.getpid()}-{len(os.listdir(self.log))}").touch()
        if index == self.fail_shard:
            raise ValueError(f"row {index} has no answer token\nsecond line of the message")
        marker = Path(self.log, f"killed-{index}")
        if index == self.kill_shard and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-run, as OOM kills do
        rows = list(range(index, len(self.values), count))
        return {"shard": index, "rows": rows, "sum": sum(self.values[r] for r in rows)}


@dataclass(frozen=True)
class EnvJob:
    """Records what its worker process was given (torch-free: a fresh interpreter starts in
    a fraction of a second); ``device`` is where the driver's model would be."""

    device: str
    log: str
    hold_s: float = 0.3  # long enough for the workers to overlap
    raise_in: str | None = None  # an exception class name every shard raises

    def __call__(self, index: int, count: int) -> dict:
        start = time.monotonic()
        if self.raise_in is not None:
            Path(self.log, f"try-{index}-{os.getpid()}-{time.monotonic_ns()}").touch()
            raise {"MemoryError": MemoryError, "TypeError": TypeError}[self.raise_in]("no")
        time.sleep(self.hold_s)
        seen = {
            "shard": index,
            "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "omp": os.environ.get("OMP_NUM_THREADS"),
            "worker_gpu": os.environ.get("INTERP_WORKER_GPU"),
            "start": start,
            "end": time.monotonic(),
        }
        Path(self.log, f"seen-{index}.json").write_text(json.dumps(seen))
        return seen


def runs(log: Path) -> list[int]:
    """The shards that ran, once per run (sorted)."""
    return sorted(int(p.name.split("-")[1]) for p in log.iterdir() if p.name.startswith("ran-"))
