"""Figures of direct logit attribution and the logit lens: signed bars per component, and one
line per token across the residual stream's stages."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from interp.pages.plot_style import (
    NEGATIVE,
    POSITIVE,
    _finite_or_none,
    _missing,
    _require,
    _title,
    _value_column,
    head_label,
    plotly_text,
    theme,
    token_label,
)

__all__ = ["attribution_bars", "logit_lens_lines", "component_label", "ATTRIBUTION_VALUES"]


def component_label(component: str, layer=None, head=None, neuron=None) -> str:
    """A ``logit_attribution`` row's name: ``L5H1`` for a head, ``mlp L3``, ``neuron L3 N7``,
    ``attn_bias L2``, or the component itself (``embed``, ``unembed_bias``...)."""
    if component == "head" and not _missing(layer) and not _missing(head):
        return head_label(layer, head)
    if component == "neuron" and not _missing(layer) and not _missing(neuron):
        return f"neuron L{int(layer)} N{int(neuron)}"
    return str(component) if _missing(layer) else f"{component} L{int(layer)}"


def _component_labels(df: pd.DataFrame, label: str | None) -> list[str]:
    if label is not None:
        _require(df, [label], "attribution_bars")
        return [str(v) for v in df[label]]
    if "component" in df.columns and "layer" in df.columns:  # logit_attribution's frame
        heads = df["head"] if "head" in df.columns else [None] * len(df)
        neurons = df["neuron"] if "neuron" in df.columns else [None] * len(df)
        return [
            component_label(*row)
            for row in zip(df["component"], df["layer"], heads, neurons, strict=True)
        ]
    for column in ("component", "name", "label"):
        if column in df.columns:
            return [str(v) for v in df[column]]
    if {"layer", "head"} <= set(df.columns):
        return [
            head_label(layer, head) for layer, head in zip(df["layer"], df["head"], strict=True)
        ]
    return [str(v) for v in df.index]


ATTRIBUTION_VALUES = ("contribution", "attribution")  # value columns attribution_bars looks for


def attribution_bars(
    df: pd.DataFrame,
    value: str | None = None,
    *,
    label: str | None = None,
    top_k: int | None = None,
    title: str | None = None,
    drop_total: bool = True,
) -> go.Figure:
    """Horizontal bars of per-component attributions, largest magnitude at the top,
    coloured by sign. NaN values (undefined) are listed last, without a bar.

    ``df`` may be ``logit_attribution``'s frame as it is: ``value=None`` takes its
    ``contribution`` column (or an ``attribution`` column), bars are named from
    ``component, layer, head`` (``L5H1``, ``mlp L3``, ``embed``: :func:`component_label`),
    and the ``total`` row, the sum of all the others, is left out (``drop_total=False``
    keeps it). Otherwise labels come from ``label``, else a ``component``/``name``/``label``
    column, else ``layer, head`` (as ``L5H1``), else the index."""
    _require(df, [], "attribution_bars")  # a DataFrame, before its columns are read
    value = _value_column(df, value, ATTRIBUTION_VALUES, "attribution_bars", "neither of")
    _require(df, [value], "attribution_bars")
    if drop_total and "component" in df.columns:
        df = df[df["component"] != "total"]
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    labels = _component_labels(df, label)
    values = pd.to_numeric(df[value], errors="coerce").to_numpy(dtype=float)
    order = sorted(
        range(len(values)),
        key=lambda i: (
            not math.isfinite(values[i]),
            -abs(values[i]) if math.isfinite(values[i]) else 0.0,
        ),
    )
    if top_k is not None:
        order = order[:top_k]
    shown = [values[i] for i in order]
    fig = go.Figure(
        go.Bar(
            x=_finite_or_none(shown),
            y=list(range(len(order))),
            orientation="h",
            marker={
                "color": [
                    POSITIVE if v >= 0 else NEGATIVE if math.isfinite(v) else "#999" for v in shown
                ]
            },
            customdata=[plotly_text(labels[i]) for i in order],
            hovertemplate="%{customdata}: %{x:.4g}<extra></extra>",
        )
    )
    fig.update_layout(
        template=theme(),
        title=_title(title, f"{value} by component"),
        xaxis={"title": {"text": plotly_text(value)}, "zeroline": True},
        yaxis={
            "tickmode": "array",
            "tickvals": list(range(len(order))),
            "ticktext": [plotly_text(labels[i]) for i in order],
            "autorange": "reversed",
        },
        height=int(min(1600, 140 + 22 * len(order))),
        showlegend=False,
    )
    return fig


# logit_lens's per-token columns, drawn as one line each when no value is named
LENS_TOKEN_VALUES = {"answer_logit": "answer", "wrong_logit": "wrong"}


def _lens_frame(
    df: pd.DataFrame, value: str | None, x: str | None, line: str | None
) -> tuple[pd.DataFrame, str, str, str | None]:
    """``(frame, value, x, line)`` to draw: ``logit_lens``'s wide frame (one row per layer,
    ``answer_logit``/``wrong_logit`` columns) becomes one ``logit`` line per token."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"logit_lens_lines takes a pandas DataFrame, got {type(df).__name__}")
    if x is None:
        x = "label" if "label" in df.columns else "layer"
    if value is not None or "logit" in df.columns:
        return df, value or "logit", x, line
    wide = [c for c in LENS_TOKEN_VALUES if c in df.columns]
    if wide:
        parts = []
        for column in wide:
            token = df.attrs.get(LENS_TOKEN_VALUES[column])
            name = f"{token} ({LENS_TOKEN_VALUES[column]})" if token is not None else column
            parts.append(
                pd.DataFrame({x: df[x].to_numpy(), "token": name, "logit": df[column].to_numpy()})
            )
        return pd.concat(parts, ignore_index=True), "logit", x, "token"
    if "top1_prob" in df.columns:  # logit_lens without an answer: the top token's probability
        return df, "top1_prob", x, None
    raise ValueError(
        "logit_lens_lines: name the value column to draw; the DataFrame has none "
        f"of 'logit', {list(LENS_TOKEN_VALUES)}, 'top1_prob' "
        f"(it has {list(df.columns)})"
    )


def logit_lens_lines(
    df: pd.DataFrame,
    value: str | None = None,
    *,
    x: str | None = None,
    line: str | None = "token",
    title: str | None = None,
) -> go.Figure:
    """Logit-lens lines: ``value`` (a logit, probability, rank or logit difference) at each
    ``x`` (a layer index or a stage name such as ``"embed"``, in the order given), one line
    per distinct ``line`` value (e.g. each target token). ``line=None`` (or no such column)
    draws a single line.

    ``logit_lens``'s frame can be passed as it is: ``value=None`` draws ``answer_logit`` (and
    ``wrong_logit``) as one line per token, named by the tokens, or ``top1_prob`` when no
    answer was given (hover names the top token); name any other column (``logit_diff``,
    ``answer_prob``, ``answer_rank``) to draw it. ``x=None`` is the frame's ``label`` column
    (``embed``, ``L0``, ...) when it has one, else ``layer``. A long frame with a ``logit``
    column draws ``logit``."""
    df, value, x, line = _lens_frame(df, value, x, line)
    _require(df, [x, value], "logit_lens_lines")
    stages = list(dict.fromkeys(df[x].tolist()))  # order of first appearance
    numeric = all(isinstance(s, int | float | np.integer | np.floating) for s in stages)
    position = {stage: (float(stage) if numeric else i) for i, stage in enumerate(stages)}
    grouped = line is not None and line in df.columns
    groups = df.groupby(line, sort=False) if grouped else [(value, df)]
    top_tokens = value == "top1_prob" and "top1_token" in df.columns
    fig = go.Figure()
    for key, group in groups:
        key = key[0] if isinstance(key, tuple) and len(key) == 1 else key
        name = token_label(key) if grouped else plotly_text(key)
        xs = [position[s] for s in group[x]]
        hover = [f"{name} at {plotly_text(s)}" for s in group[x]]
        if top_tokens:
            hover = [
                f"{h} (top token {token_label(t)})"
                for h, t in zip(hover, group["top1_token"], strict=True)
            ]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=_finite_or_none(pd.to_numeric(group[value], errors="coerce")),
                mode="lines+markers",
                name=name,
                customdata=hover,
                hovertemplate="%{customdata}: %{y:.4g}<extra></extra>",
            )
        )
    xaxis: dict = {"title": {"text": plotly_text(x)}}
    if not numeric:
        xaxis.update(
            tickmode="array",
            tickvals=list(range(len(stages))),
            ticktext=[plotly_text(s) for s in stages],
        )
    fig.update_layout(
        template=theme(),
        title=_title(title, f"{value} by {x}"),
        xaxis=xaxis,
        yaxis={"title": {"text": plotly_text(value)}},
        legend={"title": {"text": plotly_text(line) if grouped else ""}},
    )
    return fig
