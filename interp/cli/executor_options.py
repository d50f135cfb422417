"""``--executor local|ray|slurm --shards N`` and their options, for every command with ``--shard``.

Checked before any model loads (and without importing Ray or submitit: a missing one is refused
with its install line; ``--executor slurm`` without ``sbatch`` too). Each finished shard's
partial is kept in ``OUT/.interp-shards/`` until the merged files are in place, so a run that
stopped (a failed shard, Ctrl-C, a lost node) is resumed by running the same command again:
only the missing shards run (docs/scale.md). A run that stopped before any shard finished
leaves nothing there. Kept shards of a run with other settings are found before the model
loads: without finished shards they are cleared; with some, the command is refused, naming the
folder, unless ``--restart`` discards them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

from interp.cli.options import int_between
from interp.cli.output import UsageError

__all__ = [
    "WORK_DIR",
    "add_executor_arguments",
    "check_executor",
    "command_key",
    "finished",
    "sbatch_found",
    "sharding_of",
]

WORK_DIR = ".interp-shards"  # inside --out: each finished shard's partial, until the merge
EXECUTORS = ("local", "ray", "slurm")  # interp.foundation.executors.EXECUTORS, torch-free (tested)
RUN_FILE = "run.json"  # interp.foundation.executors.runner's: the kept run's key
# options that change where or how the shards run, not what they compute
RUNNING = ("out", "device", "executor", "retries", "ray_address", "slurm_partition", "slurm_time",
           "gpus_per_shard", "verbose", "run", "restart")  # fmt: skip


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
    group.add_argument(
        "--restart",
        action="store_true",
        help=f"discard the finished shards kept in OUT/{WORK_DIR} by an earlier run and start over",
    )


def check_executor(args: argparse.Namespace, n_rows: int, *, scored: bool = True) -> None:
    """Every refusal of the executor options, before any model loads; UsageError."""
    name = args.executor
    if name is None:
        given = [o for o in ("--shards", "--ray-address", "--slurm-partition") if _given(args, o)]
        given += ["--restart"] if getattr(args, "restart", False) else []
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
    if name == "slurm" and not sbatch_found():
        raise UsageError(
            "--executor slurm needs SLURM's sbatch, which is not on PATH here: run the command "
            "on a login node of the cluster, or use --executor local"
        )
    _check_kept(args)


def sbatch_found() -> bool:
    """Whether SLURM's ``sbatch`` is on PATH (tests replace this to run submitit locally)."""
    return shutil.which("sbatch") is not None


def command_key(args: argparse.Namespace) -> dict:
    """What the command line says the shards compute, known before the model loads: every
    option but those of :data:`RUNNING`, and the task file's bytes by their hash. It goes into
    the kept run's key, so that a kept run with other settings is found before loading."""
    key = {
        name: str(value) if isinstance(value, Path) else value
        for name, value in sorted(vars(args).items())
        if name not in RUNNING
    }
    task = Path(str(args.task))
    if task.is_file():
        key["task_sha256"] = hashlib.sha256(task.read_bytes()).hexdigest()
    return json.loads(json.dumps(key, default=str))


def finished(work_dir: Path) -> list[Path]:
    """The finished shards' partials kept in ``work_dir``."""
    return sorted(work_dir.glob("shard-*-of-*.json")) if work_dir.is_dir() else []


def _check_kept(args: argparse.Namespace) -> None:
    """Kept shards of another run: cleared if none finished (nothing is lost), else refused
    here, before loading, naming the folder, unless ``--restart``."""
    work_dir = Path(args.out) / WORK_DIR
    if not work_dir.is_dir():
        return
    if args.restart:
        shutil.rmtree(work_dir)
        return
    try:
        kept = json.loads((work_dir / RUN_FILE).read_text(encoding="utf-8")).get("command")
    except (OSError, ValueError, AttributeError):
        kept = None
    if kept == command_key(args):
        return  # the same run: only the missing shards run
    done = finished(work_dir)
    if not done:
        shutil.rmtree(work_dir)  # an interrupted run that finished nothing: nothing to resume
        return
    wanted = command_key(args)
    differ = (
        sorted(k for k in set(kept) | set(wanted) if kept.get(k) != wanted.get(k))
        if isinstance(kept, dict)
        else ["version"]
    )
    shown = ", ".join(_option(k) for k in differ)
    raise UsageError(
        f"{work_dir} keeps {len(done)} finished shard(s) of an earlier run with other settings "
        f"({shown}); run that command again to finish it, or pass --restart to discard them "
        "(or delete that folder)"
    )


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


def _option(key: str) -> str:
    if key == "task_sha256":
        return "the task file's contents"
    if key == "command":
        return "the command"
    return "another interp version" if key == "version" else "--" + key.replace("_", "-")


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
