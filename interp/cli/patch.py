"""``interp patch``: which activations carry the difference between a clean and a corrupted
prompt, by activation patching (exact, attribution, or both)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from interp.cli.options import add_model_option, device
from interp.cli.output import UsageError, check_out_dir, staged_output
from interp.cli.patch_task import PAIR_OPTIONS, add_task_arguments, print_results, run_task
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
FILES = ["patching.csv", "summary.json", "report.html"]
# interp.interventions.patching's GRIDS (names), METHODS and DIRECTIONS, copied so that help
# and a refused command line need no torch; a test keeps them in step
GRIDS = (
    "resid_pre",
    "resid_mid",
    "resid_post",
    "attn_out",
    "mlp_out",
    "heads",
    "heads_pos",
    "q",
    "k",
    "v",
    "pattern",
    "q_pos",
    "k_pos",
    "v_pos",
    "pattern_pos",
)
METHODS = ("exact", "attribution", "both")
DIRECTIONS = ("denoising", "noising")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_option(parser)
    parser.add_argument("--clean", help="the prompt the model gets right")
    parser.add_argument(
        "--corrupted",
        help="a prompt of the same token length that changes the answer",
    )
    parser.add_argument(
        "--answer",
        help="the clean run's next token after the last position (one token)",
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
    add_task_arguments(parser)
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--device", type=device, default="cpu", help="torch device (default cpu)")


def _parse_sites(text: str) -> list[str]:
    sites = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in sites if s not in GRIDS]
    if not sites or unknown:
        raise UsageError(
            f"--sites {text!r}: unknown {unknown or 'empty'}; choose from {', '.join(GRIDS)}"
        )
    return list(dict.fromkeys(sites))


def build_report(model_name: str, args: argparse.Namespace, frame, tokens: list[str]):
    from interp.pages.html import Report
    from interp.pages.patching import add_patching_section

    report = Report(f"Activation patching: {model_name}")
    report.add_text(
        f"Clean prompt: {args.clean!r}. Corrupted prompt: {args.corrupted!r} "
        f"({len(tokens)} tokens each). Answer {args.answer!r}"
        + (f", wrong answer {args.wrong!r}." if args.wrong is not None else ".")
    )
    add_patching_section(report, frame, tokens=tokens)
    return report


def run(args: argparse.Namespace) -> int:
    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    out = check_out_dir(args.out)
    sites = _parse_sites(args.sites)
    if args.task is not None:
        return run_task(args, out, sites, say)
    for option in ("--metric", "--shard", "--executor"):
        if getattr(args, option[2:]) is not None:
            raise UsageError(f"{option} is for --task; leave it out with --clean/--corrupted")
    missing = [o for o in PAIR_OPTIONS[:3] if getattr(args, o[2:]) is None]
    if missing:
        raise UsageError(
            f"pass {', '.join(missing)} (a prompt pair and its answer), or --task FILE.jsonl"
        )
    for option, value in (
        ("--clean", args.clean),
        ("--corrupted", args.corrupted),
        ("--answer", args.answer),
    ):
        if not value:
            raise UsageError(f"{option} is empty; pass some text")
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
    from interp.attribution import TokenError, resolve_token
    from interp.engine import PromptError
    from interp.interventions import logit_diff, probability
    from interp.interventions.patching import COLUMNS, pair_tokens, patch_activations

    try:  # refused before any work: a multi-token answer, prompts of unequal lengths
        answer = resolve_token(model, args.answer)
        wrong = (
            None if args.wrong is None else resolve_token(model, args.wrong, role="wrong answer")
        )
        clean, corrupted = pair_tokens(model, args.clean, args.corrupted)
    except (TokenError, PromptError) as exc:
        raise UsageError(str(exc)) from None
    metric = logit_diff(answer, wrong) if wrong is not None else probability(answer)
    say(f"patching {', '.join(sites)} ({args.method}, {args.direction}) ...")
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
    tokens = [model.tokenizer.decode([t]) for t in clean[0].tolist()]
    corrupted_tokens = [model.tokenizer.decode([t]) for t in corrupted[0].tolist()]
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
        "corrupted_tokens": corrupted_tokens,
        "sanity": attrs["sanity"],
        "rows": len(frame),
    }
    html = build_report(str(args.model), args, frame, tokens).to_html()
    with staged_output(out, owns=FILES) as stage:
        stage.write_text("patching.csv", frame[COLUMNS].to_csv(index=False))
        stage.write_text("summary.json", json.dumps(summary, indent=2) + "\n")
        stage.write_text("report.html", html)
    print_results(frame, tokens, "exact" if args.method in ("exact", "both") else "attribution")
    for path in stage.written:
        print(f"wrote {path}")
    return 0
