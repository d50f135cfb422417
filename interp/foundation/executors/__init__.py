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

from interp.foundation.doors import exports, lazy_package

_EXPORTS = exports(
    __name__,
    {
        ".runner": ("run_shards", "ShardError", "finished_shards"),
        ".backends": ("make_executor", "RayExecutor", "SlurmExecutor", "EXECUTORS"),
        ".local": ("LocalExecutor", "InlineExecutor"),
        ".sharding": ("Sharding",),
    },
)

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_package(__name__, _EXPORTS)
