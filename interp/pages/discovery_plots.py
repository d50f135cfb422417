"""Figures of a discovered circuit: the circuit as a graph and the faithfulness curve.

:func:`circuit_graph` draws an edge frame (``edge, source, target, score, in_circuit``) with
the layers in order from left to right: ``embed``, then each layer's heads (one row per head)
and its MLP, then ``logits``. Left of each head is its query (``q``) input port, and further
left the key (``k``) and value (``v``) ports of its key/value head (shared by a group of query
heads under grouped-query attention); an edge ends at the port it feeds, coloured by the
reader's kind; an edge's width grows with ``|score|`` and a negative score is dotted. Hovering
over the middle of an edge shows its name and score.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from interp.pages.plot_style import _require, _title, plotly_text, theme

__all__ = ["circuit_graph", "faithfulness_curve", "READER_COLOURS", "MAX_DRAWN"]

# one colour per kind of reader, so that q, k and v inputs are told apart
READER_COLOURS = {
    "q": "#1f77b4",
    "k": "#ff7f0e",
    "v": "#2ca02c",
    "mlp": "#7f7f7f",
    "logits": "#000000",
}
READER_NAMES = {"q": "query input", "k": "key input", "v": "value input", "mlp": "MLP input"}
MAX_DRAWN = 300  # edges drawn at most (the largest by |score|); the table lists every one
_PORT = {"k": -0.15, "v": 0.15}  # key and value ports about the centre of their heads
_NODE = re.compile(r"^(?:embed|logits|L(\d+)H(\d+)(?:\.([qkv]))?|MLP(\d+))$")


def _parse(name: str) -> tuple[str, int | None, int | None]:
    """``(kind, layer, head)`` of a writer or reader name; a ValueError for anything else."""
    match = _NODE.match(name)
    if match is None:
        raise ValueError(f"{name!r} is not a writer or reader of the discovery graph")
    if name in ("embed", "logits"):
        return name, None, None
    if match.group(4) is not None:
        return "mlp", int(match.group(4)), None
    return match.group(3) or "head", int(match.group(1)), int(match.group(2))


class _Layout:
    """Positions: x by layer (heads at ``2l + 1``, the MLP at ``2l + 2``), y by head."""

    def __init__(self, names: list[str]):
        parsed = [_parse(n) for n in names]
        layers = [layer for _, layer, _ in parsed if layer is not None]
        self.n_layers = max(layers, default=-1) + 1
        heads = [h for kind, _, h in parsed if kind in ("head", "q")]
        kv = [h for kind, _, h in parsed if kind in ("k", "v")]
        self.n_heads = max(heads + kv, default=0) + 1
        n_kv = max(kv, default=-1) + 1
        # grouped-query attention: key/value head j is shared by query heads j*g .. (j+1)*g-1
        self.group = max(1, self.n_heads // n_kv) if n_kv else 1
        self.middle = (self.n_heads - 1) / 2

    def node(self, name: str) -> tuple[float, float]:
        kind, layer, head = _parse(name)
        if kind == "embed":
            return 0.0, self.middle
        if kind == "logits":
            return 2.0 * self.n_layers + 1, self.middle
        if kind == "mlp":
            return 2.0 * layer + 2, self.middle
        if kind == "head":
            return 2.0 * layer + 1, float(head)
        if kind == "q":  # one port per query head, right of the key/value ports
            return 2.0 * layer + 1 - 0.3, float(head)
        centre = head * self.group + (self.group - 1) / 2  # the heads sharing this k/v head
        return 2.0 * layer + 1 - 0.6, centre + _PORT[kind]

    def reader(self, name: str) -> tuple[float, float]:
        kind, layer, _ = _parse(name)
        if kind == "mlp":
            return 2.0 * layer + 2 - 0.3, self.middle
        return self.node(name)


def circuit_graph(
    edges: pd.DataFrame, *, max_drawn: int = MAX_DRAWN, title: str | None = None
) -> go.Figure:
    """The edges with ``in_circuit`` true (or every edge of a frame without that column) as a
    graph (module docstring); at most ``max_drawn`` of them, the largest by ``|score|``."""
    _require(edges, ["edge", "source", "target", "score"], "circuit_graph")
    chosen = edges[edges["in_circuit"].astype(bool)] if "in_circuit" in edges else edges
    chosen = chosen.assign(size=chosen["score"].abs().fillna(0.0))
    chosen = chosen.sort_values("size", ascending=False, kind="stable").head(max_drawn)
    names = ["embed", "logits", *edges["source"], *edges["target"]]
    layout = _Layout(names)
    largest = float(chosen["size"].max()) if len(chosen) else 0.0
    fig = go.Figure()
    for row in chosen.itertuples(index=False):
        (x0, y0), (x1, y1) = layout.node(row.source), layout.reader(row.target)
        kind = _parse(row.target)[0]
        width = 1.0 + 7.0 * (row.size / largest if largest > 0 else 0.0)
        dash = "dot" if float(row.score) < 0 else "solid"
        fig.add_trace(
            go.Scatter(
                x=[x0, x1], y=[y0, y1], mode="lines", hoverinfo="skip", showlegend=False,
                line={"color": READER_COLOURS[kind], "width": width, "dash": dash},
            )
        )  # fmt: skip
    for kind, colour in READER_COLOURS.items():  # hover points at each edge's middle
        part = chosen[[_parse(t)[0] == kind for t in chosen["target"]]]
        if part.empty:
            continue
        pairs = zip(part.source, part.target, strict=True)
        ends = [(layout.node(s), layout.reader(t)) for s, t in pairs]
        fig.add_trace(
            go.Scatter(
                x=[(a[0] + b[0]) / 2 for a, b in ends],
                y=[(a[1] + b[1]) / 2 for a, b in ends],
                mode="markers",
                marker={"color": colour, "size": 6, "opacity": 0.6},
                name=READER_NAMES.get(kind, kind),
                hovertext=[
                    f"{plotly_text(e)}<br>score {s:.4g}"
                    for e, s in zip(part.edge, part.score, strict=True)
                ],
                hoverinfo="text",
            )
        )
    fig.add_trace(_nodes(layout))
    fig.add_trace(_ports(layout))
    fig.update_layout(
        template=theme(),
        title=_title(title, f"circuit: {len(chosen)} edges (width: |score|; dotted: negative)"),
        xaxis={"tickvals": _ticks(layout)[0], "ticktext": _ticks(layout)[1], "zeroline": False},
        yaxis={"visible": False, "autorange": "reversed"},
        height=max(350, 60 * layout.n_heads + 150),
        hovermode="closest",
    )
    return fig


def _nodes(layout: _Layout) -> go.Scatter:
    names = ["embed"]
    for layer in range(layout.n_layers):
        names += [f"L{layer}H{h}" for h in range(layout.n_heads)] + [f"MLP{layer}"]
    names.append("logits")
    points = [layout.node(n) for n in names]
    return go.Scatter(
        x=[p[0] for p in points],
        y=[p[1] for p in points],
        mode="markers+text",
        text=[plotly_text(n) for n in names],
        textposition="top center",
        marker={"color": "#ffffff", "size": 12, "line": {"color": "#333333", "width": 1}},
        hoverinfo="text",
        name="components",
    )


def _ports(layout: _Layout) -> go.Scatter:
    """Every reader's input port, coloured by its kind (a head's q, k and v on its left)."""
    names = []
    for layer in range(layout.n_layers):
        names += [f"L{layer}H{h}.q" for h in range(layout.n_heads)]
        for kind in ("k", "v"):
            names += [f"L{layer}H{h}.{kind}" for h in range(layout.n_heads // layout.group)]
        names.append(f"MLP{layer}")
    points = [layout.reader(n) for n in names]
    return go.Scatter(
        x=[p[0] for p in points],
        y=[p[1] for p in points],
        mode="markers",
        marker={"color": [READER_COLOURS[_parse(n)[0]] for n in names], "size": 5},
        hovertext=[plotly_text(f"{n} (input)") for n in names],
        hoverinfo="text",
        showlegend=False,
    )


def _ticks(layout: _Layout) -> tuple[list[float], list[str]]:
    values = [0.0] + [2.0 * layer + 1.5 for layer in range(layout.n_layers)]
    labels = ["embed"] + [f"layer {layer}" for layer in range(layout.n_layers)]
    return [*values, 2.0 * layout.n_layers + 1], [*labels, "logits"]


def faithfulness_curve(curve: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """The MIB curve (``fraction, n_edges, faithfulness``): faithfulness against the fraction
    of edges kept, on a log axis, with the full model (1) and the empty circuit (0) marked."""
    _require(curve, ["fraction", "n_edges", "faithfulness"], "faithfulness_curve")
    values = [None if not np.isfinite(v) else float(v) for v in curve["faithfulness"]]
    fig = go.Figure(
        go.Scatter(
            x=list(curve["fraction"]),
            y=values,
            mode="lines+markers",
            name="faithfulness",
            hovertext=[f"{n} edges" for n in curve["n_edges"]],
        )
    )
    for level in (0.0, 1.0):
        fig.add_hline(y=level, line={"color": "#999999", "dash": "dash", "width": 1})
    fig.update_layout(
        template=theme(),
        title=_title(title, "faithfulness of the top edges by |score|"),
        xaxis={"type": "log", "title": "fraction of edges kept"},
        yaxis={"title": "faithfulness"},
    )
    return fig
