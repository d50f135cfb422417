"""``interp attribute --task FILE``: direct logit attribution over every row of a task file.

Each row is attributed at its own last token to its own answer (minus its own wrong token);
``attribution.csv`` holds the mean over rows (``contribution``) and its standard error
(``contribution_sem``). The file is read (its structure checked row by row) before the model
loads and checked against the tokenizer right after, before any forward pass: a refusal exits
2 and writes nothing. ``--shard I/N`` attributes rows ``I, I+N, ...`` and writes their partial
sums to ``partial.json``; ``interp merge`` combines the shards. A whole run is one shard of one
and goes through the same sums (:mod:`interp.attribution_shards`).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from interp.cli.executor_options import check_executor
from interp.cli.output import (
    UsageError,
    check_shard,
    staged_output,
    terminal_table,
    write_partial,
)
from interp.cli.sources import load_model

__all__ = ["PAIR_OPTIONS", "run_task", "write_results", "is_attribution_partial"]

PAIR_OPTIONS = ("--prompt", "--answer", "--wrong", "--pos", "--top-k")  # not with --task
CSV_COLUMNS = ["component", "layer", "head", "contribution", "contribution_sem"]
# every file it owns: a pair run writes the first and the report, a task run the first three
# (and attribution_rows.csv with --per-row), a shard partial.json
FILES = ["attribution.csv", "summary.json", "report.html", "attribution_rows.csv", "partial.json"]
ROW_COLUMNS = ["row", "component", "layer", "head", "contribution"]
TOP_N = 15  # contributors drawn in the report
TERMINAL_N = 10  # and listed on the terminal


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


def run_task(args: argparse.Namespace, out: Path, say) -> int:
    """Check the file, load, check it against the tokenizer, attribute (whole, or one shard
    into partial.json), write."""
    from interp.cli.patch_task import read_task

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
    say(f"loading {args.model} ...")
    model = load_model(args.model, device=args.device)
    from interp.attribution_shards import attribution_partial_sums, merge_attribution_sums
    from interp.tasks import TaskError

    try:  # every row against the tokenizer and the context, before any forward pass
        task.tokens(model)
    except TaskError as exc:
        raise UsageError(f"--task: {exc}") from None
    if args.executor is not None:
        from interp.cli.executor_run import run_attribute

        return run_attribute(args, out, model, task, write_results, say)
    rows = len(range(index, len(task), count))
    say(f"folding LayerNorm into a copy of the model and attributing {rows} of {len(task)} rows")
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


def _display(frame):
    """Blank (not ``<NA>``) where a row has no layer or head."""
    shown = frame.copy()
    for column in ("layer", "head", "neuron"):
        if column in shown.columns:
            shown[column] = [
                ("" if value is None or str(value) == "<NA>" else int(value))
                for value in shown[column]
            ]
    return shown


def _label(component: str, layer, head) -> str:
    if component == "head":
        return f"L{layer}H{head}"
    return component if layer is None or str(layer) == "<NA>" else f"{component} L{layer}"


def build_report(summary: dict, frame):
    """The HTML page: the identity, top contributors with error bars, heads, the rows."""
    import pandas as pd

    from interp.attribution import heads_table
    from interp.html import Report
    from interp.plotting import attribution_bars, head_heatmap

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
    top = parts.head(TOP_N).drop(columns="size")
    keys = zip(top["component"], top["layer"], top["head"], strict=True)
    top = top.assign(label=[_label(c, la, h) for c, la, h in keys])
    figure = attribution_bars(
        top, "contribution", label="label", title=f"largest mean contributions to the {target}"
    )
    errors = [0.0 if pd.isna(v) else float(v) for v in top["contribution_sem"]]
    figure.update_traces(error_x={"type": "data", "array": errors, "visible": True})
    report.add_heading("Top contributors")
    report.add_figure(figure, caption="Error bars: the standard error of the mean over rows.")
    report.add_table(_display(top.drop(columns="label")), max_rows=TOP_N)
    report.add_heading("Attention heads")
    report.add_figure(
        head_heatmap(
            heads_table(frame),
            "contribution",
            scale="signed",
            title="mean direct contribution of each head",
        ),
        caption=f"Colour scale: diverging, centred on 0 (blue raises the {target}, red "
        "lowers it), symmetric about the largest magnitude.",
    )
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
    report.add_table(_display(frame), max_rows=len(frame))
    return report


def write_results(out: Path, parts: list[dict], frame) -> int:
    """attribution.csv, summary.json and report.html of a task run (whole or merged), and
    attribution_rows.csv when the shards kept each row (``--per-row``)."""
    from interp.attribution_shards import merge_attribution_rows

    summary = summary_of(parts, frame)
    html = build_report(summary, frame).to_html()
    rows = None
    if parts[0]["settings"].get("per_row"):  # row: 0-based, as task[row] and per_row=True
        rows = merge_attribution_rows(parts)[ROW_COLUMNS].to_csv(index=False)
    with staged_output(out, owns=FILES) as stage:
        stage.write_text("attribution.csv", frame[CSV_COLUMNS].to_csv(index=False))
        stage.write_text("summary.json", json.dumps(summary, indent=2) + "\n")
        stage.write_text("report.html", html)
        if rows is not None:
            stage.write_text("attribution_rows.csv", rows)
    sem = summary["mean_total_sem"]
    print(
        f"mean {summary['explained']} over {summary['task']['n_rows']} rows: "
        f"{summary['mean_total']:.6g}" + (f" ± {sem:.2g}" if sem is not None else "") + " "
        f"(in every row the components add up to its value within "
        f"{summary['identity_error']:.2g})"
    )
    body = frame[frame["component"] != "total"]
    top = body.loc[body["contribution"].abs().sort_values(ascending=False).index[:TERMINAL_N]]
    print(terminal_table(top.reset_index(drop=True), decimals=4))
    for path in stage.written:
        print(f"wrote {path}")
    return 0
