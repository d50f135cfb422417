"""Run a job's shards on an executor: resume from the partials on disk, retry, one progress bar.

A job is a picklable callable ``job(index, count) -> dict``: shard ``index`` of ``count``, its
result a JSON-ready dict (a partial of :mod:`interp.interventions.shards`,
:mod:`interp.attribution.shards` or :mod:`interp.discovery.shards`). :func:`run_shards`

- asks the executor to check the job first (a CUDA model whose shards would get no GPU is
  refused before anything starts or is written);
- writes ``run.json`` (the run's ``key``: what makes two runs the same) into ``work_dir``, or
  refuses a ``work_dir`` that holds the shards of another run;
- skips the shards whose ``shard-I-of-N.json`` is already there (a re-run resumes);
- submits the others to the executor (:mod:`interp.foundation.executors.backends`: local
  processes, Ray tasks, SLURM jobs), each as ``job.for_shard(index, count)`` where the job has
  that method (so a worker receives only its shard's data), shows one bar over all shards, and
  writes each finished shard's result to disk the moment it arrives;
- resubmits a shard that failed for a transient reason (a worker killed or out of memory, a
  job preempted: :mod:`interp.foundation.executors.call`) up to ``retries`` times; an exception
  of the analysis itself (a ValueError, a TypeError...) fails the same way each time and is not
  retried. Past that, lets the shards still running finish (their results are kept) and raises
  :class:`ShardError`, one line naming the shard and what went wrong.

Scheduling (where and when a shard runs) is the executor's: Ray's or SLURM's, or the operating
system's for local processes.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from interp.foundation.files import write_text_atomic

__all__ = ["ShardError", "run_shards", "shard_path", "finished_shards"]

logger = logging.getLogger(__name__)

RUN_FILE = "run.json"  # the run's key: a folder holds the shards of one run


class ShardError(RuntimeError):
    """A shard failed more often than the retries allow; the message names it."""


def shard_path(work_dir: str | os.PathLike, index: int, count: int) -> Path:
    """Where shard ``index`` of ``count`` keeps its result."""
    return Path(work_dir) / f"shard-{index}-of-{count}.json"


def finished_shards(work_dir: str | os.PathLike, count: int) -> list[int]:
    """The shards of ``count`` whose result is on disk in ``work_dir``."""
    return [i for i in range(count) if shard_path(work_dir, i, count).is_file()]


def _check_run(work_dir: Path, key: dict) -> None:
    """Write the run's key, or refuse a folder that holds another run's shards."""
    path = work_dir / RUN_FILE
    wanted = json.loads(json.dumps(key))  # as it reads back (tuples are lists)
    if path.is_file():
        found = json.loads(path.read_text(encoding="utf-8"))
        if found != wanted:
            differ = sorted(k for k in set(found) | set(wanted) if found.get(k) != wanted.get(k))
            raise ValueError(
                f"{work_dir} holds the shards of another run (they differ in "
                f"{', '.join(differ)}); remove that folder to start over, or pass another one"
            )
        return
    write_text_atomic(path, json.dumps(wanted, indent=1) + "\n")


def run_shards(
    job: Callable[[int, int], dict],
    count: int,
    executor,
    work_dir: str | os.PathLike,
    *,
    key: dict,
    retries: int = 2,
    progress: bool = True,
    desc: str = "shards",
) -> list[dict]:
    """Every shard's result, in shard order, computing only the ones not on disk yet.

    Args:
        job: ``job(index, count) -> dict``, picklable (it travels to the workers).
        count: the number of shards.
        executor: a :mod:`interp.foundation.executors.backends` executor (``make_executor("ray")``).
        work_dir: where each finished shard's result is kept (created if missing).
        key: JSON-ready settings that make two runs the same; a ``work_dir`` holding another
            key is refused (its shards would mix two runs).
        retries: how many times a shard that failed for a transient reason is submitted
            again before giving up.
    """
    from tqdm.auto import tqdm

    if count < 1 or retries < 0:
        raise ValueError(f"count must be >= 1 and retries >= 0, got {count} and {retries}")
    if hasattr(executor, "check"):
        executor.check(job, count)
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    _check_run(work_dir, {**key, "shards": count})
    done = set(finished_shards(work_dir, count))
    failures = {i: 0 for i in range(count)}
    bar = tqdm(total=count, initial=len(done), desc=desc, unit="shard", disable=not progress)
    try:
        missing = [i for i in range(count) if i not in done]
        if missing:
            executor.start(work_dir)
        jobs = {i: job.for_shard(i, count) if hasattr(job, "for_shard") else job for i in missing}
        for index in missing:
            executor.submit(jobs[index], index, count)
        running, failed = len(missing), None
        while running:
            for index, result, error, again in executor.wait():
                running -= 1
                if error is None:
                    text = json.dumps(result) + "\n"
                    write_text_atomic(shard_path(work_dir, index, count), text)
                    bar.update(1)
                    continue
                failures[index] += 1
                tries = failures[index]
                if tries > retries or not again:  # the others still running finish, are kept
                    failed = failed or (
                        f"shard {index}/{count} failed ({tries} tr{'y' if tries == 1 else 'ies'}"
                        f"{'' if again else ', not retried: it would fail the same way'}"
                        f"): {error}"
                    )
                    continue
                logger.warning("shard %d/%d failed (%s); retrying", index, count, error)
                executor.submit(jobs[index], index, count)
                running += 1
        if failed is not None:
            raise ShardError(failed)
    finally:
        bar.close()
        executor.close()
    return [
        json.loads(shard_path(work_dir, i, count).read_text(encoding="utf-8")) for i in range(count)
    ]
