"""``interp patch``: which activations carry the difference between a clean and a corrupted
prompt, by activation patching (exact, attribution, or both), for one prompt pair
(``--clean/--corrupted/--answer``) or every row of a task file (``--task``).

A task file is read (its structure checked, row by row) before the model loads, and checked
against the model's tokenizer right after, before any forward pass: a refusal exits 2 and
writes nothing. ``--shard I/N`` patches rows ``I, I+N, ...`` (0-based) and writes their partial
sums to ``partial.json``; ``interp merge`` combines the shards into the files of the whole run.
The whole run goes through the same sums (one shard of one), so both write the same tables
(:mod:`interp.interventions.shards`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from interp.cli.executor_options import add_executor_arguments, check_executor
from interp.cli.options import (
    TASK_METRICS,
    add_model_option,
    add_out_dir,
    check_wrong,
    device,
    read_task,
    shard,
)
from interp.cli.output import UsageError, check_out_dir, check_shard, write_partial
from interp.cli.patch_files import SHARD_FILES, write_files, write_results
from interp.cli.sources import load_model

HELP = (
    "activation patching between a clean and a corrupted prompt, or over every row of a task "
    "file (--task); write patching.csv, summary.json and report.html"
)
DEFAULT_SITES = "resid_pre,attn_out,mlp_out,heads"
NO_WRONG = (
    "Without --wrong the metric is the answer's probability alone, which a patch can move "
    "for reasons unrelated to the task (any token's logit shifts the softmax); recovered may "
    "then fall far outside 0 to 1. Pass --wrong with the competing token for a logit difference."
)
PAIR_OPTIONS = ("--clean", "--corrupted", "--answer", "--wrong")  # not with --task
TASK_OPTIONS = ("--metric", "--shard", "--positions", "--executor")  # only with --task
# interp.interventions.patching's GRIDS (names), METHODS and DIRECTIONS, copied so that help
# and a refused command line need no torch; a test keeps them in step
GRIDS = tuple(
    "resid_pre resid_mid resid_post attn_out mlp_out heads heads_pos q k v pattern q_pos k_pos "
    "v_pos pattern_pos".split()
)
METHODS = ("exact", "attribution", "both")
DIRECTIONS = ("denoising", "noising")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_option(parser)
    parser.add_argument("--clean", help="the prompt the model gets right")
    parser.add_argument(
        "--corrupted", help="a prompt of the same token length that changes the answer"
    )
    parser.add_argument(
        "--answer", help="the clean run's next token after the last position (one token)"
    )
    parser.add_argument(
        "--wrong",
        default=None,
        help="a counterfactual single token: the metric is the logit difference "
        "answer - wrong (without it, the answer's probability)",
    )
    parser.add_argument(
        "--sites",
        default=DEFAULT_SITES,
        help=f"comma-separated grids among {', '.join(GRIDS)} (default {DEFAULT_SITES})",
    )
    parser.add_argument(
        "--method",
        choices=METHODS,
        default="exact",
        help="exact patching, the attribution (gradient) estimate, or both",
    )
    parser.add_argument(
        "--direction",
        choices=DIRECTIONS,
        default="denoising",
        help="denoising: clean into corrupted (default); noising: corrupted into clean",
    )
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
        "--positions",
        choices=("named",),
        default=None,
        help="with --task: per-position sites by the rows' position labels (IO, S2, ...), "
        "for rows of different lengths that carry 'positions' (interp task writes them)",
    )
    parser.add_argument(
        "--shard",
        type=shard,
        default=None,
        metavar="I/N",
        help="with --task: patch rows I, I+N, ... (0-based, 0 <= I < N) and write "
        "partial.json; combine the shards with interp merge",
    )
    add_out_dir(parser)
    parser.add_argument("--device", type=device, default="cpu", help="torch device (default cpu)")
    add_executor_arguments(parser)


def _parse_sites(text: str) -> list[str]:
    sites = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in sites if s not in GRIDS]
    if not sites or unknown:
        raise UsageError(
            f"--sites {text!r}: unknown {unknown or 'empty'}; choose from {', '.join(GRIDS)}"
        )
    return list(dict.fromkeys(sites))


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    out = check_out_dir(args.out)
    sites = _parse_sites(args.sites)
    if args.task is not None:
        return _run_task(args, out, sites)
    for option in TASK_OPTIONS:
        if getattr(args, option[2:]) is not None:
            raise UsageError(f"{option} is for --task; leave it out with --clean/--corrupted")
    missing = [o for o in PAIR_OPTIONS[:3] if getattr(args, o[2:]) is None]
    if missing:
        raise UsageError(
            f"pass {', '.join(missing)} (a prompt pair and its answer), or --task FILE.jsonl"
        )
    for option in PAIR_OPTIONS[:3]:
        if not getattr(args, option[2:]):
            raise UsageError(f"{option} is empty; pass some text")
    check_wrong(args)
    return _run_pair(args, out, sites)


def _run_pair(args: argparse.Namespace, out: Path, sites: list[str]) -> int:
    """Load, resolve the answer tokens and the pair (refused before any work), patch, write."""
    _say(f"loading {args.model} ...")
    model = load_model(args.model, device=args.device)
    # imported only now, so that a refused command line starts fast (docs/commands.md)
    from interp.attribution import TokenError, resolve_token
    from interp.engine import PromptError, pair_tokens, token_strings
    from interp.interventions import COLUMNS, logit_diff, patch_activations, probability

    try:  # refused before any work: a multi-token answer, prompts of unequal lengths
        answer = resolve_token(model, args.answer)
        wrong = (
            None if args.wrong is None else resolve_token(model, args.wrong, role="wrong answer")
        )
        clean, corrupted = pair_tokens(model, args.clean, args.corrupted)
    except (TokenError, PromptError) as exc:
        raise UsageError(str(exc)) from None
    metric = logit_diff(answer, wrong) if wrong is not None else probability(answer)
    _say(f"patching {', '.join(sites)} ({args.method}, {args.direction}) ...")
    frame = patch_activations(
        model,
        args.clean,
        args.corrupted,
        metric,
        sites=sites,
        direction=args.direction,
        method=args.method,
        progress=True,
    )
    tokens = token_strings(model, clean[0])
    attrs = frame.attrs
    if wrong is None:  # the probability of one token: moved by anything, not only the task
        attrs["sanity"] = [*attrs["sanity"], NO_WRONG]
    summary = {
        "clean_metric": attrs["clean_metric"],
        "corrupted_metric": attrs["corrupted_metric"],
        "metric": attrs["metric_name"],
        "recovered_undefined": attrs["recovered_undefined"],
        "model": str(args.model),
        "clean": args.clean,
        "corrupted": args.corrupted,
        "answer": args.answer,
        "wrong": args.wrong,
        "sites": sites,
        "method": args.method,
        "direction": args.direction,
        "n_tokens": attrs["n_tokens"],
        "tokens": tokens,
        "corrupted_tokens": token_strings(model, corrupted[0]),
        "sanity": attrs["sanity"],
        "rows": len(frame),
    }
    text = (
        f"Clean prompt: {args.clean!r}. Corrupted prompt: {args.corrupted!r} "
        f"({len(tokens)} tokens each). Answer {args.answer!r}"
        + (f", wrong answer {args.wrong!r}." if args.wrong is not None else ".")
    )
    title = f"Activation patching: {args.model}"
    return write_files(out, frame, COLUMNS, summary, title, text)


def _run_task(args: argparse.Namespace, out: Path, sites: list[str]) -> int:
    """Check the file, load, check it against the tokenizer, patch (whole, or one shard into
    partial.json), write."""
    given = [o for o in PAIR_OPTIONS if getattr(args, o[2:]) is not None]
    if given:
        raise UsageError(
            f"--task carries each row's prompts and answers; leave out {', '.join(given)}"
        )
    task = read_task(args.task)  # before loading: a malformed file is refused at once
    index, count = check_shard(args.shard, len(task), str(args.task))
    check_executor(args, len(task))
    _say(f"loading {args.model} ...")
    model = load_model(args.model, device=args.device)
    from interp.engine import token_strings
    from interp.interventions.shards import merge_partial_sums, task_partial_sums
    from interp.tasks import TaskError

    try:  # every row against the tokenizer, before any forward pass
        batch = task.tokens(model)
    except TaskError as exc:
        raise UsageError(f"--task: {exc}") from None
    if args.executor is not None:
        from interp.cli.executor_run import run_patch

        settings = {"metric": args.metric or "logit_diff", "sites": sites}
        settings |= {"direction": args.direction, "method": args.method}
        settings |= {"positions": args.positions} if args.positions else {}
        return run_patch(
            args, out, model, task, batch, settings, token_strings, write_results, _say
        )
    rows = len(range(index, len(task), count))
    _say(f"patching {', '.join(sites)} over {rows} of {len(task)} rows ({args.method}) ...")
    try:
        partial = task_partial_sums(
            model,
            task,
            shard=(index, count),
            metric=args.metric or "logit_diff",
            sites=sites,
            direction=args.direction,
            method=args.method,
            positions=args.positions,
            progress=True,
        )
    except ValueError as exc:  # per-position sites over rows of different lengths
        raise UsageError(
            str(exc).replace('pass positions="named"', "pass --positions named")
        ) from None
    first = batch.select([index])
    partial["tokens"] = token_strings(model, first.clean[0])
    partial["corrupted_tokens"] = token_strings(model, first.corrupted[0])
    partial["source"] = {"model": str(args.model), "task": str(args.task)}
    if args.shard is not None:
        return write_partial(out, partial, (index, count), SHARD_FILES)
    return write_results(out, [partial], merge_partial_sums([partial]))
