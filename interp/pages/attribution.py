"""The pages of ``interp attribute``: one prompt's attribution with its logit lens, or a task's.

Both pages show the identity first (the rows add up to the logit or logit difference), then the
top contributors, a heatmap of the heads and every row; one prompt's page adds the logit lens,
a task's page error bars (the standard error over rows) and each row's value and identity error.
Results in, pages out: nothing here recomputes an attribution.
"""

from __future__ import annotations

import pandas as pd

from interp.attribution import heads_table, top_contributors
from interp.pages.html import Report
from interp.pages.plotting import attribution_bars, head_heatmap, logit_lens_lines

__all__ = ["display_rows", "prompt_report", "task_report"]

TOP_N = 15  # contributors drawn and listed on a page


def display_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Blank (not ``<NA>``) where a row has no layer, head or neuron."""
    shown = frame.copy()
    for column in ("layer", "head", "neuron"):
        if column in shown.columns:
            shown[column] = [
                ("" if value is None or str(value) == "<NA>" else int(value))
                for value in shown[column]
            ]
    return shown


def _labelled(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with a ``label`` column: ``L1H0`` for a head, ``mlp L0``, ``embed``."""

    def label(component: str, layer, head) -> str:
        if component == "head":
            return f"L{layer}H{head}"
        return component if layer is None or str(layer) == "<NA>" else f"{component} L{layer}"

    keys = zip(frame["component"], frame["layer"], frame["head"], strict=True)
    return frame.assign(label=[label(c, layer, head) for c, layer, head in keys])


def _add_heads(report: Report, frame: pd.DataFrame, target: str, title: str) -> None:
    report.add_heading("Attention heads")
    report.add_figure(
        head_heatmap(heads_table(frame), "contribution", scale="signed", title=title),
        caption=f"Colour scale: diverging, centred on 0 (blue raises the {target}, red "
        "lowers it), symmetric about the largest magnitude.",
    )


def prompt_report(model_name: str, prompt: str, attribution: pd.DataFrame, lens: pd.DataFrame):
    """One prompt's page: the identity, top contributors, per-head heatmap, the logit lens."""
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
    labelled = _labelled(attribution[attribution["component"] != "total"])
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
    report.add_table(display_rows(top_contributors(attribution, TOP_N)), max_rows=TOP_N)
    _add_heads(report, attribution, target, "direct contribution of each head")
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
    report.add_table(display_rows(attribution), max_rows=len(attribution))
    return report


def task_report(summary: dict, frame: pd.DataFrame):
    """A task's page: the identity, top contributors with error bars, heads, the rows.
    ``summary``: what ``summary.json`` holds; ``frame``: the task table with its ``attrs``
    (:func:`interp.attribution.shards.merge_attribution_sums`)."""
    attrs = frame.attrs
    task = summary["task"]
    target = summary["explained"]
    sem = summary["mean_total_sem"]
    report = Report(f"Direct logit attribution over a task: {summary['model']}")
    report.add_text(
        f"Task {task['source']}: {task['n_rows']} rows"
        + (f" in {task['shards']} shards" if task["shards"] > 1 else "")
        + f". Each row is explained at its own last token for its own {target}; the tables "
        "hold the mean over rows (contribution) and its standard error over rows "
        "(contribution_sem)."
    )
    report.add_text(
        f"The mean {target} is {summary['mean_total']:.6g}"
        + (f" ± {sem:.2g}" if sem is not None else "")
        + ". In every row the components add up to that row's value: each is a component's "
        "write to the residual stream, divided by the final LayerNorm's scale (frozen at its "
        "value in that row) and read along the unembedding direction, on the LayerNorm-folded "
        f"model (largest identity error over the rows {attrs['identity_error']:.2g} against "
        f"{attrs['reference_is']})."
    )
    parts = frame[frame["component"] != "total"]
    parts = parts.assign(size=parts["contribution"].abs()).sort_values(
        "size", ascending=False, kind="stable"
    )
    top = _labelled(parts.head(TOP_N).drop(columns="size"))
    figure = attribution_bars(
        top, "contribution", label="label", title=f"largest mean contributions to the {target}"
    )
    errors = [0.0 if pd.isna(v) else float(v) for v in top["contribution_sem"]]
    figure.update_traces(error_x={"type": "data", "array": errors, "visible": True})
    report.add_heading("Top contributors")
    report.add_figure(figure, caption="Error bars: the standard error of the mean over rows.")
    report.add_table(display_rows(top.drop(columns="label")), max_rows=TOP_N)
    _add_heads(report, frame, target, "mean direct contribution of each head")
    report.add_heading("Rows")
    rows = pd.DataFrame(
        {
            "row": range(attrs["n_rows"]),
            "tokens": attrs["n_tokens_rows"],
            "answer": attrs["answer_rows"],
            "wrong": ["" if w is None else w for w in attrs["wrong_rows"]],
            "value": attrs["reference_rows"],
            "identity_error": attrs["identity_rows"],
        }
    )
    report.add_table(
        rows,
        caption=f"Each row's {target} (value), what its components add up to; row is 0-based "
        "(the task file's line 1 is row 0).",
    )
    report.add_heading("All components")
    report.add_table(display_rows(frame), max_rows=len(frame))
    return report
