"""What every interp figure shares: the theme, labels for heads and tokens, escaped text, the
colour scales and the axis helpers (the conventions are listed in :mod:`interp.pages.plotting`)."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

__all__ = ["TEMPLATE", "theme", "plotly_text", "token_label", "head_label", "SCALES"]


TEMPLATE = "plotly_white"  # plotly's light theme for every figure: prints and reads in reports
TRACE_TYPES = ("bar", "heatmap", "scatter")  # the traces interp draws
_THEME: list = []  # theme(), built once


def theme():
    """:data:`TEMPLATE` as a ``go.layout.Template`` holding its layout and the defaults of the
    traces interp draws only: the same figures, half the template in every page, and about
    15 ms less a figure (plotly copies a template into each figure; the named one carries the
    defaults of 24 kinds of trace)."""
    if not _THEME:
        import plotly.graph_objects as go
        import plotly.io as pio

        full = pio.templates[TEMPLATE]
        data = {kind: getattr(full.data, kind) for kind in TRACE_TYPES}
        _THEME.append(go.layout.Template(layout=full.layout, data=data))
    return _THEME[0]


POSITIVE, NEGATIVE = "#2166ac", "#b2182b"  # the ends of RdBu, for signed bars
MAX_TICK_LABELS = 64  # more token tick labels than this overlap; hover still names tokens
MAX_TICK_CHARS = 24  # longer tokens are cut on axes (hover shows them whole)
MAX_HOVER_CELLS = 128 * 128  # per-cell hover text costs ~40 bytes a cell in the page

_VISIBLE_WHITESPACE = str.maketrans({"\n": "↵", "\r": "␍", "\t": "⇥"})


def plotly_text(text: object) -> str:
    """``text`` escaped for plotly.js labels, which read ``<b>``, ``<br>``, ``<a href>``...:
    ``&``, ``<``, ``>`` become entities that plotly shows as the characters themselves."""
    return html.escape(str(text), quote=False)


def token_label(token: str, *, max_chars: int | None = None) -> str:
    """A token as an axis or hover label: whitespace control characters made visible, cut to
    ``max_chars`` (with ``…``), and escaped with :func:`plotly_text`. Spaces are kept
    (``" the"`` differs from ``"the"``)."""
    text = str(token).translate(_VISIBLE_WHITESPACE) or "∅"
    if max_chars is not None and len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    return plotly_text(text)


def head_label(layer: int, head: int) -> str:
    """A head's short name, ``L5H1`` for layer 5, head 1 (used on axes and in hover text)."""
    return f"L{int(layer)}H{int(head)}"


def _title(title: str | None, default: str) -> dict:
    return {"text": plotly_text(default if title is None else title)}


# heatmap colour scales: (what the colour bar says, zmin, zmax, colorscale)
SCALES = ("auto", "unit", "unit-signed", "signed")
_UNIT_TOLERANCE = 1e-6  # float error may push a share just past 0 or 1


def _colour_scale(finite: np.ndarray, scale: str, value: str) -> dict:
    """Heatmap keyword arguments for ``scale`` (see :func:`head_heatmap`)."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    low = float(finite.min()) if finite.size else 0.0
    high = float(finite.max()) if finite.size else 0.0
    if scale == "auto":
        if low >= -_UNIT_TOLERANCE and high <= 1 + _UNIT_TOLERANCE:
            scale = "unit"
        elif low >= -1 - _UNIT_TOLERANCE and high <= 1 + _UNIT_TOLERANCE:
            scale = "unit-signed"
        else:
            scale = "signed"
    if scale == "unit":
        if low < -_UNIT_TOLERANCE or high > 1 + _UNIT_TOLERANCE:
            raise ValueError(
                f"{value} runs from {low:.4g} to {high:.4g}, outside [0, 1]; "
                "use scale='signed' or 'auto'"
            )
        return {
            "zmin": 0.0,
            "zmax": 1.0,
            "colorscale": "Viridis",
            "colorbar": {"title": {"text": f"{value}<br>(fixed 0 to 1)"}},
        }
    if scale == "unit-signed":
        if low < -1 - _UNIT_TOLERANCE or high > 1 + _UNIT_TOLERANCE:
            raise ValueError(
                f"{value} runs from {low:.4g} to {high:.4g}, outside [-1, 1]; "
                "use scale='signed' or 'auto'"
            )
        limit, what = 1.0, "fixed -1 to 1"
    else:
        limit = max(abs(low), abs(high)) or 1.0
        what = f"±{limit:.3g}"
    return {
        "zmin": -limit,
        "zmax": limit,
        "zmid": 0.0,
        "colorscale": "RdBu",
        "colorbar": {"title": {"text": f"{value}<br>({what}, 0 white)"}},
    }


def _require(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"{what} takes a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(
            f"{what} needs columns {list(columns)}; {missing} missing "
            f"(the DataFrame has {list(df.columns)})"
        )


def _value_column(
    df: pd.DataFrame, value: str | None, known: Sequence[str], what: str, none_of: str
) -> str:
    """``value``, or (None) the first of the ``known`` value columns that ``df`` has."""
    if value is not None:
        return value
    found = [c for c in known if c in df.columns]
    if not found:
        raise ValueError(
            f"{what}: name the value column to draw; {none_of} {list(known)} is in "
            f"{list(df.columns)}"
        )
    return found[0]


def _finite_or_none(values) -> list[float | None]:
    return [None if v is None or not math.isfinite(float(v)) else float(v) for v in values]


def _grid_heatmap(z: np.ndarray, x: list, y: list, **style):
    """A ``go.Heatmap`` of the grid ``z`` with a gap between cells; NaN cells left blank."""
    import plotly.graph_objects as go

    return go.Heatmap(
        z=[_finite_or_none(row) for row in z], x=x, y=y, hoverongaps=False, xgap=1, ygap=1, **style
    )


def _position_axis(tokens: Sequence[str] | None, n_pos: int, *, title: str) -> dict:
    axis: dict = {"title": {"text": title}}
    if tokens is not None and n_pos <= MAX_TICK_LABELS:
        axis.update(
            tickmode="array",
            tickvals=list(range(n_pos)),
            ticktext=[token_label(t, max_chars=MAX_TICK_CHARS) for t in tokens],
        )
    return axis


def _check_tokens(tokens: Sequence[str] | None, n_pos: int) -> None:
    if tokens is not None and len(tokens) != n_pos:
        raise ValueError(f"{len(tokens)} tokens for {n_pos} positions; they must agree")


def _missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))
