"""``interp features``: pages of an SAE's top features (contexts, logit effects, histograms)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from interp.cli.options import MAX_SEED, add_model_option, add_out_dir, device, int_between
from interp.cli.output import UsageError, check_out_dir, staged_output
from interp.cli.sources import load_model

HELP = (
    "pages of an SAE's top features: top-activating contexts, logit effects and activation "
    "histograms; write features.csv, summary.json and report.html"
)
FEATURES_CSV, SUMMARY, REPORT = "features.csv", "summary.json", "report.html"
MAX_TOKENS = 1_000_000  # tokens scanned at most (a few minutes on a CPU for small models)
ROW_TOKENS = 128  # tokens per scanned row


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_option(parser)
    parser.add_argument(
        "--sae", required=True, help="a bundled SAE's name (interp models), or an SAE folder"
    )
    add_out_dir(parser)
    parser.add_argument(
        "--top", type=int_between(1, 500), default=20, help="features shown, 1 to 500 (default 20)"
    )
    parser.add_argument(
        "--tokens",
        type=int_between(ROW_TOKENS, MAX_TOKENS),
        default=32_768,
        help=f"tokens to scan, {ROW_TOKENS} to {MAX_TOKENS} (default 32768)",
    )
    parser.add_argument(
        "--contexts", type=int_between(1, 50), default=8, help="contexts per feature (default 8)"
    )
    parser.add_argument(
        "--text",
        type=Path,
        help="a UTF-8 text file to scan (default: the bundled model's own training mix)",
    )
    parser.add_argument(
        "--seed", type=int_between(0, MAX_SEED), default=0, help="seeds the scanned rows"
    )
    parser.add_argument("--device", type=device, default="cpu", help="torch device (default cpu)")


def _texts(path: Path | None) -> list[str] | None:
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--text {path}: cannot read it as UTF-8 text ({exc})") from None
    if not text.strip():
        raise UsageError(f"--text {path} is empty")
    return [text]


def run(args: argparse.Namespace) -> int:
    out = check_out_dir(args.out)
    texts = _texts(args.text)
    from interp.saes.loading import SAELoadError, check_sae_fits, load_sae

    try:
        sae = load_sae(args.sae)
    except SAELoadError as exc:
        raise UsageError(f"--sae: {exc}") from None
    print(f"loading {args.model} ...", file=sys.stderr, flush=True)
    model = load_model(args.model, device=args.device)
    check_sae_fits(model, sae)
    import torch

    from interp.dictionaries.data import TokenRows
    from interp.pages.features import features_report
    from interp.saes.features import feature_summary

    sae = sae.to(args.device)
    start = time.perf_counter()
    rows = TokenRows(model, texts, torch.Generator().manual_seed(args.seed), holdout=0.0)
    batches = rows.draw(args.tokens)
    summary = feature_summary(model, sae, batches, top=args.top, contexts=args.contexts)
    seconds = time.perf_counter() - start
    info = {"model": str(args.model), "SAE": f"{args.sae} ({sae!r})", "text": str(args.text or
            "the bundled model's training mix (stdlib source and a + a repeats)")}  # fmt: skip
    record = {
        "model": str(args.model),
        "sae": str(args.sae),
        "hook": sae.hook_name,
        "architecture": sae.architecture,
        "d_sae": sae.d_sae,
        "tokens": summary.n_tokens,
        "dead_features": summary.n_dead,
        "shown": [int(j) for j in summary.table["feature"]],
        "seed": args.seed,
        "seconds": round(seconds, 2),
    }
    files = {
        FEATURES_CSV: summary.table.to_csv(index=False),
        SUMMARY: json.dumps(record, indent=2) + "\n",
        REPORT: features_report(f"Features of {args.sae}", summary, info),
    }
    with staged_output(out, owns=[FEATURES_CSV, SUMMARY, REPORT]) as stage:
        for name, text in files.items():
            stage.write_text(name, text)
    print(
        f"{summary.n_tokens} tokens scanned, {summary.n_dead} of {sae.d_sae} features dead; "
        f"top {len(summary.table)} shown ({seconds:.1f} s)"
    )
    for path in stage.written:
        print(f"wrote {path}")
    return 0
