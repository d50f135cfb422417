"""``interp circuits``: per-head copying scores and Q/K/V-composition scores from the weights."""

from __future__ import annotations

import argparse
import sys

from interp.cli.options import MAX_SEED, add_model_option, add_out_dir, device, int_between
from interp.cli.output import check_out_dir, staged_output
from interp.cli.sources import load_model

HELP = (
    "score every head from its weights: copying (full OV eigenvalues) and Q/K/V-composition; "
    "write copying_scores.csv, composition_scores.csv and report.html"
)
COPYING_CSV, COMPOSITION_CSV, REPORT = "copying_scores.csv", "composition_scores.csv", "report.html"
COPYING_COLUMNS = ["layer", "head", "copying_score", "undefined", "kv_head"]
TOP_PAIRS = 10  # strongest pairs per kind shown in the report
MAX_BASELINE_SAMPLES = 100_000  # the baseline's error is ~std/sqrt(n): far past useful here


def _kinds(text: str) -> str:
    kinds = text.upper().replace(",", "")
    if not kinds or any(k not in "QKV" for k in kinds) or len(set(kinds)) != len(kinds):
        raise argparse.ArgumentTypeError(f"expected some of Q, K, V (e.g. QKV or K), got {text!r}")
    return kinds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_option(parser)
    add_out_dir(parser)
    parser.add_argument(
        "--kinds",
        type=_kinds,
        default="QKV",
        help="composition kinds to score, some of Q, K, V (default QKV)",
    )
    parser.add_argument(
        "--no-fold-ln",
        action="store_true",
        help="use the weights as stored instead of folding LayerNorm into them",
    )
    parser.add_argument(
        "--baseline-samples",
        type=int_between(2, MAX_BASELINE_SAMPLES),
        default=200,
        help="random matrix pairs behind the composition baseline, "
        f"2 to {MAX_BASELINE_SAMPLES} (default 200)",
    )
    parser.add_argument(
        "--seed", type=int_between(0, MAX_SEED), default=0, help="seeds the baseline (default 0)"
    )
    parser.add_argument("--no-report", action="store_true", help="write only the two CSV files")
    parser.add_argument("--device", type=device, default="cpu", help="torch device (default cpu)")


def _excess_by_head(comp, kind: str):
    """Per later head: the strongest composition into it, minus the random baseline."""
    rows = comp[comp["kind"] == kind]
    grouped = rows.assign(excess=rows["score"] - rows["baseline"])
    return (
        grouped.groupby(["dst_layer", "dst_head"], as_index=False)["excess"]
        .max()
        .rename(columns={"dst_layer": "layer", "dst_head": "head"})
    )


def build_report(model_name: str, copying, composition, *, fold_ln: bool) -> str:
    from interp.pages.html import Report
    from interp.pages.plotting import head_heatmap

    report = Report(f"QK/OV circuits of {model_name}")
    report.add_text(
        "Scores from the weights alone (no prompt). "
        + (
            "LayerNorm weights, biases and centring are folded into the weights that read from "
            "each LayerNorm; its division by a per-token scale is left out, so the full OV circuit "
            "W_E W_V W_O W_U is the usual approximation of what a head does to a token's embedding."
            if fold_ln
            else "Weights as stored (LayerNorm not folded in)."
        )
    )
    report.add_heading("Copying scores")
    report.add_text(
        "Σλ / Σ|λ| over the eigenvalues of each head's full OV circuit: near 1 the "
        "head raises the logit of the token it attends to (copying); near -1 it "
        "lowers it. Blank: undefined (all eigenvalues numerically zero)."
    )
    report.add_figure(
        head_heatmap(
            copying, "copying_score", scale="unit-signed", title="copying score of each head"
        ),
        caption="Colour scale: fixed -1 to 1, diverging at 0 (blue copies, red suppresses).",
    )
    report.add_table(
        copying.sort_values("copying_score", ascending=False).head(TOP_PAIRS),
        caption="heads with the highest copying scores",
    )
    for kind in composition["kind"].unique():
        rows = composition[composition["kind"] == kind]
        if rows.empty:
            continue
        baseline = float(rows["baseline"].iloc[0])
        report.add_heading(f"{kind}-composition")
        report.add_text(
            f"||W_OV W_B||_F / (||W_OV||_F ||W_B||_F) for every earlier head's OV "
            f"circuit into a later head's {kind} side. Random matrices of the same "
            f"shapes score {baseline:.4f} on average: read scores against that."
        )
        report.add_figure(
            head_heatmap(
                _excess_by_head(composition, kind),
                "excess",
                scale="signed",
                title=f"strongest {kind}-composition into each head, minus the random baseline",
            ),
            caption="Colour scale: diverging, centred on 0 (the random "
            "baseline), symmetric about the largest magnitude. Layer 0 "
            "is blank: no earlier head writes into it.",
        )
        report.add_table(
            rows.sort_values("score", ascending=False).head(TOP_PAIRS),
            caption=f"strongest {kind}-composition pairs",
        )
    return report.to_html()


def run(args: argparse.Namespace) -> int:
    out = check_out_dir(args.out)
    fold_ln = not args.no_fold_ln
    print(f"loading {args.model} ...", file=sys.stderr, flush=True)
    model = load_model(args.model, device=args.device)
    # imported only now, so that a refused command line starts fast (docs/commands.md)
    from interp.circuits import composition_scores, copying_scores

    copying = copying_scores(model, fold_ln=fold_ln)
    composition = composition_scores(
        model, args.kinds, fold_ln=fold_ln, baseline_samples=args.baseline_samples, seed=args.seed
    )
    files = {
        COPYING_CSV: copying[COPYING_COLUMNS].to_csv(index=False),
        COMPOSITION_CSV: composition.to_csv(index=False),
    }
    if not args.no_report:
        files[REPORT] = build_report(str(args.model), copying, composition, fold_ln=fold_ln)
    with staged_output(out, owns=[COPYING_CSV, COMPOSITION_CSV, REPORT]) as stage:
        for name, text in files.items():
            stage.write_text(name, text)
    paths = stage.written

    top = copying.sort_values("copying_score", ascending=False).head(5)
    print(
        "highest copying scores: "
        + ", ".join(
            f"L{lay}H{h} {s:.3f}"
            for lay, h, s in zip(top["layer"], top["head"], top["copying_score"], strict=True)
        )
    )
    n_undefined = int(copying["undefined"].sum())
    if n_undefined:
        print(f"{n_undefined} heads have no copying score (all eigenvalues numerically zero)")
    for kind in args.kinds:
        rows = composition[composition["kind"] == kind]
        if rows.empty:
            print(f"{kind}-composition: no pairs (one layer)")
            continue
        best = rows.loc[rows["score"].idxmax()]
        print(
            f"{kind}-composition: strongest L{best.src_layer}H{best.src_head} -> "
            f"L{best.dst_layer}H{best.dst_head} {best.score:.3f} (random baseline "
            f"{best.baseline:.3f})"
        )
    for path in paths:
        print(f"wrote {path}")
    return 0
