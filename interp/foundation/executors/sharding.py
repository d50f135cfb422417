"""How a task-level analysis is split and where its shards run: the ``executor=`` argument.

    discover_circuit(model, task, "eap-ig", top_n=20, executor=Sharding("ray", shards=8))
    patch_activations(model, task, sites=["resid_pre"], executor="local")

A plain name (``"local"``, ``"ray"``, ``"slurm"``) is ``Sharding(name)``: as many shards as
CPUs here (at most one per task row). ``work_dir`` keeps each finished shard's partial; with
None a temporary folder is used and removed after the merge (nothing to resume from).
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass

from interp.foundation.executors.backends import EXECUTORS, make_executor

__all__ = ["Sharding", "as_sharding"]


@dataclass(frozen=True)
class Sharding:
    """Shards of a task run by an executor (module docstring)."""

    executor: str = "local"  # local | ray | slurm
    shards: int | None = None  # None: one per CPU here, at most one per task row
    work_dir: str | None = None  # each finished shard's partial (resume); None: a temp folder
    retries: int = 2  # submissions of a failed shard after the first
    progress: bool = True  # one bar over all shards
    workers: int | None = None  # local: processes at a time (default one per CPU)
    ray_address: str | None = None  # ray: a running cluster ("auto", "ray://host:10001")
    slurm_partition: str | None = None
    slurm_time: int = 60  # minutes a SLURM job may run
    gpus_per_shard: int = 0  # ray and slurm: at least 1 for a CUDA model (checked before a start)
    slurm_cluster: str | None = None  # "local": submitit's local executor (tests)

    def __post_init__(self):
        if self.executor not in EXECUTORS:
            raise ValueError(
                f"executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}"
            )
        if self.shards is not None and self.shards < 1:
            raise ValueError(f"shards must be at least 1, got {self.shards}")

    def count(self, n_rows: int) -> int:
        """The number of shards for a task of ``n_rows`` rows (at most one per row)."""
        return min(n_rows, self.shards or os.cpu_count() or 1)

    def make(self):
        """A fresh executor of this kind, with its options (:func:`make_executor`'s keywords,
        each this Sharding's field of that name)."""
        options = list(inspect.signature(make_executor).parameters)[1:]
        return make_executor(self.executor, **{name: getattr(self, name) for name in options})


def as_sharding(executor: Sharding | str) -> Sharding:
    """``executor=`` as given to an analysis: a :class:`Sharding` or an executor's name."""
    if isinstance(executor, Sharding):
        return executor
    if isinstance(executor, str):
        return Sharding(executor)
    raise TypeError(
        f"executor must be a Sharding or one of {', '.join(EXECUTORS)}, got "
        f"{type(executor).__name__}"
    )
