"""A report section for a patching frame: what was patched, heatmaps, top cells, errors.

Over a task, each cell is a dataset mean: the top cells are drawn with error bars (the
standard error, ``recovered_sem``) and listed with the spread over rows (the standard deviation
of the rows' metric in units of recovered, ``recovered_sd = recovered_sem * sqrt(n_rows)``).
Warnings about the experiment itself (``frame.attrs["sanity"]``) come first, in a box.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from interp.interventions.patching import method_errors
from interp.pages.patching_plots import patching_errorbars, patching_heatmap

__all__ = ["add_patching_section", "top_cells", "cell_label", "pos_label"]

TOP_N = 15


def top_cells(frame: pd.DataFrame, n: int = TOP_N, *, method: str = "exact") -> pd.DataFrame:
    """The ``n`` cells of one method that recover the most (largest ``|recovered|``, or
    ``|metric - corrupted|`` when recovered is undefined)."""
    rows = frame[frame["method"] == method]
    key = rows["recovered"].abs()
    if key.isna().all():
        key = (rows["metric"] - frame.attrs.get("corrupted_metric", 0.0)).abs()
    return rows.loc[key.sort_values(ascending=False).index[:n]]


def add_patching_section(
    report,
    frame: pd.DataFrame,
    *,
    tokens: Sequence[str] | None = None,
    heading: str = "Activation patching",
) -> None:
    """Add heatmaps per site, the top cells and (method both) the attribution error."""
    attrs = frame.attrs
    direction = attrs.get("direction", "denoising")
    report.add_heading(heading)
    report.add_warnings(
        "Check the experiment before trusting these numbers", attrs.get("sanity") or []
    )
    what = (
        "clean activations patched into the corrupted run"
        if direction == "denoising"
        else "corrupted activations patched into the clean run"
    )
    report.add_text(
        f"{direction.capitalize()}: {what}. Metric {attrs.get('metric_name', '?')}: "
        f"clean run {attrs.get('clean_metric', float('nan')):.6g}, corrupted run "
        f"{attrs.get('corrupted_metric', float('nan')):.6g}. recovered = (metric - "
        "corrupted) / (clean - corrupted): 0 is the corrupted run, 1 the clean run."
    )
    if attrs.get("recovered_undefined"):
        report.add_text(
            "The clean and corrupted metrics are numerically equal, so recovered is "
            "undefined (blank); the metric column still holds each patched value."
        )
    methods = [m for m in ("exact", "attribution") if m in set(frame["method"])]
    value = "metric" if attrs.get("recovered_undefined") else "recovered"
    for site in dict.fromkeys(frame["site"]):
        rows = frame[frame["site"] == site]
        for per_position in sorted({bool(p) for p in rows["pos"].notna()}, reverse=True):
            for method in methods:
                report.add_figure(
                    patching_heatmap(
                        frame,
                        site,
                        method=method,
                        value=value,
                        tokens=tokens,
                        per_position=per_position,
                    )
                )
    top = top_cells(frame, method=methods[0])
    report.add_heading("Cells that matter most")
    n_rows = attrs.get("n_rows")
    if n_rows and "recovered_sem" in frame.columns and not attrs.get("recovered_undefined"):
        report.add_text(
            f"Means over the task's {n_rows} rows. Error bars: the standard error of the mean "
            "(recovered_sem); recovered_sd is the spread over rows (their standard deviation, "
            "in units of recovered)."
        )
        top = top.assign(recovered_sd=top["recovered_sem"] * math.sqrt(n_rows))
        report.add_figure(
            patching_errorbars(top, labels=[cell_label(r, tokens) for _, r in top.iterrows()])
        )
    report.add_table(_display(top, tokens), max_rows=TOP_N)
    if len(methods) == 2:
        errors = method_errors(frame)
        report.add_heading("Attribution patching against exact patching")
        report.add_text(
            "The gradient estimate beside the exact value of each cell, in metric "
            f"units; largest absolute error {errors['error'].abs().max():.4g}. Where "
            "the error is large the linear approximation fails: trust the exact "
            "number there."
        )
        worst = errors.loc[errors["error"].abs().sort_values(ascending=False).index[:TOP_N]]
        report.add_table(_display(worst, tokens), max_rows=TOP_N)


def pos_label(pos, tokens: Sequence[str] | None) -> str:
    """``3 ' the'``: a position with the token at it (the position alone without tokens); a
    label (``IO``, of ``positions="named"``) as it is."""
    if pd.isna(pos):
        return ""
    if isinstance(pos, str):
        return pos
    pos = int(pos)
    return f"{pos} {tokens[pos]!r}" if tokens is not None and 0 <= pos < len(tokens) else str(pos)


def cell_label(row, tokens: Sequence[str] | None = None) -> str:
    """``head L1H0``, ``resid_pre L2 @ 3 ' the'``: one cell of a patching frame, for axes."""
    where = f"L{int(row['layer'])}" + ("" if pd.isna(row["head"]) else f"H{int(row['head'])}")
    pos = pos_label(row["pos"], tokens)
    return f"{row['site']} {where}" + (f" @ {pos}" if pos else "")


def _display(frame: pd.DataFrame, tokens: Sequence[str] | None = None) -> pd.DataFrame:
    shown = frame.copy()
    shown["head"] = ["" if pd.isna(v) else int(v) for v in shown["head"]]
    shown["pos"] = [pos_label(v, tokens) for v in shown["pos"]]
    return shown
