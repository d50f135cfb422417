"""The page of ``interp graph``: an offline, self-contained explorer of one pruned attribution
graph, fast at any prompt length (a 1,000-token graph draws in well under a second: see
``benchmarks/bench_graph_page.py``).

Nodes sit by layer (rows, labelled in a column that stays at the left: logits on top, the
prompt's tokens at the bottom) and position (columns, labelled with the prompt's tokens); a
legend names the shapes and colours, and each logit node is labelled with its token and
probability. Edges are drawn with a width by ``|weight|`` and a colour by sign (blue positive,
red negative). The page opens at the left; it zooms the positions axis (ctrl + wheel or the
buttons) and pans (drag or scroll); it filters nodes by layer and position range and edges by
``|weight|`` and says how many edges it hides and why (filtered, or past the strongest
:data:`MAX_DRAWN_LINKS` drawn). Features are named for the transcoders' kind: a per-layer
transcoder's are "transcoder features", never "cross-layer" (the feature_type circuit-tracer's
``graph.json`` gives every feature). Clicking a node lists its strongest inputs and outputs, its
activation and influence, and for a feature the tokens it promotes and suppresses, its top
contexts (when a text was scanned) and the interventions that check its input edges. With
``interp graph --attention`` (links with ``heads``, the graph with ``qk``:
:mod:`interp.cli.graph_attention`) a drawn edge, or the "heads" button beside one in the
panel, lists the heads carrying it, and a head's button its strongest QK pairs at the positions
the edge joins. Nodes
picked (shift-click adds) can be grouped into named supernodes, which the "download
graph.json" button saves in ``qParams.supernodes`` of circuit-tracer's format.

The page follows :mod:`interp.pages.html`'s contract: the graph is one JSON data block
(:func:`interp.pages.assets.script_json`, never executed), one fixed script
(:mod:`interp.pages.graph_script`) draws it with DOM calls (text as ``textContent``), the
Content-Security-Policy allows exactly that script by hash and no network at all.
"""

from __future__ import annotations

import html

from interp.pages.assets import csp_hash, script_json
from interp.pages.graph_script import GRAPH_JS
from interp.pages.style import _CSP, _STYLE

__all__ = ["FEATURE_NAMES", "MAX_DRAWN_LINKS", "MAX_PAGE_BYTES", "graph_page"]

MAX_PAGE_BYTES = 4_000_000  # the page's budget: links past it are left out of the page only
MAX_DRAWN_LINKS = 4000  # edges drawn as lines (the strongest shown); every link is in the panels
FEATURE_NAMES = {  # a transcoder set's kind -> what the page calls its features
    "per-layer": "transcoder feature (per-layer)",
    "cross-layer": "cross-layer transcoder feature",
}

_EXTRA_STYLE = """
main { max-width: none; }
.interp-graph-wrap { display: flex; gap: 16px; align-items: flex-start; }
.interp-graph-main { flex: 1 1 auto; min-width: 0; }
#interp-graph { overflow: auto; border: 1px solid #d0d7de; max-height: 80vh; cursor: grab; }
#interp-graph-overview { height: 26px; margin-bottom: 4px; }
.interp-graph-overview { display: block; cursor: pointer; }
.interp-graph-overview-bar { fill: #f59e0b; }
.interp-graph-overview-frame { fill: rgba(37, 99, 235, 0.08); stroke: #2563eb; stroke-width: 1; }
#interp-graph.interp-dragging { cursor: grabbing; user-select: none; }
.interp-graph-inner { display: flex; width: max-content; }
.interp-graph-rows { position: sticky; left: 0; z-index: 1; flex: 0 0 auto;
                     border-right: 1px solid #d0d7de; }
.interp-graph-band { fill: #ffffff; }
.interp-graph-band-alt { fill: #f6f8fa; }
#interp-graph-panel { width: 380px; flex: 0 0 380px; font-size: 0.9em; max-height: 80vh;
                      overflow: auto; }
#interp-graph-panel h2 { font-size: 1.05em; margin-top: 0; }
#interp-graph-panel h3 { font-size: 0.95em; margin: 0.8em 0 0.2em; }
.interp-graph-node { cursor: pointer; stroke: #1f2328; stroke-width: 0.6; }
.interp-graph-node:hover { stroke-width: 2; }
.interp-graph-node.interp-picked { stroke: #000; stroke-width: 3; }
.interp-graph-node.interp-grouped { stroke-dasharray: 2 2; stroke: #7c3aed; stroke-width: 2.5; }
.interp-graph-edge { vector-effect: non-scaling-stroke; stroke-opacity: 0.45;
                     pointer-events: none; }
.interp-graph-edge.interp-on { stroke-opacity: 0.95; }
.interp-graph-edge.interp-clickable { pointer-events: visibleStroke; cursor: pointer; }
.interp-graph-edge.interp-off { stroke-opacity: 0.08; }
.interp-graph-row { font: 600 11px ui-monospace, monospace; fill: #57606a; }
.interp-graph-token, .interp-graph-logit-label { font: 11px ui-monospace, monospace;
                                                 white-space: pre; }
.interp-graph-token { fill: #57606a; }
.interp-graph-logit-label { fill: #1f2328; pointer-events: none; }
.interp-graph-tip { position: absolute; display: none; pointer-events: none; z-index: 5;
                    background: #1f2328; color: #fff; font: 12px ui-monospace, monospace;
                    padding: 3px 6px; border-radius: 4px; white-space: pre; }
.interp-graph-list { padding-left: 1.2em; margin: 0.2em 0; }
.interp-pos { color: #2563eb; font-variant-numeric: tabular-nums; }
.interp-neg { color: #dc2626; font-variant-numeric: tabular-nums; }
.interp-graph-tools { margin: 0.4em 0; }
.interp-graph-controls { display: flex; flex-wrap: wrap; gap: 6px 18px; align-items: center;
                         margin: 0.6em 0 0.2em; font-size: 0.9em; }
.interp-graph-controls input[type=number] { width: 5.5em; }
.interp-graph-controls input[type=range] { vertical-align: middle; width: 10em; }
#interp-zoom-level, #interp-weight-value { display: inline-block; min-width: 3.5em;
                                           font-variant-numeric: tabular-nums; }
#interp-graph-status { margin: 0.2em 0 0.4em; }
.interp-graph-legend { display: flex; flex-wrap: wrap; gap: 4px 16px; font-size: 0.85em;
                       color: #57606a; margin: 0.2em 0 0.6em; }
.interp-graph-legend span { display: inline-flex; align-items: center; gap: 5px; }
.interp-heads-button, .interp-head { margin-left: 6px; font-size: 0.85em; padding: 0 4px; }
"""

_CONTROLS = (
    '<div class="interp-graph-controls">'
    '<span>zoom <button id="interp-zoom-out" type="button" title="zoom out">\u2212</button> '
    '<span id="interp-zoom-level">100%</span> '
    '<button id="interp-zoom-in" type="button" title="zoom in">+</button> '
    '<button id="interp-zoom-fit" type="button">fit width</button> '
    '<button id="interp-zoom-one" type="button">100%</button></span>'
    '<span><label>layers <select id="interp-layer-lo"></select></label> to '
    '<select id="interp-layer-hi" aria-label="last layer"></select></span>'
    '<span><label>positions <input id="interp-pos-lo" type="number" min="0" value="0"></label>'
    ' to <input id="interp-pos-hi" type="number" min="0" aria-label="last position"></span>'
    '<span><label>|weight| <input id="interp-weight" type="range" min="0" max="100" '
    'value="0"></label> <span id="interp-weight-value"></span></span>'
    '<button id="interp-filter-reset" type="button">show all</button></div>\n'
    '<p id="interp-graph-status" class="interp-note" aria-live="polite"></p>\n'
)


def _swatch(shape: str, colour: str) -> str:
    if shape == "circle":
        inner = f'<circle cx="8" cy="8" r="6" fill="{colour}" stroke="#1f2328" stroke-width="0.6"/>'
    elif shape == "line":
        inner = f'<line x1="1" y1="8" x2="21" y2="8" stroke="{colour}" stroke-width="3"/>'
    else:
        inner = (
            f'<rect x="2" y="2" width="12" height="12" fill="{colour}" stroke="#1f2328" '
            'stroke-width="0.6"/>'
        )
    width = 22 if shape == "line" else 16
    return f'<svg width="{width}" height="16" aria-hidden="true">{inner}</svg>'


def _legend(feature_name: str) -> str:
    items = [
        ("circle", "#f59e0b", feature_name),
        ("rect", "#9ca3af", "error node (what the transcoder misses)"),
        ("rect", "#10b981", "token (embedding)"),
        ("rect", "#8b5cf6", "logit (labelled: token and probability)"),
        ("line", "#2563eb", "positive weight"),
        ("line", "#dc2626", "negative weight (width: |weight|)"),
    ]
    spans = "".join(f"<span>{_swatch(s, c)}{_esc(text)}</span>" for s, c, text in items)
    return f'<div class="interp-graph-legend" id="interp-graph-legend">{spans}</div>\n'


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def graph_page(
    graph_json: dict,
    details: dict[str, dict],
    *,
    title: str,
    n_layers: int,
    info: list[str],
    reading: list[str] = (),
    max_bytes: int = MAX_PAGE_BYTES,
    transcoder_kind: str = "per-layer",
) -> str:
    """The explorer page of circuit-tracer frontend JSON ``graph_json``.

    Args:
        transcoder_kind: the transcoders' ``kind`` (``"per-layer"`` or ``"cross-layer"``): what
            the page calls the features (:data:`FEATURE_NAMES`).
        details: per feature ``"{layer}_{feature}"``: ``promoted`` / ``suppressed``
            (``[token, effect]`` pairs) and optionally ``contexts`` (:mod:`interp.graphs.details`).
        info: lines of plain text shown above the graph (model, prompt, sizes, scores).
        reading: sentences on what the graph says (:func:`interp.graphs.reading.read_prediction`),
            shown under "What the graph says".
        max_bytes: the page's size budget; links past it are left out of the page (not of
            ``graph.json``) and the page says how many.
    """
    if transcoder_kind not in FEATURE_NAMES:
        raise ValueError(
            f"transcoder_kind must be one of {sorted(FEATURE_NAMES)}, got {transcoder_kind!r}"
        )
    data = {
        "graph": graph_json,
        "details": details,
        "n_layers": int(n_layers),
        "max_drawn_links": MAX_DRAWN_LINKS,
        "feature_name": FEATURE_NAMES[transcoder_kind],
    }
    links = graph_json["links"]  # by descending |weight|: the weakest go first
    keep = len(links)
    while True:
        trial = {**data, "graph": {**graph_json, "links": links[:keep]}}
        page = _render(trial, title, info, reading, len(graph_json["nodes"]), len(links), max_bytes)
        if len(page.encode("utf-8")) <= max_bytes or keep == 0:
            return page
        keep = keep * 3 // 4


def _reading(sentences) -> str:
    if not sentences:
        return ""
    items = "".join(f"<li>{_esc(s)}</li>" for s in sentences)
    return f'<h2>What the graph says</h2>\n<ul class="interp-graph-reading">{items}</ul>\n'


def _render(data: dict, title, info, reading, n_nodes: int, n_links: int, budget: int) -> str:
    lines = list(info)
    kept = len(data["graph"]["links"])
    lines.append(
        f"{n_nodes:,} nodes and {n_links:,} kept edges; at most the strongest "
        f"{MAX_DRAWN_LINKS:,} of those shown are drawn (every edge is listed in a clicked "
        "node's panel)."
    )
    if kept < n_links:
        lines.append(
            f"The weakest {n_links - kept} edges are left out of this page to keep it under "
            f"{budget:,} bytes (and out of its download); graph.json and edges.csv hold every "
            "kept edge."
        )
    csp = _CSP.format(hashes=csp_hash(GRAPH_JS))
    help_text = (
        "Drag or scroll to pan; ctrl + wheel (or the zoom buttons) zooms the positions. Click "
        "a node for its inputs, outputs and details; shift-click adds nodes to the selection. "
        "Name the selection and group it into a supernode; download graph.json to keep the "
        "groups (circuit-tracer's format, qParams.supernodes)."
    )
    if data["graph"].get("qk") is not None:  # interp graph --attention
        help_text += (
            ' Click a drawn edge, or the "heads" button beside one in a node\'s panel, for the '
            "heads "
            "carrying it (its head loadings); click a head for its strongest QK pairs at the "
            "positions the edge joins (query: the target's, key: the source's)."
        )
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n',
            f'<meta http-equiv="Content-Security-Policy" content="{_esc(csp)}">\n',
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
            '<meta name="generator" content="interp">\n',
            f"<title>{_esc(title)}</title>\n<style>\n{_STYLE}\n{_EXTRA_STYLE}</style>\n</head>\n",
            f"<body>\n<main>\n<h1>{_esc(title)}</h1>\n",
            f"<p>{_esc(chr(10).join(lines))}</p>\n",
            _reading(reading),
            f'<p class="interp-note">{_esc(help_text)}</p>\n',
            '<div class="interp-graph-tools"><label>supernode name '
            '<input id="interp-group-name" type="text" maxlength="80"></label> '
            '<button id="interp-group" type="button">group selected</button> '
            '<button id="interp-save" type="button">download graph.json</button>'
            '<ul id="interp-supernodes"></ul></div>\n',
            _CONTROLS,
            _legend(data["feature_name"]),
            '<div class="interp-graph-wrap"><div class="interp-graph-main">'
            '<div id="interp-graph-overview"></div><div id="interp-graph"></div></div>'
            '<aside id="interp-graph-panel"><p>Click a node.</p></aside></div>\n',
            '<script type="application/json" id="interp-graph-data">',
            script_json(data),
            "</script>\n</main>\n",
            f"<script>{GRAPH_JS}</script>\n</body>\n</html>\n",
        ]
    )
