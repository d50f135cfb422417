"""``interp discover``: find the circuit of a task (edges between heads, MLPs, embeddings and
logits) and measure how much of the task it carries.

    interp discover --task induction --method eap-ig --top-n 20 --out circuit/

Scored methods (``exact``, ``eap``, ``eap-ig``) take ``--top-n N`` or ``--threshold T``; ``acdc``
takes ``--threshold`` only. The task file is read (its structure checked row by row) before the
model loads and checked against the tokenizer right after, before any forward pass; every
option is checked before loading; a refusal exits 2 and writes nothing. ``--shard I/N``
(scored methods) scores rows ``I, I+N, ...`` into ``partial.json``; ``interp merge`` combines
the shards (:mod:`interp.discovery.shards`) without the model, so the merged folder has the
scores and the circuit but no faithfulness unless ``interp merge --evaluate`` loads the model
(:mod:`interp.cli.discover_results`; docs/discovery.md, "From the command line").
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from interp.cli.discover_results import GENERATED, generated_task
from interp.cli.executor_options import add_executor_arguments, check_executor
from interp.cli.options import (
    MAX_SEED,
    TASK_METRICS,
    add_model_option,
    add_out_dir,
    device,
    int_between,
    memory_size,
    read_task,
    shard,
)
from interp.cli.output import UsageError, check_out_dir, check_shard, write_partial
from interp.cli.sources import load_model

HELP = (
    "find a task's circuit (exact edge patching, EAP, EAP-IG or ACDC) and its faithfulness; "
    "write edges.csv, circuit.json, curve.csv, summary.json and report.html"
)
METHODS = ("exact", "eap", "eap-ig", "acdc")  # interp.discovery.METHODS, torch-free (tested)
SCORED = METHODS[:3]
ABLATIONS = ("patch", "mean", "zero")  # interp.discovery.ABLATIONS, torch-free (tested)
FILES = ["edges.csv", "circuit.json", "curve.csv", "summary.json", "report.html", "partial.json"]
MAX_ROWS = 100_000  # as interp task
EXAMPLES = 5  # task rows shown in the report


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_option(parser)
    parser.add_argument(
        "--task",
        required=True,
        metavar="FILE.jsonl|induction|ioi|greater-than",
        help="a task file (JSONL or CSV, docs/tasks.md), or induction, ioi or greater-than to "
        "generate one for the model (--n rows, default 16; --seed, default 0)",
    )
    parser.add_argument("--method", choices=METHODS, required=True, help="how edges are found")
    parser.add_argument(
        "--top-n", type=int_between(1), default=None, help="scored methods: keep the N largest"
    )
    parser.add_argument(
        "--threshold",
        type=_threshold,
        default=None,
        help="keep edges with |score| >= T (acdc: prune edges whose removal moves the metric "
        "by at most T of clean - corrupted)",
    )
    parser.add_argument(
        "--ablation",
        choices=ABLATIONS,
        default="patch",
        help="what an edge outside the circuit gets when it is evaluated (default patch: the "
        "corrupted run's value)",
    )
    parser.add_argument("--metric", choices=TASK_METRICS, default="logit_diff", help="row metric")
    parser.add_argument(
        "--ig-steps", type=int_between(1, 1000), default=None, help="eap-ig: steps (default 5)"
    )
    parser.add_argument(
        "--n", type=int_between(1, MAX_ROWS), default=None, help="generated task: rows (16)"
    )
    parser.add_argument(
        "--seed", type=int_between(0, MAX_SEED), default=None, help="generated task: seed (0)"
    )
    parser.add_argument(
        "--shard",
        type=shard,
        default=None,
        metavar="I/N",
        help="scored methods: score rows I, I+N, ... and write partial.json; combine the "
        "shards with interp merge",
    )
    parser.add_argument(
        "--max-bytes",
        type=memory_size,
        default=None,
        help="memory budget per forward pass, e.g. 500MB (same results)",
    )
    add_out_dir(parser)
    parser.add_argument("--device", type=device, default="cpu", help="torch device (default cpu)")
    add_executor_arguments(parser)


def _check(args: argparse.Namespace) -> None:
    """Every refusal that needs no model, in one line each."""
    if args.method == "acdc":
        if args.top_n is not None or args.threshold is None:
            raise UsageError(
                "--method acdc prunes edges: pass --threshold T (and no --top-n), e.g. 0.01"
            )
        if args.shard is not None:
            raise UsageError(
                "--method acdc has no shards (each decision depends on the ones before it, "
                "over every row); leave out --shard, or shard exact, eap or eap-ig"
            )
    elif (args.top_n is None) == (args.threshold is None):
        raise UsageError(f"--method {args.method}: pass exactly one of --top-n N or --threshold T")
    if args.ig_steps is not None and args.method != "eap-ig":
        raise UsageError(f"--ig-steps is for --method eap-ig, not {args.method}; leave it out")
    if args.task not in GENERATED:
        given = [o for o in ("--n", "--seed") if getattr(args, o[2:]) is not None]
        if given:
            raise UsageError(
                f"{', '.join(given)} are for a generated task (--task induction, ioi or "
                "greater-than); a task "
                "file has its own rows"
            )


def _examples(model, task) -> list[dict]:
    """The first rows as text: prompts decoded whole, answers token by token (a list of
    answers, greater-than's, as ``" 32 |  64"``)."""

    def decode(ids: list[int]) -> str:
        return model.tokenizer.decode(ids) if model.tokenizer is not None else str(ids)

    def prompt(value) -> str:
        return value if isinstance(value, str) else decode(list(value))

    def answer(value) -> str:
        tokens = value if isinstance(value, tuple | list) else [value]
        return " | ".join(t if isinstance(t, str) else decode([int(t)]) for t in tokens)

    return [
        {
            "clean": prompt(row.clean),
            "corrupted": prompt(row.corrupted),
            "answer": answer(row.answer),
            "wrong": "" if row.wrong is None else answer(row.wrong),
        }
        for row in task.rows[:EXAMPLES]
    ]


def run(args: argparse.Namespace) -> int:
    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    out = check_out_dir(args.out)
    _check(args)
    task = None if args.task in GENERATED else read_task(Path(args.task))  # before loading
    n_rows = len(task) if task is not None else (args.n or 16)
    index, count = check_shard(args.shard, n_rows, "the task")
    check_executor(args, n_rows, scored=args.method != "acdc")
    say(f"loading {args.model} ...")
    model = load_model(args.model, device=args.device)
    from interp.cli.options import check_at_most
    from interp.discovery import EdgeGraph
    from interp.tasks import TaskError

    try:
        graph = EdgeGraph.from_model(model)
    except ValueError as exc:  # a model the graph refuses: before any work
        raise UsageError(str(exc)) from None
    check_at_most("--top-n", args.top_n, len(graph), f"the graph has {len(graph)} edges")
    if task is None:
        task = generated_task(args.task, model, n_rows, args.seed or 0)
    try:  # every row against the tokenizer and the context, before any forward pass
        task.tokens(model)
    except TaskError as exc:
        raise UsageError(f"--task: {exc}") from None
    source = {
        "model": str(args.model),
        "task": str(args.task),
        "generated": None if args.task not in GENERATED else {"n": n_rows, "seed": args.seed or 0},
        "examples": _examples(model, task),
    }
    settings = {"top_n": args.top_n, "threshold": args.threshold, "ablation": args.ablation}
    ig_steps = args.ig_steps or 5
    if args.executor is not None:
        from interp.cli.discover_results import write_results
        from interp.cli.executor_run import run_discover

        return run_discover(args, out, model, task, source, ig_steps, write_results, say)
    if args.shard is not None:
        return _write_shard(args, out, model, task, source, settings, ig_steps, say)
    from interp.cli.discover_results import run_info, write_results
    from interp.discovery import discover_circuit, evaluate_circuit
    from interp.interventions.shards import task_fingerprint

    say(f"{args.method} over {len(task)} rows, {len(graph)} edges ...")
    cut = {"top_n": args.top_n} if args.top_n is not None else {"threshold": args.threshold}
    budget = {"metric": args.metric, "max_bytes": args.max_bytes, "progress": True}
    circuit = discover_circuit(model, task, args.method, ig_steps=ig_steps, **cut, **budget)
    say(f"evaluating the circuit of {len(circuit)} edges ({args.ablation} ablation) ...")
    result = evaluate_circuit(model, task, circuit, ablation=args.ablation, **budget)
    frame = circuit.scores
    info = run_info(source, len(task), task_fingerprint(task), 1)
    return write_results(out, info, circuit.method, circuit.params, frame, result, args.ablation)


def _write_shard(args, out, model, task, source, settings, ig_steps, say) -> int:
    from interp.discovery.shards import discovery_partial_sums

    index, count = args.shard
    rows = len(range(index, len(task), count))
    say(f"{args.method} over {rows} of {len(task)} rows (shard {index}/{count}) ...")
    partial = discovery_partial_sums(
        model, task, args.method, shard=(index, count), metric=args.metric,
        ig_steps=ig_steps, max_bytes=args.max_bytes, progress=True,
    )  # fmt: skip
    partial["source"] = source
    partial["circuit"] = settings  # how merge picks the circuit (checked equal across shards)
    return write_partial(out, partial, (index, count), FILES)
