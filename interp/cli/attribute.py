"""``interp attribute``: which components pushed the model toward an answer, and by how much."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from interp.cli import attribute_task
from interp.cli.attribute_task import _display, _label
from interp.cli.executor_options import add_executor_arguments
from interp.cli.options import add_model_option, check_at_most, device, int_between
from interp.cli.output import UsageError, check_out_dir, staged_output, terminal_table
from interp.cli.patch_task import shard
from interp.cli.sources import load_model

HELP = (
    "direct logit attribution of an answer (or answer - wrong) and the logit lens, or its "
    "mean over a task file (--task); write attribution.csv and report.html"
)
CSV_COLUMNS = ["component", "layer", "head", "contribution"]
TOP_N = 15  # contributors listed in the report and on the terminal
FILES = attribute_task.FILES  # a pair run writes two of them and removes the others
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
    parser.add_argument("--out", type=Path, required=True, help="output directory")
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


def build_report(model_name: str, prompt: str, attribution, lens):
    """The HTML page: the identity, top contributors, per-head heatmap, the logit lens."""
    from interp.attribution import heads_table, top_contributors
    from interp.pages.html import Report
    from interp.pages.plotting import attribution_bars, head_heatmap, logit_lens_lines

    attrs = attribution.attrs
    target = (
        f"logit difference {attrs['answer']!r} - {attrs['wrong']!r}"
        if attrs["wrong"] is not None
        else f"logit of {attrs['answer']!r}"
    )
    total = attribution[attribution["component"] == "total"]["contribution"].item()
    report = Report(f"Direct logit attribution: {model_name}")
    report.add_text(
        f"Prompt: {prompt!r} ({attrs['n_tokens']} tokens), explained at position {attrs['pos']}."
    )
    report.add_text(
        f"The {target} is {total:.6g}. The rows below add up to it: each is a "
        "component's write to the residual stream, divided by the final LayerNorm's "
        "scale (frozen at its value in this run) and read along the unembedding "
        f"direction, on the LayerNorm-folded model (identity error "
        f"{attrs['identity_error']:.2g} against {attrs['reference_is']})."
    )
    parts = attribution[attribution["component"] != "total"]
    labelled = parts.assign(
        label=[
            _label(c, layer, head)
            for c, layer, head in zip(
                parts["component"], parts["layer"], parts["head"], strict=True
            )
        ]
    )
    report.add_heading("Top contributors")
    report.add_figure(
        attribution_bars(
            labelled,
            "contribution",
            label="label",
            top_k=TOP_N,
            title=f"largest contributions to the {target}",
        )
    )
    report.add_table(_display(top_contributors(attribution, TOP_N)), max_rows=TOP_N)
    report.add_heading("Attention heads")
    report.add_figure(
        head_heatmap(
            heads_table(attribution),
            "contribution",
            scale="signed",
            title="direct contribution of each head",
        ),
        caption="Colour scale: diverging, centred on 0 (blue raises the "
        f"{target}, red lowers it), symmetric about the largest magnitude.",
    )
    report.add_heading("Logit lens")
    report.add_text(
        "The residual stream after the embeddings and after each block, read "
        "through the model's own final LayerNorm and unembedding; the last row is "
        "the model's output."
    )
    value = "logit_diff" if "logit_diff" in lens.columns else "answer_logit"
    report.add_figure(
        logit_lens_lines(lens, value, x="label", line=None, title=f"{value} by layer")
    )
    report.add_figure(
        logit_lens_lines(
            lens, "answer_prob", x="label", line=None, title="answer probability by layer"
        )
    )
    report.add_table(lens)
    report.add_heading("All rows")
    report.add_table(_display(attribution), max_rows=len(attribution))
    return report


def run(args: argparse.Namespace) -> int:
    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    out = check_out_dir(args.out)
    if args.task is not None:
        return attribute_task.run_task(args, out, say)
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
    if args.wrong is not None and not args.wrong:
        raise UsageError("--wrong is empty; pass one token, or leave --wrong out")
    if args.wrong is not None and args.wrong == args.answer:
        raise UsageError(
            "--wrong is the same token as --answer: their difference is 0 by "
            "definition; pass another token, or leave --wrong out"
        )
    say(f"loading {args.model} ...")
    model = load_model(args.model, device=args.device)
    # imported only now, so that a refused command line starts fast (docs/commands.md)
    from interp.attribution import (
        TokenError,
        logit_attribution,
        logit_lens,
        resolve_token,
        top_contributors,
    )

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
    say("folding LayerNorm into a copy of the model and attributing ...")
    # folds a copy, and checks that the rows add up to the ORIGINAL model's logit
    attribution = logit_attribution(model, args.prompt, args.answer, wrong=args.wrong, pos=args.pos)
    lens = logit_lens(model, args.prompt, args.answer, wrong=args.wrong, pos=args.pos, k=args.top_k)
    csv = attribution[CSV_COLUMNS].to_csv(index=False)
    html = build_report(str(args.model), args.prompt, attribution, lens).to_html()
    with staged_output(out, owns=FILES) as stage:
        stage.write_text("attribution.csv", csv)
        stage.write_text("report.html", html)
    paths = stage.written

    total = attribution[attribution["component"] == "total"]["contribution"].item()
    what = "logit difference" if args.wrong is not None else "logit"
    print(
        f"{what}: {total:.6g} (rows add up to the model's {what} within "
        f"{attribution.attrs['identity_error']:.2g})"
    )
    top = top_contributors(attribution, 10)
    print(terminal_table(top, decimals=4))
    for path in paths:
        print(f"wrote {path}")
    return 0
