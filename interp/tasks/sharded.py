"""Deprecated old path (0.6.0; goes in 0.7.0): ``interp.tasks.sharded`` imported the
analyses it ran (patching, attribution, discovery), so ``tasks`` and those folders imported
each other. Its parts now live where they belong:

- :class:`TaskShard`, :func:`run_task_shards`: :mod:`interp.tasks.shard_jobs` (a job now
  carries its shard function: ``task_shard(kind, function, model, task, settings=...)``);
- ``sharded_patch``: :mod:`interp.interventions.shards`;
- ``sharded_edge_scores``: :mod:`interp.discovery.shards`;
- ``model_source``: :mod:`interp.models.workers`.

Importing this module warns (``DeprecationWarning``); its names still work.
"""

from __future__ import annotations

from interp.attribution.shards import attribution_partial_sums
from interp.discovery.shards import discovery_partial_sums, sharded_edge_scores
from interp.foundation.doors import warn_moved_module
from interp.interventions.shards import sharded_patch, task_partial_sums
from interp.models.workers import model_source
from interp.tasks import shard_jobs
from interp.tasks.shard_jobs import TaskShard, run_task_shards

__deprecated__ = "see the module docstring; this path goes in 0.7.0"

warn_moved_module(
    __name__,
    "TaskShard and run_task_shards are in interp.tasks.shard_jobs, sharded_patch in "
    "interp.interventions.shards, sharded_edge_scores in interp.discovery.shards, model_source "
    "in interp.models.workers",
)

SHARD_FUNCTIONS = {  # kind -> f(model, task, *, shard=(i, n), **settings) -> partial dict
    "patch": task_partial_sums,
    "attribute": attribution_partial_sums,
    "discover": discovery_partial_sums,
}


def task_shard(kind: str, model, task, *, source: str | None = None, **settings) -> TaskShard:
    """The 0.5 signature: the job of ``kind`` (a key of :data:`SHARD_FUNCTIONS`)."""
    function = SHARD_FUNCTIONS[kind]
    return shard_jobs.task_shard(kind, function, model, task, source=source, settings=settings)


__all__ = [
    "SHARD_FUNCTIONS",
    "TaskShard",
    "model_source",
    "run_task_shards",
    "sharded_edge_scores",
    "sharded_patch",
]
