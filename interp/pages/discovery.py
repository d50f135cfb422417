"""The page of ``interp discover``: the circuit as a graph, the faithfulness curve, the top edges
and the task's first rows. Results in, a :class:`interp.pages.html.Report` out; every text from the
task file or the model goes through the report's escaping (tables, paragraphs) or
:func:`interp.pages.plot_style.plotly_text` (figures)."""

from __future__ import annotations

import math

import pandas as pd

from interp.pages.discovery_plots import MAX_DRAWN, circuit_graph, faithfulness_curve
from interp.pages.html import Report

__all__ = ["discovery_report", "TOP_EDGES"]

TOP_EDGES = 50  # edges listed in the page's table
METHOD_NAMES = {
    "exact": "exact edge patching",
    "eap": "edge attribution patching (EAP)",
    "eap-ig": "EAP with integrated gradients (EAP-IG)",
    "acdc": "ACDC",
}


def _number(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "undefined"
    return f"{value:.{digits}f}"


def discovery_report(summary: dict, edges: pd.DataFrame, curve: pd.DataFrame | None) -> Report:
    """The page (module docstring) from ``summary.json``'s dict, the edge frame
    (``edge, source, target, score, in_circuit``) and the curve (None when not evaluated)."""
    task = summary["task"]
    method = summary["method"]
    params = summary["parameters"]
    report = Report(f"Circuit discovery: {summary['model']}")
    chose = (
        f"the top {params['top_n']} edges by |score|"
        if "top_n" in params
        else (
            f"the edges ACDC kept at threshold {params['threshold']:g}"
            if method == "acdc"
            else f"every edge with |score| >= {params['threshold']:g}"
        )
    )
    report.add_text(
        f"Task {task['source']}: {task['n_rows']} rows"
        + (f" in {task['shards']} shards" if task.get("shards", 1) > 1 else "")
        + f", metric {params['metric']} (clean mean {summary['clean_metric']:.6g}, corrupted "
        f"mean {summary['corrupted_metric']:.6g}). Method: {METHOD_NAMES[method]}"
        + (f" with {params['ig_steps']} steps" if "ig_steps" in params else "")
        + f"; the circuit is {chose}: {summary['n_edges']} of {summary['n_total']} edges."
    )
    if summary["evaluated"]:
        report.add_text(
            f"Faithfulness of the circuit ({summary['ablation']} ablation of every edge outside "
            f"it): {_number(summary['faithfulness'])}, where 1 is the full model and 0 the "
            f"empty circuit. Area under the curve (CPR): {_number(summary['cpr'])}; area "
            f"under |1 - faithfulness| (CMD): {_number(summary['cmd'])}."
        )
    else:
        report.add_text(summary["not_evaluated"])
    report.add_heading("The circuit")
    drawn = min(summary["n_edges"], MAX_DRAWN)
    report.add_figure(
        circuit_graph(edges, title=f"circuit: {summary['n_edges']} edges, {drawn} drawn"),
        caption="Layers from left to right. Just left of each head is its query (q) input, "
        "further left the key (k) and value (v) inputs of its key/value head (shared by a group "
        "of heads under grouped-query attention); an edge is coloured by the input it feeds. "
        "Width grows with |score|; dotted edges have a negative score. Hover over an edge's "
        "middle for its score."
        + (
            f" Only the {MAX_DRAWN} largest edges are drawn."
            if summary["n_edges"] > MAX_DRAWN
            else ""
        ),
    )
    if curve is not None:
        report.add_heading("Faithfulness curve")
        report.add_figure(
            faithfulness_curve(curve),
            caption="Faithfulness of the circuit of the top edges by |score| at each fraction "
            "of the graph's edges (MIB's fractions, at least one edge).",
        )
        report.add_table(curve, max_rows=len(curve))
    report.add_heading("Top edges")
    ranked = edges.assign(size=edges["score"].abs()).sort_values(
        "size", ascending=False, kind="stable"
    )
    report.add_table(
        ranked.drop(columns="size").head(TOP_EDGES),
        caption=f"The {TOP_EDGES} largest edges by |score| ({METHOD_NAMES[method]}); "
        "edges.csv lists every edge.",
        max_rows=TOP_EDGES,
    )
    if summary.get("examples"):
        report.add_heading("The task's first rows")
        report.add_table(pd.DataFrame(summary["examples"]), max_rows=len(summary["examples"]))
    return report
