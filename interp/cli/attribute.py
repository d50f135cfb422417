"""``interp attribute``: which components pushed the model toward an answer, and by how much.

Two forms, one command. ``--prompt/--answer`` (``--wrong``, ``--pos``) attributes one prompt and
writes ``attribution.csv`` (``component, layer, head, contribution``) and ``report.html`` (with
the logit lens). ``--task FILE`` attributes every row at its own last token to its own answer
(minus its own wrong token) and writes the mean over rows (``contribution``) with its standard
error (``contribution_sem``), ``summary.json`` and ``report.html``, and with ``--per-row``
``attribution_rows.csv``. The task file is read (its structure checked row by row) before the
model loads and checked against the tokenizer right after, before any forward pass: a refusal
exits 2 and writes nothing. ``--shard I/N`` attributes rows ``I, I+N, ...`` and writes their
partial sums to ``partial.json``; ``interp merge`` combines the shards. A whole run is one shard
of one and goes through the same sums (:mod:`interp.attribution.shards`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from interp.cli.executor_options import add_executor_arguments, check_executor
from interp.cli.options import (
    add_model_option,
    add_out_dir,
    check_at_most,
    check_wrong,
    device,
    int_between,
    shard,
)
from interp.cli.output import (
    UsageError,
    check_out_dir,
    check_shard,
    staged_output,
    terminal_table,
    write_partial,
)
from interp.cli.sources import load_model

__all__ = [
    "PAIR_OPTIONS",
    "run",
    "run_prompt",
    "run_task",
    "write_results",
    "is_attribution_partial",
]

HELP = (
    "direct logit attribution of an answer (or answer - wrong) and the logit lens, or its "
    "mean over a task file (--task); write attribution.csv and report.html"
)
CSV_COLUMNS = ["component", "layer", "head", "contribution"]
TASK_COLUMNS = [*CSV_COLUMNS, "contribution_sem"]
ROW_COLUMNS = ["row", *CSV_COLUMNS]
# every file it owns: a prompt run writes the first and the report, a task run the first three
# (and attribution_rows.csv with --per-row), a shard partial.json
FILES = ["attribution.csv", "summary.json", "report.html", "attribution_rows.csv", "partial.json"]
PAIR_OPTIONS = ("--prompt", "--answer", "--wrong", "--pos", "--top-k")  # not with --task
TERMINAL_N = 10  # contributors listed on the terminal
MAX_TOP_K = 100  # logit-lens tokens per row: more is unreadable and only costs time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_option(parser)
    parser.add_argument("--prompt", default=None, help="the text the model reads")
    parser.add_argument(
        "--answer",
        default=None,
        help="the next token to explain; must be a single token, e.g. ' Paris'",
    )
    parser.add_argument(
        "--task",
        type=Path,
        default=None,
        metavar="FILE.jsonl",
        help="a task file (JSONL or CSV, docs/tasks.md) instead of --prompt/--answer/--wrong: "
        "every row attributed to its own answer (minus wrong), means with standard errors",
    )
    parser.add_argument(
        "--shard",
        type=shard,
        default=None,
        metavar="I/N",
        help="with --task: attribute rows I, I+N, ... (0-based) and write partial.json; "
        "combine the shards with interp merge",
    )
    parser.add_argument(
        "--per-row",
        action="store_true",
        help="with --task: also write attribution_rows.csv, each row's own contributions",
    )
    add_executor_arguments(parser)
    parser.add_argument(
        "--wrong",
        default=None,
        help="a counterfactual single token: explain the logit difference "
        "answer - wrong instead of the answer's logit",
    )
    add_out_dir(parser)
    parser.add_argument(
        "--pos",
        type=int_between(),
        default=None,
        help="position whose prediction is explained (default -1, the last; "
        "negative counts from the end)",
    )
    parser.add_argument(
        "--top-k",
        type=int_between(1, MAX_TOP_K),
        default=None,
        help=f"top tokens per logit-lens row, 1 to {MAX_TOP_K} (default 5)",
    )
    parser.add_argument("--device", type=device, default="cpu", help="torch device (default cpu)")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _done(headline: str, frame, written) -> int:
    """The terminal's part of a finished run: what is explained, the top contributors (not
    ``total``) and every file written; exit code 0."""
    from interp.attribution import top_contributors

    print(headline)
    print(terminal_table(top_contributors(frame, TERMINAL_N), decimals=4))
    for path in written:
        print(f"wrote {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    """``interp attribute``: ``--out`` checked first, then the ``--task`` or the prompt form."""
    out = check_out_dir(args.out)
    return run_task(args, out) if args.task is not None else run_prompt(args, out)


def _check_prompt_options(args: argparse.Namespace) -> None:
    """The ``--prompt/--answer`` form's options, checked before loading; fills the defaults."""
    for option, value in (
        ("--shard", args.shard),
        ("--per-row", args.per_row or None),
        ("--executor", args.executor),
    ):
        if value is not None:
            raise UsageError(
                f"{option} is for --task; pass --task FILE.jsonl, or leave {option} out"
            )
    if args.prompt is None or args.answer is None:
        raise UsageError(
            "pass --prompt and --answer (the text and the token to explain), or --task FILE.jsonl"
        )
    args.pos = -1 if args.pos is None else args.pos
    args.top_k = 5 if args.top_k is None else args.top_k
    if not args.prompt:
        raise UsageError("--prompt is empty; pass the text the model reads")
    if not args.answer:
        raise UsageError("--answer is empty; pass one token, e.g. ' Paris'")
    check_wrong(args)


def run_prompt(args: argparse.Namespace, out: Path) -> int:
    """Check the options, load, check the prompt and tokens against the model, attribute and
    read the logit lens, write attribution.csv and report.html."""
    _check_prompt_options(args)
    _say(f"loading {args.model} ...")
    model = load_model(args.model, device=args.device)
    # imported only now, so that a refused command line starts fast (docs/commands.md)
    from interp.attribution import TokenError, logit_attribution, logit_lens, resolve_token

    check_at_most(
        "--top-k",
        args.top_k,
        int(model.cfg.d_vocab),
        f"the vocabulary has {model.cfg.d_vocab} tokens",
    )
    n_tokens = int(model.to_tokens(args.prompt, truncate=False).shape[-1])
    check_at_most(  # checked before any work: exit 2, as interp patch and interp attention
        "the prompt's length in tokens",
        n_tokens,
        int(model.cfg.n_ctx),
        "the model's context; pass a shorter --prompt",
    )
    if not -n_tokens <= args.pos < n_tokens:
        raise UsageError(
            f"--pos {args.pos} is outside the prompt's {n_tokens} tokens; pass "
            f"{-n_tokens} to {n_tokens - 1} (-1 is the last)"
        )
    try:  # a multi-token answer is refused before any work
        resolve_token(model, args.answer)
        if args.wrong is not None:
            resolve_token(model, args.wrong, role="wrong answer")
    except TokenError as exc:
        raise UsageError(str(exc)) from None
    _say("folding LayerNorm into a copy of the model and attributing ...")
    # folds a copy, and checks that the rows add up to the ORIGINAL model's logit
    attribution = logit_attribution(model, args.prompt, args.answer, wrong=args.wrong, pos=args.pos)
    lens = logit_lens(model, args.prompt, args.answer, wrong=args.wrong, pos=args.pos, k=args.top_k)
    csv = attribution[CSV_COLUMNS].to_csv(index=False)
    from interp.pages import attribution as pages  # looked up at call time (tests replace it)

    html = pages.prompt_report(str(args.model), args.prompt, attribution, lens).to_html()
    with staged_output(out, owns=FILES) as stage:
        stage.write_text("attribution.csv", csv)
        stage.write_text("report.html", html)
    total = attribution[attribution["component"] == "total"]["contribution"].item()
    what = "logit difference" if args.wrong is not None else "logit"
    headline = (
        f"{what}: {total:.6g} (rows add up to the model's {what} within "
        f"{attribution.attrs['identity_error']:.2g})"
    )
    return _done(headline, attribution, stage.written)


def is_attribution_partial(part: dict) -> bool:
    """Whether a ``partial.json`` is a shard of ``interp attribute --task`` (torch-free)."""
    return str(part.get("format", "")).startswith("interp-attribute-partial/")


def _refuse_lists(task) -> None:
    """Answers given as lists of tokens cannot be one logit: refused before loading."""
    for number, row in enumerate(task.rows, start=1):
        for role, value in (("answer", row.answer), ("wrong", row.wrong)):
            if isinstance(value, tuple):
                raise UsageError(
                    f"--task: row {number}: '{role}' is a list of {len(value)} tokens; logit "
                    "attribution explains one logit (difference): give one token per row"
                )


def run_task(args: argparse.Namespace, out: Path) -> int:
    """Check the file, load, check it against the tokenizer, attribute (whole, or one shard
    into partial.json), write."""
    from interp.cli.options import read_task

    given = [o for o in PAIR_OPTIONS if getattr(args, o[2:].replace("-", "_")) is not None]
    if given:
        raise UsageError(
            f"--task carries each row's prompt and answers, read at its last token; leave out "
            f"{', '.join(given)}"
        )
    task = read_task(args.task)  # before loading: a malformed file is refused at once
    _refuse_lists(task)
    index, count = check_shard(args.shard, len(task), str(args.task))
    check_executor(args, len(task))
    _say(f"loading {args.model} ...")
    model = load_model(args.model, device=args.device)
    from interp.attribution.shards import attribution_partial_sums, merge_attribution_sums
    from interp.tasks import TaskError

    try:  # every row against the tokenizer and the context, before any forward pass
        task.tokens(model)
    except TaskError as exc:
        raise UsageError(f"--task: {exc}") from None
    if args.executor is not None:
        from interp.cli.executor_run import run_attribute

        return run_attribute(args, out, model, task, write_results, _say)
    rows = len(range(index, len(task), count))
    _say(f"folding LayerNorm into a copy of the model and attributing {rows} of {len(task)} rows")
    partial = attribution_partial_sums(model, task, shard=(index, count), per_row=args.per_row)
    partial["source"] = {"model": str(args.model), "task": str(args.task)}
    if args.shard is not None:
        return write_partial(out, partial, (index, count), FILES)
    return write_results(out, [partial], merge_attribution_sums([partial]))


def _target(parts: list[dict]) -> str:
    return "logit difference answer - wrong" if parts[0]["settings"]["wrong"] else "answer's logit"


def summary_of(parts: list[dict], frame) -> dict:
    """summary.json: the task, what is explained, its mean, and each row's identity."""
    first = next(p for p in parts if p["shard"] == 0)
    attrs = frame.attrs
    total = frame[frame["component"] == "total"].iloc[0]
    return {
        "model": first["source"]["model"],
        "task": {
            "source": first["source"]["task"],
            "n_rows": attrs["n_rows"],
            "fingerprint": first["settings"]["task"],
            "shards": attrs["shards"],
        },
        "explained": _target(parts),
        "mean_total": float(total["contribution"]),
        "mean_total_sem": _number(total["contribution_sem"]),
        "identity_error": attrs["identity_error"],
        "reference_is": attrs["reference_is"],
        "reference_rows": attrs["reference_rows"],
        "identity_rows": attrs["identity_rows"],
        "rows": len(frame),
    }


def _number(value) -> float | None:
    return None if value is None or not math.isfinite(float(value)) else float(value)


def write_results(out: Path, parts: list[dict], frame) -> int:
    """attribution.csv, summary.json and report.html of a task run (whole or merged), and
    attribution_rows.csv when the shards kept each row (``--per-row``)."""
    from interp.attribution.shards import merge_attribution_rows
    from interp.pages import attribution as pages

    summary = summary_of(parts, frame)
    html = pages.task_report(summary, frame).to_html()
    rows = None
    if parts[0]["settings"].get("per_row"):  # row: 0-based, as task[row] and per_row=True
        rows = merge_attribution_rows(parts)[ROW_COLUMNS].to_csv(index=False)
    with staged_output(out, owns=FILES) as stage:
        stage.write_text("attribution.csv", frame[TASK_COLUMNS].to_csv(index=False))
        stage.write_text("summary.json", json.dumps(summary, indent=2) + "\n")
        stage.write_text("report.html", html)
        if rows is not None:
            stage.write_text("attribution_rows.csv", rows)
    sem = summary["mean_total_sem"]
    headline = (
        f"mean {summary['explained']} over {summary['task']['n_rows']} rows: "
        f"{summary['mean_total']:.6g}" + (f" ± {sem:.2g}" if sem is not None else "") + " "
        f"(in every row the components add up to its value within "
        f"{summary['identity_error']:.2g})"
    )
    return _done(headline, frame, stage.written)
