"""Heatmaps of patching results: layer x position and layer x head, from the tidy frame.

``recovered`` is drawn on a diverging scale fixed at -1..1 around 0 (0 = the corrupted run,
1 = the clean run), so figures of different prompts compare; NaN cells are left blank.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from interp.pages.plot_style import _finite_or_none, _grid_heatmap
from interp.pages.plotting import head_heatmap, head_label, plotly_text, theme, token_label

__all__ = ["patching_heatmap", "patching_errorbars"]

MAX_TICK_CHARS = 24  # longer tokens are cut on the axis (hover shows the position)


def patching_heatmap(
    frame: pd.DataFrame,
    site: str,
    *,
    method: str = "exact",
    value: str = "recovered",
    tokens: Sequence[str] | None = None,
    per_position: bool | None = None,
    title: str | None = None,
) -> go.Figure:
    """One site kind of a :func:`~interp.interventions.patch_activations` frame as a heatmap.

    Sites with positions give layer (or head, ``L1H0``) x position; head sites without
    positions give layer x head. ``per_position`` chooses between a head site's two grids
    (default: per position when the frame has them). ``tokens`` label the positions.
    """
    rows, per_position = _site_rows(frame, site, method, value, per_position)
    what = f"{value} ({method}, {site})"
    if not per_position:
        fig = head_heatmap(rows.astype({"layer": int, "head": int}), value, title=title or what)
        if value == "recovered":
            fig.update_traces(colorscale="RdBu", zmid=0, zmin=-1, zmax=1)
        return fig
    z, y_text, named = _position_grid(rows, value)
    n_pos = z.shape[1]
    scale = {"zmid": 0, "zmin": -1, "zmax": 1} if value == "recovered" else {"zmid": 0}
    fig = go.Figure(
        _grid_heatmap(
            z,
            list(range(n_pos)),
            y_text,
            colorscale="RdBu",
            colorbar={"title": {"text": plotly_text(value)}},
            hovertemplate="%{y}, pos %{x}: %{z:.4g}<extra></extra>",
            **scale,
        )
    )
    fig.update_layout(
        template=theme(),
        title={"text": plotly_text(title or what)},
        xaxis=_x_axis(named, tokens, n_pos),
        yaxis={
            "title": {"text": "head" if rows["head"].notna().any() else "layer"},
            "type": "category",
            "autorange": "reversed",
        },
        height=int(min(1200, max(300, 180 + 24 * len(y_text)))),
    )
    return fig


def _site_rows(frame: pd.DataFrame, site: str, method: str, value: str, per_position):
    """The frame's rows of one site and method, of the per-position grid or the other
    (``per_position`` None: per position where the frame has such rows), and which it is."""
    missing = [
        c for c in ("site", "layer", "head", "pos", "method", value) if c not in frame.columns
    ]
    if missing:
        raise ValueError(
            f"patching_heatmap needs a patch_activations frame; columns {missing} "
            f"are missing (it has {list(frame.columns)})"
        )
    rows = frame[(frame["site"] == site) & (frame["method"] == method)]
    if rows.empty:
        raise ValueError(
            f"no {method} rows for site {site!r}; the frame has sites "
            f"{sorted(set(frame['site']))} and methods {sorted(set(frame['method']))}"
        )
    has_pos = rows["pos"].notna()
    if per_position is None:
        per_position = bool(has_pos.any())
    rows = rows[has_pos] if per_position else rows[~has_pos]
    if rows.empty:
        grid = "per-position" if per_position else "all-position"
        raise ValueError(
            f"site {site!r} has no {grid} rows; patch with the matching grid "
            "(e.g. 'heads_pos' or 'heads')"
        )
    return rows, per_position


def _position_grid(rows: pd.DataFrame, value: str):
    """``value`` as a grid ``[layer (or head) pos]``, NaN where no row is, its row labels
    (``L3`` or ``L1H0``) and the position labels of ``positions="named"`` rows (else [])."""
    with_heads = rows["head"].notna().any()
    keys = (
        list(zip(rows["layer"], rows["head"], strict=True)) if with_heads else list(rows["layer"])
    )
    labels = sorted(set(keys))
    y_text = [head_label(*k) if with_heads else f"L{int(k)}" for k in labels]
    named = [p for p in dict.fromkeys(rows["pos"]) if isinstance(p, str)]  # positions="named"
    n_pos = len(named) if named else int(rows["pos"].max()) + 1
    z = np.full((len(labels), n_pos), np.nan)
    where = {k: i for i, k in enumerate(labels)}
    column = {p: i for i, p in enumerate(named)}
    at = [column[p] for p in rows["pos"]] if named else rows["pos"].astype(int).to_numpy()
    z[[where[k] for k in keys], at] = pd.to_numeric(rows[value], errors="coerce").to_numpy(
        dtype=float
    )
    return z, y_text, named


def _x_axis(named: list[str], tokens: Sequence[str] | None, n_pos: int) -> dict:
    """The position axis: ticks by label, by token (when one per position), else numbers."""
    x_axis: dict = {"title": {"text": "position"}}
    if named:
        x_axis.update(tickmode="array", tickvals=list(range(n_pos)), ticktext=named)
    elif tokens is not None and len(tokens) == n_pos:
        x_axis.update(
            tickmode="array",
            tickvals=list(range(n_pos)),
            ticktext=[token_label(t, max_chars=MAX_TICK_CHARS) for t in tokens],
        )
    return x_axis


def patching_errorbars(
    frame: pd.DataFrame, *, labels: Sequence[str], title: str | None = None
) -> go.Figure:
    """Cells of a task's patching frame as bars of ``recovered`` with error bars of
    ``recovered_sem`` (the standard error over rows), one bar per label, in the frame's order."""
    if "recovered_sem" not in frame.columns:
        raise ValueError(
            "error bars need a frame patched over a task (a recovered_sem column); "
            f"this one has {list(frame.columns)}"
        )
    if len(labels) != len(frame):
        raise ValueError(f"pass one label per cell ({len(frame)}), got {len(labels)}")
    fig = go.Figure(
        go.Bar(
            x=[plotly_text(label) for label in labels],
            y=_finite_or_none(frame["recovered"].to_numpy(dtype=float)),
            error_y={
                "type": "data",
                "array": _finite_or_none(frame["recovered_sem"].to_numpy(dtype=float)),
                "visible": True,
            },
            hovertemplate="%{x}: %{y:.4g} ± %{error_y.array:.2g}<extra></extra>",
        )
    )
    fig.update_layout(
        template=theme(),
        title={"text": plotly_text(title or "recovered (mean over rows, ± standard error)")},
        yaxis={"title": {"text": "recovered"}},
        height=420,
    )
    return fig
