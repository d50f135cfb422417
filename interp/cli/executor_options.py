"""``--executor local|ray|slurm --shards N`` and their options, for every command with ``--shard``.

Checked before any model loads (and without importing Ray or submitit: a missing one is refused
with its install line). Each finished shard's partial is kept in ``OUT/.interp-shards/`` until
the merged files are in place, so a run that stopped (a failed shard, Ctrl-C, a lost node) is
resumed by running the same command again: only the missing shards run (docs/scale.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from interp.cli.options import int_between
from interp.cli.output import UsageError

__all__ = ["WORK_DIR", "add_executor_arguments", "check_executor", "sharding_of"]

WORK_DIR = ".interp-shards"  # inside --out: each finished shard's partial, until the merge
EXECUTORS = ("local", "ray", "slurm")  # interp.foundation.executors.EXECUTORS, torch-free (tested)


def add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    """``--executor``, ``--shards``, ``--retries`` and the Ray and SLURM options."""
    group = parser.add_argument_group("running the shards (docs/scale.md)")
    group.add_argument(
        "--executor",
        choices=EXECUTORS,
        default=None,
        help="split the task into --shards N, run them as local processes, Ray tasks or SLURM "
        "jobs, retry failures, merge; re-running resumes",
    )
    group.add_argument("--shards", type=int_between(1), default=None, help="with --executor")
    group.add_argument(
        "--retries", type=int_between(0, 100), default=2, help="per failed shard (default 2)"
    )
    group.add_argument("--ray-address", default=None, help="ray: a running cluster (or auto)")
    group.add_argument("--slurm-partition", default=None, help="slurm: the partition")
    group.add_argument(
        "--slurm-time", type=int_between(1), default=60, help="slurm: minutes per job (60)"
    )
    group.add_argument(
        "--gpus-per-shard", type=int_between(0), default=0, help="ray, slurm: GPUs per shard (0)"
    )


def check_executor(args: argparse.Namespace, n_rows: int, *, scored: bool = True) -> None:
    """Every refusal of the executor options, before any model loads; UsageError."""
    name = args.executor
    if name is None:
        given = [o for o in ("--shards", "--ray-address", "--slurm-partition") if _given(args, o)]
        if given:
            raise UsageError(f"{', '.join(given)} need --executor local, ray or slurm")
        return
    if not scored:
        raise UsageError(
            "--method acdc has no shards (each decision depends on the ones before it); leave "
            "out --executor, or use exact, eap or eap-ig"
        )
    if args.shard is not None:
        raise UsageError("--executor runs every shard itself; leave out --shard I/N")
    if args.shards is None:
        raise UsageError(f"--executor {name} needs --shards N (e.g. --shards 8)")
    if args.shards > n_rows:
        raise UsageError(f"--shards {args.shards}: the task has {n_rows} rows; use at most that")
    if name != "ray" and args.ray_address is not None:
        raise UsageError("--ray-address is for --executor ray")
    if name != "slurm" and args.slurm_partition is not None:
        raise UsageError("--slurm-partition is for --executor slurm")
    if name == "local" and args.gpus_per_shard:
        raise UsageError("--gpus-per-shard is for --executor ray or slurm")
    _check_gpus(name, str(getattr(args, "device", "cpu")), args.gpus_per_shard)
    from interp.foundation.executors.backends import missing_extra

    line = missing_extra(name)
    if line is not None:
        raise UsageError(line)


def _check_gpus(name: str, device: str, gpus: int) -> None:
    """Each ray or slurm shard loads the model on its own device: a GPU it asked for, or none
    (interp.foundation.executors.devices.check_gpus, said with the flags)."""
    if name == "local":
        return  # the local executor gives each process one of the GPUs seen here
    if device.startswith("cuda") and not gpus:
        raise UsageError(
            f"--device {device} with --executor {name}: each shard loads the model on a GPU of "
            "its own; pass --gpus-per-shard 1 (or --device cpu)"
        )
    if not device.startswith("cuda") and gpus:
        raise UsageError(
            f"--gpus-per-shard {gpus} with --device {device}: the shards would hold GPUs they "
            "never use; pass --device cuda, or leave out --gpus-per-shard"
        )


def _given(args: argparse.Namespace, option: str) -> bool:
    return getattr(args, option[2:].replace("-", "_"), None) is not None


def sharding_of(args: argparse.Namespace, out: Path):
    """The :class:`interp.foundation.executors.Sharding` the options describe, kept in ``out``."""
    from interp.foundation.executors.sharding import Sharding

    return Sharding(
        args.executor,
        shards=args.shards,
        work_dir=str(Path(out) / WORK_DIR),
        retries=args.retries,
        ray_address=args.ray_address,
        slurm_partition=args.slurm_partition,
        slurm_time=args.slurm_time,
        gpus_per_shard=args.gpus_per_shard,
    )
