"""A report section for a patching frame: what was patched, heatmaps, top cells, errors."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from interp.interventions.patching import method_errors
from interp.interventions.plots import patching_heatmap

__all__ = ["add_patching_section", "top_cells"]

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
    report.add_heading("Cells that matter most")
    report.add_table(_display(top_cells(frame, method=methods[0])), max_rows=TOP_N)
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
        report.add_table(_display(worst), max_rows=TOP_N)


def _display(frame: pd.DataFrame) -> pd.DataFrame:
    shown = frame.copy()
    for column in ("head", "pos"):
        shown[column] = ["" if pd.isna(v) else int(v) for v in shown[column]]
    return shown
