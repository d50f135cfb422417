"""The ``--executor`` path of ``interp patch --task``, ``interp attribute --task`` and ``interp
discover``: the shards run on the executor (:mod:`interp.tasks.shard_jobs`), then the partials go
through the same merge as ``interp merge`` and the writer each command hands in (``write``);
the discover circuit is evaluated here as a whole run does. The kept partials are removed once
the files are in place."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from interp.cli.executor_options import WORK_DIR, command_key, finished, sharding_of

__all__ = ["run_patch", "run_attribute", "run_discover"]


def _shards(kind: str, function, args, out: Path, model, task, say, **settings) -> list[dict]:
    from interp.foundation.executors.runner import ShardError
    from interp.interventions.shards import task_fingerprint
    from interp.tasks.shard_jobs import run_task_shards, task_shard

    source = str(Path(args.model).resolve()) if Path(args.model).exists() else str(args.model)
    job = task_shard(kind, function, model, task, source=source, settings=settings)
    sharding = sharding_of(args, out)
    say(f"{kind}: {args.shards} shards on {args.executor} (kept in {sharding.work_dir}) ...")
    key = {"task": task_fingerprint(task), **settings, "command": command_key(args)}
    created = not Path(out).exists()
    try:
        return run_task_shards(job, len(task), sharding, key)
    except ShardError as exc:  # one line; the finished shards stay for the re-run
        _tidy(out, created)
        raise RuntimeError(f"{exc}; run the same command again to redo only that shard") from None
    except BaseException:  # Ctrl-C, a missing sbatch...: keep finished shards, nothing else
        if _tidy(out, created):
            print(
                f"interp: the finished shards are kept in {Path(out) / WORK_DIR}; run the same "
                "command again to resume",
                file=sys.stderr,
            )
        raise


def _tidy(out: Path, created: bool) -> bool:
    """After a run that stopped: remove the kept-shards folder if no shard finished (and
    ``--out`` if this run made it and it is empty), so that a run that did nothing leaves
    nothing. Returns whether finished shards are kept."""
    work_dir = Path(out) / WORK_DIR
    if finished(work_dir):
        return True
    shutil.rmtree(work_dir, ignore_errors=True)
    if created and Path(out).is_dir() and not any(Path(out).iterdir()):
        Path(out).rmdir()
    return False


def _done(out: Path) -> None:
    """The merged files are in place: the kept partials have done their work."""
    shutil.rmtree(Path(out) / WORK_DIR, ignore_errors=True)


def _written(out: Path, write) -> int:
    """``write()`` the merged files, then remove the kept partials; a Ctrl-C once the files
    are in place (the command then ends with exit code 0) removes them too."""
    from interp.cli.output import committed

    try:
        code = write()
        _done(out)
    except KeyboardInterrupt:
        if committed():
            _done(out)
        raise
    return code


def run_patch(args, out: Path, model, task, batch, settings: dict, strings, write, say) -> int:
    """``interp patch --task --executor``: patching.csv, summary.json, report.html, written by
    ``write`` (``interp.cli.patch_files.write_results``, passed in: a command module is above
    this)."""
    from interp.interventions.shards import merge_partial_sums, task_partial_sums

    parts = _shards("patch", task_partial_sums, args, out, model, task, say, **settings)
    for part in parts:  # what a --shard run adds: the first row's tokens, where it came from
        first = batch.select([part["shard"]])
        part["tokens"] = strings(model, first.clean[0])
        part["corrupted_tokens"] = strings(model, first.corrupted[0])
        part["source"] = {"model": str(args.model), "task": str(args.task)}
    return _written(out, lambda: write(out, parts, merge_partial_sums(parts)))


def run_attribute(args, out: Path, model, task, write, say) -> int:
    """``interp attribute --task --executor``: the files of a whole task run."""
    from interp.attribution.shards import attribution_partial_sums, merge_attribution_sums

    shard = attribution_partial_sums
    parts = _shards("attribute", shard, args, out, model, task, say, per_row=args.per_row)
    for part in parts:
        part["source"] = {"model": str(args.model), "task": str(args.task)}
    return _written(out, lambda: write(out, parts, merge_attribution_sums(parts)))


def run_discover(args, out: Path, model, task, source: dict, ig_steps: int, write, say) -> int:
    """The whole run's files: merged scores, the circuit, and its evaluation here."""
    from interp.cli.discover_results import run_info
    from interp.discovery import evaluate_circuit
    from interp.discovery.circuit import circuit_from_scores
    from interp.discovery.shards import discovery_partial_sums, merge_discovery_sums
    from interp.interventions.shards import task_fingerprint

    settings = {"method": args.method, "metric": args.metric, "ig_steps": ig_steps}
    shard = discovery_partial_sums
    budget = {"max_bytes": args.max_bytes}  # first in the partials' key, as it always was
    parts = _shards("discover", shard, args, out, model, task, say, **budget, **settings)
    frame = merge_discovery_sums(parts)
    params = {"metric": args.metric, **({"ig_steps": ig_steps} if args.method == "eap-ig" else {})}
    circuit = circuit_from_scores(
        frame, args.method, top_n=args.top_n, threshold=args.threshold, params=params
    )
    say(f"evaluating the circuit of {len(circuit)} edges ({args.ablation} ablation) ...")
    budget = {"metric": args.metric, "max_bytes": args.max_bytes, "progress": True}
    result = evaluate_circuit(model, task, circuit, ablation=args.ablation, **budget)
    info = run_info(source, len(task), task_fingerprint(task), len(parts))
    scores = circuit.scores
    return _written(
        out, lambda: write(out, info, circuit.method, circuit.params, scores, result, args.ablation)
    )
