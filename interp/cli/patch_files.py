"""The files of ``interp patch``, either form: patching.csv, summary.json and report.html,
staged together, and the results on the terminal (also of ``interp merge``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from interp.cli.output import staged_output, terminal_table

__all__ = ["FILES", "SHARD_FILES", "print_results", "task_summary", "write_files", "write_results"]

FILES = ["patching.csv", "summary.json", "report.html"]  # what a whole run writes
SHARD_FILES = ["partial.json"]  # what one shard writes
TOP_N = 10  # cells listed on the terminal


def task_summary(parts: list[dict], frame) -> dict:
    """summary.json of a task run: the task (n_rows, source) and the first row's tokens."""
    first = next(p for p in parts if p["shard"] == 0)
    settings = first["settings"]
    attrs = frame.attrs
    return {
        "clean_metric": attrs["clean_metric"],
        "corrupted_metric": attrs["corrupted_metric"],
        "metric": attrs["metric_name"],
        "recovered_undefined": attrs["recovered_undefined"],
        "model": first["source"]["model"],
        "task": {
            "source": first["source"]["task"],
            "n_rows": settings["n_rows"],
            "fingerprint": settings["task"],
            "shards": settings["shards"],
        },
        "sites": settings["sites"],
        "method": settings["method"],
        "direction": settings["direction"],
        "n_tokens": attrs["n_tokens"],
        "tokens": first["tokens"],  # of the task's first row
        "corrupted_tokens": first["corrupted_tokens"],
        "sanity": attrs["sanity"],
        "rows": len(frame),
    }


def write_results(out: Path, parts: list[dict], frame) -> int:
    """patching.csv, summary.json and report.html of a task run (whole or merged)."""
    from interp.interventions.patching import TASK_COLUMNS

    summary = task_summary(parts, frame)
    task = summary["task"]
    text = (
        f"Task {task['source']}: {task['n_rows']} rows"
        + (f" in {task['shards']} shards" if task["shards"] > 1 else "")
        + f". Positions are labelled with the first row's tokens ({len(summary['tokens'])})."
    )
    title = f"Activation patching over a task: {summary['model']}"
    return write_files(out, frame, TASK_COLUMNS, summary, title, text)


def write_files(out: Path, frame, columns: list[str], summary: dict, title: str, text: str) -> int:
    """The three files of either form, staged together; the results on the terminal."""
    from interp.pages.html import Report
    from interp.pages.patching import add_patching_section

    report = Report(title)
    report.add_text(text)
    add_patching_section(report, frame, tokens=summary["tokens"])
    html = report.to_html()
    with staged_output(out, owns=FILES) as stage:
        stage.write_text("patching.csv", frame[columns].to_csv(index=False))
        stage.write_text("summary.json", json.dumps(summary, indent=2) + "\n")
        stage.write_text("report.html", html)
    method = "exact" if summary["method"] in ("exact", "both") else "attribution"
    print_results(frame, summary["tokens"], method)
    for path in stage.written:
        print(f"wrote {path}")
    return 0


def print_results(frame, tokens: list[str], method: str) -> None:
    """The metrics, the sanity warnings (on stderr) and the top cells, ``pos`` with its token."""
    from interp.pages.patching import pos_label, top_cells

    attrs = frame.attrs
    over = f" (means over {attrs['n_rows']} rows)" if attrs.get("n_rows") else ""
    print(
        f"{attrs['metric_name']}{over}: clean {attrs['clean_metric']:.6g}, corrupted "
        f"{attrs['corrupted_metric']:.6g}"
    )
    for warning in attrs.get("sanity") or []:
        print(f"warning: {warning}", file=sys.stderr)
    if attrs["recovered_undefined"]:
        print("clean and corrupted metrics are equal: recovered is undefined (empty)")
    top = top_cells(frame, TOP_N, method=method).copy()
    top["pos"] = [pos_label(p, tokens) or None for p in top["pos"]]
    print(terminal_table(top, decimals=4))
