"""Task-level analyses on an executor: each worker loads the model, runs its shard with the
existing shard functions, and the driver merges the partials with the existing merges.

:class:`TaskShard` is the picklable job: which shard function (:data:`SHARD_FUNCTIONS`), the
model's checkpoint (a name or folder ``interp.load_model`` takes, loaded once per worker
process) with its fingerprint (checked in the worker: a model changed in memory after loading
is refused, not silently replaced), the task's rows and the function's settings.
:func:`run_task_shards` runs one over a :class:`interp.foundation.executors.Sharding`;
:func:`sharded_edge_scores` and :func:`sharded_patch` are what ``discover_circuit(...,
executor=)`` and ``patch_activations(task, ..., executor=)`` call.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field

import pandas as pd

from interp.attribution.shards import attribution_partial_sums
from interp.discovery.shards import discovery_partial_sums, merge_discovery_sums
from interp.foundation.executors.runner import run_shards
from interp.foundation.executors.sharding import Sharding, as_sharding
from interp.interventions.shards import merge_partial_sums, task_fingerprint, task_partial_sums
from interp.models.fingerprint import model_fingerprint
from interp.models.workers import model_source, worker_model
from interp.tasks import Task

__all__ = [
    "SHARD_FUNCTIONS",
    "TaskShard",
    "model_source",
    "run_task_shards",
    "sharded_edge_scores",
    "sharded_patch",
]

SHARD_FUNCTIONS = {  # kind -> f(model, task, *, shard=(i, n), **settings) -> partial dict
    "patch": task_partial_sums,
    "attribute": attribution_partial_sums,
    "discover": discovery_partial_sums,
}


@dataclass(frozen=True)
class TaskShard:
    """One task-level analysis, runnable shard by shard in any worker (module docstring)."""

    kind: str  # a key of SHARD_FUNCTIONS
    model: str  # what interp.load_model takes
    device: str
    dtype: str  # "float32", ...
    records: tuple  # the task's rows (Task.to_records())
    settings: dict = field(default_factory=dict)  # the shard function's keyword arguments
    fingerprint: str | None = None  # the driver's model_fingerprint; None: not checked

    def __call__(self, index: int, count: int) -> dict:
        model = worker_model(self.model, self.device, self.dtype, self.fingerprint)
        task = Task.from_records(self.records)
        return SHARD_FUNCTIONS[self.kind](model, task, shard=(index, count), **self.settings)


def task_shard(kind: str, model, task, *, source: str | None = None, **settings) -> TaskShard:
    """The job of ``kind`` for ``model`` (loaded from ``source``, default its checkpoint)."""
    if not isinstance(task, Task):
        raise ValueError(
            f"executor= needs a Task (its rows travel to the workers), got {type(task).__name__}"
        )
    dtype = next(model.parameters()).dtype
    return TaskShard(
        kind=kind,
        model=source or model_source(model),
        device=str(model.cfg.device),
        dtype=str(dtype).removeprefix("torch."),
        records=tuple(task.to_records()),
        settings=settings,
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


def _key(task: Task, settings: dict) -> dict:
    return {"task": task_fingerprint(task), **settings}


def sharded_edge_scores(
    model,
    task: Task,
    method: str,
    executor: Sharding | str,
    *,
    metric: str = "logit_diff",
    ig_steps: int = 5,
    max_bytes: int | str | None = None,
) -> pd.DataFrame:
    """:func:`interp.discovery.edge_scores`'s frame (scored methods), its shards run by
    ``executor``: the merge of :mod:`interp.discovery.shards`."""
    settings = {"method": method, "metric": metric, "ig_steps": ig_steps, "max_bytes": max_bytes}
    job = task_shard("discover", model, task, **settings)
    parts = run_task_shards(job, len(task), as_sharding(executor), _key(task, settings))
    return merge_discovery_sums(parts)


def sharded_patch(
    model,
    task: Task,
    executor: Sharding | str,
    *,
    metric: str = "logit_diff",
    sites=("resid_pre",),
    direction: str = "denoising",
    method: str = "exact",
    layers=None,
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
) -> pd.DataFrame:
    """:func:`interp.patch_activations`'s table over ``task``, its shards run by ``executor``:
    the merge of :mod:`interp.interventions.shards`."""
    settings = {
        "metric": metric,
        "sites": list(sites),
        "direction": direction,
        "method": method,
        "layers": None if layers is None else list(layers),
        "max_rows": max_rows,
        "max_bytes": max_bytes,
    }
    job = task_shard("patch", model, task, **settings)
    parts = run_task_shards(job, len(task), as_sharding(executor), _key(task, settings))
    return merge_partial_sums(parts)
