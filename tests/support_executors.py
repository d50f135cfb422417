"""Jobs for the executor tests: plain Python (no model), picklable, so that what is tested is
the running of shards (resume, retries, killed workers, messages), in a second or two."""

from __future__ import annotations

import os
import signal
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


def runs(log: Path) -> list[int]:
    """The shards that ran, once per run (sorted)."""
    return sorted(int(p.name.split("-")[1]) for p in log.iterdir() if p.name.startswith("ran-"))
