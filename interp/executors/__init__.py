"""Run the shards of a long analysis on an executor: local processes, Ray, or SLURM.

``--shard I/N`` and ``interp merge`` already make every task-level analysis splittable, exactly;
an executor launches the N shards, retries the ones that fail, keeps each finished shard's
partial on disk (a re-run does only the missing ones) and hands the partials to the same merge::

    from interp.executors import make_executor, run_shards
    parts = run_shards(job, 8, make_executor("ray"), "work/", key={"task": fingerprint})

Nothing here imports torch; Ray and submitit are imported only when their executor is made.
docs/scale.md has the recipes.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "run_shards": "interp.executors.runner",
    "ShardError": "interp.executors.runner",
    "finished_shards": "interp.executors.runner",
    "make_executor": "interp.executors.backends",
    "LocalExecutor": "interp.executors.local",
    "InlineExecutor": "interp.executors.local",
    "RayExecutor": "interp.executors.backends",
    "SlurmExecutor": "interp.executors.backends",
    "EXECUTORS": "interp.executors.backends",
    "Sharding": "interp.executors.sharding",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'interp.executors' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
