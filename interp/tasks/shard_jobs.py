"""A task's analysis run shard by shard on an executor: each worker loads the model, runs its
shard with the analysis's own shard function, and the driver gets the partials back to merge.

:class:`TaskShard` is the picklable job: the shard function (a module-level function, pickled by
reference: ``f(model, task, *, shard=(i, n), **settings) -> partial dict``), the model's
checkpoint (a name or folder ``interp.load_model`` takes, loaded once per worker process) with its
fingerprint (checked in the worker: a model changed in memory after loading is refused, not
silently replaced), the task's rows and the function's settings. :func:`run_task_shards` runs one
over a :class:`interp.foundation.executors.Sharding`. Nothing here knows an analysis: each brings
its function and its merge (``interventions.shards.sharded_patch``,
``discovery.shards.sharded_edge_scores``, the command line's ``--executor``), so the analyses
sit above this module and never below it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

from interp.foundation.executors.runner import run_shards
from interp.foundation.executors.sharding import Sharding
from interp.models.fingerprint import model_fingerprint
from interp.models.workers import model_source, worker_model
from interp.tasks.task import Task

__all__ = ["ShardFunction", "TaskShard", "run_task_shards", "task_shard"]

ShardFunction = Callable[..., dict]  # f(model, task, *, shard=(i, n), **settings) -> partial


@dataclass(frozen=True)
class TaskShard:
    """One task-level analysis, runnable shard by shard in any worker (module docstring)."""

    kind: str  # what the partials' key and the progress bar call it: "patch", "discover", ...
    function: ShardFunction  # module-level, so that it pickles by reference
    model: str  # what interp.load_model takes
    device: str
    dtype: str  # "float32", ...
    records: tuple  # the task's rows (Task.to_records())
    settings: dict = field(default_factory=dict)  # the shard function's keyword arguments
    fingerprint: str | None = None  # the driver's model_fingerprint; None: not checked

    def __call__(self, index: int, count: int) -> dict:
        model = worker_model(self.model, self.device, self.dtype, self.fingerprint)
        task = Task.from_records(self.records)
        return self.function(model, task, shard=(index, count), **self.settings)


def task_shard(
    kind: str,
    function: ShardFunction,
    model,
    task,
    *,
    source: str | None = None,
    settings: dict | None = None,
) -> TaskShard:
    """The job running ``function`` over ``task`` for ``model`` (loaded in each worker from
    ``source``, default its checkpoint), called ``kind`` in the partials' key."""
    if not isinstance(task, Task):
        raise ValueError(
            f"executor= needs a Task (its rows travel to the workers), got {type(task).__name__}"
        )
    dtype = next(model.parameters()).dtype
    return TaskShard(
        kind=kind,
        function=function,
        model=source or model_source(model),
        device=str(model.cfg.device),
        dtype=str(dtype).removeprefix("torch."),
        records=tuple(task.to_records()),
        settings=dict(settings or {}),
        fingerprint=model_fingerprint(model),
    )


def run_task_shards(job: TaskShard, n_rows: int, sharding: Sharding, key: dict) -> list[dict]:
    """Every shard's partial, computed on ``sharding``'s executor (only the missing ones)."""
    count = sharding.count(n_rows)
    work_dir = sharding.work_dir or tempfile.mkdtemp(prefix="interp-shards-")
    try:
        return run_shards(
            job,
            count,
            sharding.make(),
            work_dir,
            key={"kind": job.kind, "model": job.fingerprint, **key},
            retries=sharding.retries,
            progress=sharding.progress,
            desc=f"{job.kind} shards",
        )
    finally:
        if sharding.work_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)
