"""Turn an :class:`InductionResult` into files: CSV, JSON and a self-contained HTML report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from interp.engine import run_cached
from interp.foundation.files import write_text_atomic
from interp.foundation.formatting import head_names
from interp.induction.detect import INDUCTION_MIN, InductionResult
from interp.pages.html import Report

__all__ = ["table_csv", "table_json", "build_report", "render_outputs", "write_outputs"]

# per-head score -> (colour scale, what the caption says); see interp.pages.plotting.head_heatmap
HEATMAPS = {
    "induction_score": ("unit", "share of attention on the token after the earlier copy"),
    "prev_token_score": ("unit", "share of attention on the previous token"),
    "duplicate_token_score": ("unit", "share of attention on the earlier copy of the token"),
    "copying_score": ("unit-signed", "Σλ/Σ|λ| of the full OV circuit: 1 copies, -1 suppresses"),
    "ablation_loss_increase": (
        "signed",
        "repeated-half loss with the head mean-ablated, minus the clean loss (blank: not ablated)",
    ),
}
HEATMAP_COLUMNS = list(HEATMAPS)
N_ATTENTION_VIEWS = 3  # top heads whose attention pattern is drawn


def table_csv(table: pd.DataFrame) -> str:
    """``head_scores.csv``: the table with fixed decimals."""
    # fixed decimals: the same seed gives the same bytes
    return table.to_csv(index=False, float_format="%.6f", lineterminator="\n")


def _finite(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


def table_json(result: InductionResult, model_name: str) -> str:
    """``head_scores.json``: settings, losses, the heads found and every row (NaN as null)."""
    heads = [
        {k: _finite(v) for k, v in row.items()}
        for row in json.loads(result.table.to_json(orient="records", double_precision=6))
    ]
    document = {
        "model": model_name,
        "settings": result.settings,
        "loss_first_half": round(result.loss_first_half, 6),
        "loss_repeated_half": round(result.loss_repeated_half, 6),
        "induction_heads": [[h["layer"], h["head"]] for h in heads if h["is_induction"]],
        "heads": heads,
    }
    return json.dumps(document, indent=2, allow_nan=False) + "\n"


def _attention_views(report: Report, model, result: InductionResult) -> None:
    """The top heads' patterns on one repeated sequence, as heatmaps on a fixed 0..1 scale
    (plotly, already on the page: no second 1.3 MB library for three small patterns)."""
    from interp.pages.plotting import attention_heatmap

    top = result.table.head(N_ATTENTION_VIEWS)
    row = int((result.batch.seq_lens == result.batch.seq_lens.min()).nonzero()[0])
    seq_len = int(result.batch.seq_lens[row])
    prefix = result.batch.prefix  # 1 with BOS, 0 without
    tokens = result.batch.tokens[row, : prefix + 2 * seq_len]  # no padding after the copies
    layers = sorted(set(top["layer"].tolist()))
    run = run_cached(model, tokens, patterns=True, layers=layers, keep_logits=False)
    strings = model.to_str_tokens(tokens)
    for rank, (lay, hd, score) in enumerate(
        zip(top["layer"], top["head"], top["induction_score"], strict=True), 1
    ):
        pattern = run[f"blocks.{lay}.attn.hook_pattern"][0, hd]
        report.add_figure(
            attention_heatmap(
                pattern, strings, title=f"L{lay}H{hd} (#{rank} by induction score {score:.3f})"
            ),
            caption=f"one row of {'BOS + ' if prefix else ''}{seq_len} random tokens repeated "
            f"once{'' if prefix else ' (no BOS)'}: an induction "
            f"head lights the stripe {seq_len - 1} to the left of the diagonal in the "
            "second copy. Colour: attention weight, fixed 0 to 1.",
        )


def _why(result: InductionResult) -> str:
    reason = result.settings.get("seq_lens_reason")
    return f" ({reason})" if reason else ""


def build_report(model, result: InductionResult, model_name: str) -> Report:
    """``report.html``: heatmaps, the ranked table, top heads' attention and loss by position."""
    from interp.pages.plotting import head_heatmap, loss_by_position

    table = result.table
    found = table[table["is_induction"]]
    report = Report(f"Induction heads: {model_name}")
    row = "BOS + a + a" if result.batch.prefix else "a + a (no BOS)"
    report.add_text(
        f"Model: {model_name}. Batch: {len(result.batch.tokens)} rows of {row} with "
        f"repeat lengths {result.settings['seq_lens']}{_why(result)}, seed "
        f"{result.settings['seed']}.\n"
        f"Loss on the first copy {result.loss_first_half:.3f}, on the repeated copy "
        f"{result.loss_repeated_half:.3f} (ratio "
        f"{result.loss_repeated_half / result.loss_first_half:.1%}).\n"
        f"Induction heads found: "
        f"{', '.join(head_names(found)) or 'none'} "
        f"(verdict: induction score >= {INDUCTION_MIN} at every repeat length, no attention "
        "to the same offset on fresh tokens, and ablation raises the repeated-half loss)."
    )
    report.add_heading("Head scores")
    for column, (scale, meaning) in HEATMAPS.items():
        if table[column].notna().any():
            what = {
                "unit": "fixed 0 to 1",
                "unit-signed": "fixed -1 to 1, diverging at 0",
                "signed": "diverging, centred on 0",
            }[scale]
            report.add_figure(
                head_heatmap(
                    table, column, scale=scale, title=f"{column.replace('_', ' ')} per head"
                ),
                caption=f"{meaning}. Colour scale: {what}.",
            )
    report.add_heading("Ranked heads")
    report.add_table(table, caption="ranked by induction score", max_rows=20)
    report.add_heading("Attention of the top heads")
    _attention_views(report, model, result)
    report.add_heading("Loss by position")
    seq_len = int(result.batch.seq_lens.max())
    rows = result.batch.seq_lens == seq_len
    prefix = result.batch.prefix  # 1 with BOS, 0 without
    loss = result.scan.loss[rows][:, : prefix + 2 * seq_len - 1]  # predictions inside [BOS] a a
    report.add_figure(
        loss_by_position(
            loss,
            marks={prefix + seq_len: "second copy starts"},
            title=f"Next-token loss, {seq_len} random tokens repeated once",
        ),
        caption="loss at position p is for predicting token p + 1; mean and ±1 std over rows",
    )
    return report


def render_outputs(model, result: InductionResult, model_name: str) -> dict[str, str]:
    """Every output file's name and text, rendered in memory (nothing written)."""
    return {
        "head_scores.csv": table_csv(result.table),
        "head_scores.json": table_json(result, model_name),
        "report.html": build_report(model, result, model_name).to_html(),
    }


def write_outputs(out_dir: Path, model, result: InductionResult, model_name: str) -> list[Path]:
    """Render everything first, then write each file atomically: no half-written file. (The
    ``interp induction`` command stages the set, so the folder changes all at once.)"""
    contents = render_outputs(model, result, model_name)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [write_text_atomic(out_dir / name, text) for name, text in contents.items()]
