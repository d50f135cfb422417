"""Run the shards of a long analysis on an executor: local processes, Ray, or SLURM.

``--shard I/N`` and ``interp merge`` already make every task-level analysis splittable, exactly;
an executor launches the N shards, retries the ones that fail, keeps each finished shard's
partial on disk (a re-run does only the missing ones) and hands the partials to the same merge::

    from interp.foundation.executors import make_executor, run_shards
    parts = run_shards(job, 8, make_executor("ray"), "work/", key={"task": fingerprint})

Nothing here imports torch; Ray and submitit are imported only when their executor is made.
docs/scale.md has the recipes.
"""

from __future__ import annotations

from interp.foundation.doors import lazy_package

_EXPORTS = {
    "run_shards": "interp.foundation.executors.runner",
    "ShardError": "interp.foundation.executors.runner",
    "finished_shards": "interp.foundation.executors.runner",
    "make_executor": "interp.foundation.executors.backends",
    "LocalExecutor": "interp.foundation.executors.local",
    "InlineExecutor": "interp.foundation.executors.local",
    "RayExecutor": "interp.foundation.executors.backends",
    "SlurmExecutor": "interp.foundation.executors.backends",
    "EXECUTORS": "interp.foundation.executors.backends",
    "Sharding": "interp.foundation.executors.sharding",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_package(__name__, _EXPORTS)
