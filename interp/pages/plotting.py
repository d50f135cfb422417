"""Plotly figures made from results (DataFrames and tensors); nothing here shows or writes.

Every function returns a ``plotly.graph_objects.Figure``: show it in a notebook, or put it in
a page with :class:`interp.pages.html.Report`. Conventions shared by all of them:

* heads are labelled ``L5H1`` (:func:`head_label`), layers run down, heads across;
* token strings label axes, with whitespace made visible (``\\n`` as ``↵``);
  positions are numeric axes with token tick labels, so repeated tokens stay separate;
* every figure has a title (a default one when none is given), and every colour scale says
  what it is in its colour bar: a fixed 0..1 scale for scores that live in [0, 1] (a
  0.02 is pale, not bright), a diverging scale centred on 0 for signed quantities;
* every text taken from data (tokens, component names, legend names, titles) goes through
  :func:`plotly_text`: plotly.js reads a subset of HTML in its labels (``<b>``, ``<a href>``),
  and escaping makes a token such as ``<b>`` show as it is instead of as bold text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor

from interp.pages.plot_attribution import (
    ATTRIBUTION_VALUES,
    attribution_bars,
    component_label,
    logit_lens_lines,
)
from interp.pages.plot_style import (
    MAX_HOVER_CELLS,
    POSITIVE,
    TEMPLATE,
    _check_tokens,
    _colour_scale,
    _finite_or_none,
    _grid_heatmap,
    _position_axis,
    _require,
    _title,
    _value_column,
    head_label,
    plotly_text,
    theme,
    token_label,
)

__all__ = [
    "attention_heatmap",
    "attribution_bars",
    "component_label",
    "head_heatmap",
    "head_label",
    "logit_lens_lines",
    "loss_by_position",
    "plotly_text",
    "token_label",
    "TEMPLATE",
    "ATTRIBUTION_VALUES",
    "HEAD_VALUES",
]


# per-head score columns of interp's analyses, in the order head_heatmap picks them
HEAD_VALUES = ("induction_score", "copying_score", "recovered", "contribution", "score")


def _head_frame(df, value: str | None) -> tuple[pd.DataFrame, str]:
    """``(layer, head, value)`` rows from what an analysis returned, and the value column.

    Takes a per-head DataFrame (``detect_induction_heads``, ``copying_scores``), the
    ``logit_attribution`` frame (its ``head`` rows), or a result object with a ``table``
    (``PathPatchResult``, ``InductionResult``); rows without a head (MLPs) are left out.
    """
    table = getattr(df, "table", None)
    if not isinstance(df, pd.DataFrame) and isinstance(table, pd.DataFrame):
        df = table
    if not isinstance(df, pd.DataFrame):
        raise TypeError(
            f"head_heatmap takes a pandas DataFrame (or a result with a .table), "
            f"got {type(df).__name__}"
        )
    value = _value_column(df, value, HEAD_VALUES, "head_heatmap", "none of the known score columns")
    if "component" in df.columns and (df["component"] == "head").any():
        # logit_attribution: only its head rows are per head
        df = df[df["component"] == "head"]
    if {"site", "method", "pos", "head"} <= set(df.columns):  # patch_activations' frame
        df = _one_head_grid(df)
    if "head" in df.columns and df["head"].isna().any():
        df = df[df["head"].notna()]
    return df, value


def _one_head_grid(df: pd.DataFrame) -> pd.DataFrame:
    """The all-position head rows of a patching frame, when they form one layer x head grid
    (one site; exact rows when it has both methods)."""
    rows = df[df["head"].notna() & df["pos"].isna()]
    if (rows["method"] == "exact").any():
        rows = rows[rows["method"] == "exact"]
    sites = sorted(set(rows["site"]))
    if len(sites) > 1 or rows.empty:
        have = sorted(set(df["site"]))
        raise ValueError(
            f"this patching frame has no single layer x head grid (sites {have}); "
            "draw one site with interp.pages.patching_plots.patching_heatmap(frame, "
            "site), or patch with the 'heads' grid"
        )
    return rows


def head_heatmap(
    df: pd.DataFrame, value: str | None = None, *, title: str | None = None, scale: str = "auto"
) -> go.Figure:
    """A layer x head heatmap of any per-head score (``df`` has ``layer, head, <value>``).

    ``df`` may be what an analysis returned, as it is: ``detect_induction_heads`` (value
    ``induction_score`` by default), ``copying_scores`` (``copying_score``), the
    ``logit_attribution`` frame (its head rows' ``contribution``), a ``PathPatchResult``
    or a ``patch_activations`` frame of one per-head grid such as ``heads`` (``recovered``).
    ``value=None`` takes the first of ``HEAD_VALUES`` that ``df`` has.

    ``scale``: ``"unit"`` a fixed 0..1 scale (scores that are shares, such as attention
    scores); ``"unit-signed"`` a fixed -1..1 diverging scale (e.g. copying scores);
    ``"signed"`` a diverging scale centred on 0, symmetric about the largest magnitude;
    ``"auto"`` (default) the first of these that holds every value. The colour bar says
    which. NaN (an undefined score) is left blank; heads missing from ``df`` are blank too.
    """
    df, value = _head_frame(df, value)
    _require(df, ["layer", "head", value], "head_heatmap")
    if df.empty:
        raise ValueError("head_heatmap got an empty DataFrame")
    duplicated = df.duplicated(["layer", "head"])
    if duplicated.any():
        first = df.loc[duplicated, ["layer", "head"]].iloc[0]
        raise ValueError(
            f"head {head_label(first['layer'], first['head'])} appears more than "
            f"once; aggregate first (e.g. df.groupby(['layer', 'head']).mean())"
        )
    layers = df["layer"].astype(int).to_numpy()
    heads = df["head"].astype(int).to_numpy()
    if layers.min() < 0 or heads.min() < 0:
        raise ValueError("layer and head indices must be non-negative")
    n_layers, n_heads = int(layers.max()) + 1, int(heads.max()) + 1
    z = np.full((n_layers, n_heads), np.nan)
    z[layers, heads] = pd.to_numeric(df[value], errors="coerce").to_numpy(dtype=float)
    finite = z[np.isfinite(z)]
    name = plotly_text(value)
    hover = [
        [f"{head_label(layer, head)}<br>{name}" for head in range(n_heads)]
        for layer in range(n_layers)
    ]
    fig = go.Figure(
        _grid_heatmap(
            z,
            list(range(n_heads)),
            list(range(n_layers)),
            customdata=hover,
            hovertemplate="%{customdata}: %{z:.4g}<extra></extra>",
            **_colour_scale(finite, scale, name),
        )
    )
    fig.update_layout(
        template=theme(),
        title=_title(title, f"{value} of each head"),
        xaxis={"title": {"text": "head"}, "dtick": 1, "constrain": "domain"},
        yaxis={"title": {"text": "layer"}, "dtick": 1, "autorange": "reversed"},
        height=int(min(900, max(300, 180 + 32 * n_layers))),  # room for the colour bar
    )
    return fig


def _loss_source(loss, marks: Mapping[int, str] | None):
    """The loss tensor and marks of an ``InductionResult`` (or ``HeadScan``); else as given."""
    scan, batch = getattr(loss, "scan", None), getattr(loss, "batch", None)
    if scan is not None and batch is not None:  # InductionResult
        if marks is None:
            lengths = sorted({int(n) for n in batch.seq_lens.tolist()})
            marks = {batch.prefix + n: f"repeat of {n} starts" for n in lengths}
        return scan.loss, marks
    if not isinstance(loss, pd.DataFrame | Tensor | np.ndarray) and isinstance(
        getattr(loss, "loss", None), Tensor
    ):  # HeadScan
        return loss.loss, marks
    return loss, marks


def loss_by_position(
    loss: pd.DataFrame | Tensor | np.ndarray,
    *,
    tokens: Sequence[str] | None = None,
    value: str = "loss",
    title: str | None = None,
    marks: Mapping[int, str] | None = None,
) -> go.Figure:
    """Per-token loss against position: the mean line, and a ±1 std band over a batch.

    ``loss`` is a tensor/array ``[pos]`` or ``[batch pos]``, or a DataFrame with ``pos`` and
    ``value`` columns (several rows per position are averaged). ``marks`` draws labelled
    vertical lines, e.g. ``{seq_len: "repeat starts"}``.

    ``run_induction_scan``'s result can be passed as it is: its per-token loss over the
    repeated-token batch, marked where each repeat length's second copy starts.
    """
    loss, marks = _loss_source(loss, marks)
    mean, std, count, positions = _loss_stats(loss, value)
    _check_tokens(tokens, len(positions))
    hover = (
        [f"pos {int(p)} {token_label(t)}" for p, t in zip(positions, tokens, strict=True)]
        if tokens is not None
        else [f"pos {int(p)}" for p in positions]
    )
    name = plotly_text(value)
    traces = _std_band(positions, mean, std) if (count > 1).any() else []
    traces.append(
        go.Scatter(
            x=positions,
            y=_finite_or_none(mean.to_numpy()),
            mode="lines+markers",
            name=f"mean {name}",
            customdata=hover,
            hovertemplate="%{customdata}: %{y:.4g}<extra></extra>",
            line={"color": POSITIVE},
        )
    )
    fig = go.Figure(traces)
    for pos, label in (marks or {}).items():
        fig.add_vline(
            x=pos,
            line={"dash": "dash", "color": "#57606a"},
            annotation={"text": plotly_text(label)},
            annotation_position="top",
        )
    fig.update_layout(
        template=theme(),
        title=_title(title, f"{value} by position"),
        xaxis=_position_axis(tokens, len(positions), title="position"),
        yaxis={"title": {"text": name}},
        hovermode="closest",
    )
    return fig


def _loss_stats(loss, value: str) -> tuple[pd.Series, pd.Series, pd.Series, np.ndarray]:
    """Mean, std and count of the loss at each position, and the positions."""
    if isinstance(loss, pd.DataFrame):
        _require(loss, ["pos", value], "loss_by_position")
        grouped = loss.groupby("pos")[value]
        mean = grouped.mean()
        return mean, grouped.std(), grouped.count(), mean.index.to_numpy()
    values = torch.as_tensor(loss).detach().to(torch.float64).cpu()
    if values.ndim == 1:
        values = values[None]
    if values.ndim != 2:
        raise ValueError(f"loss must be [pos] or [batch, pos], got shape {tuple(values.shape)}")
    mean = pd.Series(values.mean(0).numpy())
    std = pd.Series(
        values.std(0).numpy() if values.shape[0] > 1 else np.full(values.shape[1], np.nan)
    )
    count = pd.Series(np.full(values.shape[1], values.shape[0]))
    return mean, std, count, np.arange(values.shape[1])


def _std_band(positions: np.ndarray, mean: pd.Series, std: pd.Series) -> list[go.Scatter]:
    """Two invisible lines at mean ± std, the space between them filled."""
    upper, lower = (mean + std).to_numpy(), (mean - std).to_numpy()
    edge = dict(x=positions, mode="lines", line={"width": 0}, hoverinfo="skip")
    return [
        go.Scatter(y=_finite_or_none(upper), showlegend=False, **edge),
        go.Scatter(
            y=_finite_or_none(lower),
            fill="tonexty",
            fillcolor="rgba(33,102,172,0.18)",
            name="± 1 std",
            **edge,
        ),
    ]


def attention_heatmap(
    pattern: Float[Tensor, "q_pos k_pos"],
    tokens: Sequence[str],
    *,
    title: str | None = None,
) -> go.Figure:
    """One head's attention pattern: queries (destinations) down, keys (sources) across,
    token strings on both axes, weights on a fixed 0..1 scale."""
    values = torch.as_tensor(pattern).detach().to(torch.float64).cpu()
    if values.ndim != 2 or values.shape[0] != values.shape[1]:
        raise ValueError(
            f"pattern must be [q_pos, k_pos] with q_pos == k_pos, got shape "
            f"{tuple(values.shape)}; pick one batch element, layer and head"
        )
    n = values.shape[0]
    _check_tokens(tokens, n)
    labels = [token_label(t) for t in tokens]
    trace = dict(
        z=[_finite_or_none(row) for row in values.tolist()],
        x=list(range(n)),
        y=list(range(n)),
        zmin=0.0,
        zmax=1.0,
        colorscale="Blues",
        colorbar={"title": {"text": "attention<br>(fixed 0 to 1)"}},
    )
    if n * n <= MAX_HOVER_CELLS:
        trace.update(
            customdata=[
                [f"{labels[q]} ({q}) → {labels[k]} ({k})" for k in range(n)] for q in range(n)
            ],
            hovertemplate="%{customdata}: %{z:.3f}<extra></extra>",
        )
    else:
        trace.update(hovertemplate="q %{y} → k %{x}: %{z:.3f}<extra></extra>")
    fig = go.Figure(go.Heatmap(**trace))
    size = int(min(1000, 220 + 14 * n))
    fig.update_layout(
        template=theme(),
        title=_title(title, "attention pattern"),
        width=size + 120,
        height=size,
        xaxis=_position_axis(tokens, n, title="key (source)")
        | {"tickangle": -60, "constrain": "domain"},
        yaxis=_position_axis(tokens, n, title="query (destination)")
        | {"autorange": "reversed", "scaleanchor": "x"},
    )
    return fig
