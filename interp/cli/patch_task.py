"""``interp patch --task FILE``: patching over every row of a task file, whole or in shards.

The file is read (its structure checked, row by row) before the model loads, and checked
against the model's tokenizer right after, before any forward pass: a refusal exits 2 and
writes nothing. ``--shard I/N`` patches rows ``I, I+N, ...`` (0-based) and writes their
partial sums to ``partial.json``; ``interp merge`` combines the shards into the files of the
whole run. The whole run goes through the same sums (one shard of one), so both write the same
tables (:mod:`interp.interventions.shards`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from interp.cli.executor_options import add_executor_arguments, check_executor
from interp.cli.output import (
    UsageError,
    check_shard,
    staged_output,
    terminal_table,
    write_partial,
)
from interp.cli.sources import load_model

__all__ = [
    "PAIR_OPTIONS",
    "add_task_arguments",
    "run_task",
    "write_results",
    "print_results",
    "read_task",
]

PAIR_OPTIONS = ("--clean", "--corrupted", "--answer", "--wrong")  # not with --task
TASK_METRICS = ("logit_diff", "prob_diff")  # interp.interventions.task_patching's, torch-free
FILES = ["patching.csv", "summary.json", "report.html"]
SHARD_FILES = ["partial.json"]
TOP_N = 10  # cells listed on the terminal


def shard(text: str) -> tuple[int, int]:
    """An argparse type: ``I/N`` with ``0 <= I < N``."""
    index, slash, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i, n = -1, 0
    if not slash or n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(
            f"expected I/N with 0 <= I < N (shard I of N, e.g. 0/4), got {text!r}"
        )
    return i, n


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    """``--task``, ``--metric`` and ``--shard`` of ``interp patch``."""
    parser.add_argument(
        "--task",
        type=Path,
        default=None,
        metavar="FILE.jsonl",
        help="a task file (JSONL or CSV, docs/tasks.md) instead of --clean/--corrupted/--answer: "
        "every row patched, means with standard errors",
    )
    parser.add_argument(
        "--metric",
        choices=TASK_METRICS,
        default=None,
        help="with --task: each row's logit_diff (default) or prob_diff",
    )
    parser.add_argument(
        "--shard",
        type=shard,
        default=None,
        metavar="I/N",
        help="with --task: patch rows I, I+N, ... (0-based) and write partial.json; "
        "combine the shards with interp merge",
    )
    add_executor_arguments(parser)


def read_task(path: Path):
    """The task file, its structure checked row by row (no model needed): UsageError if not."""
    from interp.tasks import Task, TaskError

    try:
        return Task.from_csv(path) if path.suffix.lower() == ".csv" else Task.from_jsonl(path)
    except TaskError as exc:
        raise UsageError(f"--task: {exc}") from None


def run_task(args: argparse.Namespace, out: Path, sites: list[str], say) -> int:
    """``interp patch --task``: check the file, load, check it against the tokenizer, patch
    (whole, or one shard into partial.json), write."""
    given = [o for o in PAIR_OPTIONS if getattr(args, o[2:]) is not None]
    if given:
        raise UsageError(
            f"--task carries each row's prompts and answers; leave out {', '.join(given)}"
        )
    task = read_task(args.task)  # before loading: a malformed file is refused at once
    index, count = check_shard(args.shard, len(task), str(args.task))
    check_executor(args, len(task))
    say(f"loading {args.model} ...")
    model = load_model(args.model, device=args.device)
    from interp.interventions.shards import merge_partial_sums, task_partial_sums
    from interp.tasks import TaskError

    try:  # every row against the tokenizer, before any forward pass
        batch = task.tokens(model)
    except TaskError as exc:
        raise UsageError(f"--task: {exc}") from None
    metric = args.metric or "logit_diff"
    if args.executor is not None:
        from interp.cli.executor_run import run_patch

        settings = {"metric": metric, "sites": sites, "direction": args.direction}
        return run_patch(args, out, model, task, batch, {**settings, "method": args.method},
                         _strings, write_results, say)  # fmt: skip
    rows = len(range(index, len(task), count))
    say(f"patching {', '.join(sites)} over {rows} of {len(task)} rows ({args.method}) ...")
    try:
        partial = task_partial_sums(
            model,
            task,
            shard=(index, count),
            metric=metric,
            sites=sites,
            direction=args.direction,
            method=args.method,
            progress=True,
        )
    except ValueError as exc:  # per-position sites over rows of different lengths
        raise UsageError(str(exc)) from None
    first = batch.select([index])
    partial["tokens"] = _strings(model, first.clean[0])
    partial["corrupted_tokens"] = _strings(model, first.corrupted[0])
    partial["source"] = {"model": str(args.model), "task": str(args.task)}
    if args.shard is not None:
        return write_partial(out, partial, (index, count), SHARD_FILES)
    return write_results(out, [partial], merge_partial_sums([partial]))


def _strings(model, ids) -> list[str]:
    return [model.tokenizer.decode([t]) for t in ids.tolist()]


def task_summary(parts: list[dict], frame) -> dict:
    """summary.json of a task run: the task (n_rows, source) and the first row's tokens."""
    first = next(p for p in parts if p["shard"] == 0)
    settings = first["settings"]
    attrs = frame.attrs
    return {
        "clean_metric": attrs["clean_metric"],
        "corrupted_metric": attrs["corrupted_metric"],
        "metric": attrs["metric_name"],
        "recovered_undefined": attrs["recovered_undefined"],
        "model": first["source"]["model"],
        "task": {
            "source": first["source"]["task"],
            "n_rows": settings["n_rows"],
            "fingerprint": settings["task"],
            "shards": settings["shards"],
        },
        "sites": settings["sites"],
        "method": settings["method"],
        "direction": settings["direction"],
        "n_tokens": attrs["n_tokens"],
        "tokens": first["tokens"],  # of the task's first row
        "corrupted_tokens": first["corrupted_tokens"],
        "sanity": attrs["sanity"],
        "rows": len(frame),
    }


def write_results(out: Path, parts: list[dict], frame) -> int:
    """patching.csv, summary.json and report.html of a task run (whole or merged)."""
    from interp.html import Report
    from interp.interventions.report import add_patching_section
    from interp.interventions.task_patching import TASK_COLUMNS

    summary = task_summary(parts, frame)
    report = Report(f"Activation patching over a task: {summary['model']}")
    report.add_text(
        f"Task {summary['task']['source']}: {summary['task']['n_rows']} rows"
        + (f" in {summary['task']['shards']} shards" if summary["task"]["shards"] > 1 else "")
        + f". Positions are labelled with the first row's tokens ({len(summary['tokens'])})."
    )
    add_patching_section(report, frame, tokens=summary["tokens"])
    with staged_output(out, owns=FILES) as stage:
        stage.write_text("patching.csv", frame[TASK_COLUMNS].to_csv(index=False))
        stage.write_text("summary.json", json.dumps(summary, indent=2) + "\n")
        stage.write_text("report.html", report.to_html())
    method = "exact" if summary["method"] in ("exact", "both") else "attribution"
    print_results(frame, summary["tokens"], method)
    for path in stage.written:
        print(f"wrote {path}")
    return 0


def print_results(frame, tokens: list[str], method: str) -> None:
    """The metrics, the sanity warnings (on stderr) and the top cells, ``pos`` with its token."""
    from interp.interventions.report import pos_label, top_cells

    attrs = frame.attrs
    over = f" (means over {attrs['n_rows']} rows)" if attrs.get("n_rows") else ""
    print(
        f"{attrs['metric_name']}{over}: clean {attrs['clean_metric']:.6g}, corrupted "
        f"{attrs['corrupted_metric']:.6g}"
    )
    for warning in attrs.get("sanity") or []:
        print(f"warning: {warning}", file=sys.stderr)
    if attrs["recovered_undefined"]:
        print("clean and corrupted metrics are equal: recovered is undefined (empty)")
    top = top_cells(frame, TOP_N, method=method).copy()
    top["pos"] = [pos_label(p, tokens) or None for p in top["pos"]]
    print(terminal_table(top, decimals=4))
