"""The page of ``interp graph``: an offline, self-contained explorer of one pruned attribution
graph.

Nodes sit by layer (rows: logits on top, the prompt's tokens at the bottom) and position
(columns, labelled with the prompt's tokens); edges are drawn with a width by ``|weight|`` and
a colour by sign (blue positive, red negative). Clicking a node lists its strongest inputs and
outputs, its activation and influence, and for a feature the tokens it promotes and
suppresses, its top contexts (when a text was scanned) and the interventions that check its
input edges. Nodes picked (shift-click adds) can be grouped into named supernodes, which the
"download graph.json" button saves in ``qParams.supernodes`` of circuit-tracer's format.

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

__all__ = ["MAX_DRAWN_LINKS", "MAX_PAGE_BYTES", "graph_page"]

MAX_PAGE_BYTES = 4_000_000  # the page's budget: links past it are left out of the page only
MAX_DRAWN_LINKS = 4000  # edges drawn as lines (the strongest); every link is in the panels

_EXTRA_STYLE = """
main { max-width: none; }
.interp-graph-wrap { display: flex; gap: 16px; align-items: flex-start; }
#interp-graph { overflow: auto; border: 1px solid #d0d7de; max-height: 80vh; flex: 1 1 auto; }
#interp-graph-panel { width: 380px; flex: 0 0 380px; font-size: 0.9em; max-height: 80vh;
                      overflow: auto; }
#interp-graph-panel h2 { font-size: 1.05em; }
#interp-graph-panel h3 { font-size: 0.95em; margin: 0.8em 0 0.2em; }
.interp-graph-node { cursor: pointer; stroke: #1f2328; stroke-width: 0.6; }
.interp-graph-node.interp-picked { stroke: #000; stroke-width: 3; }
.interp-graph-node.interp-grouped { stroke-dasharray: 2 2; stroke: #7c3aed; stroke-width: 2.5; }
.interp-graph-row, .interp-graph-token { font: 11px ui-monospace, monospace; fill: #57606a;
                                         white-space: pre; }
.interp-graph-list { padding-left: 1.2em; margin: 0.2em 0; }
.interp-pos { color: #2563eb; font-variant-numeric: tabular-nums; }
.interp-neg { color: #dc2626; font-variant-numeric: tabular-nums; }
.interp-graph-tools { margin: 0.6em 0; }
"""


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
) -> str:
    """The explorer page of circuit-tracer frontend JSON ``graph_json``.

    Args:
        details: per feature ``"{layer}_{feature}"``: ``promoted`` / ``suppressed``
            (``[token, effect]`` pairs) and optionally ``contexts`` (:mod:`interp.graphs.details`).
        info: lines of plain text shown above the graph (model, prompt, sizes, scores).
        reading: sentences on what the graph says (:func:`interp.graphs.reading.read_prediction`),
            shown under "What the graph says".
        max_bytes: the page's size budget; links past it are left out of the page (not of
            ``graph.json``) and the page says how many.
    """
    data = {
        "graph": graph_json,
        "details": details,
        "n_layers": int(n_layers),
        "max_drawn_links": MAX_DRAWN_LINKS,
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
        f"{n_nodes} nodes and {n_links} kept edges; the strongest "
        f"{min(kept, MAX_DRAWN_LINKS)} are drawn."
    )
    if kept < n_links:
        lines.append(
            f"The weakest {n_links - kept} edges are left out of this page to keep it under "
            f"{budget:,} bytes (and out of its download); graph.json and edges.csv hold every "
            "kept edge."
        )
    csp = _CSP.format(hashes=csp_hash(GRAPH_JS))
    help_text = (
        "Click a node for its inputs, outputs and details; shift-click adds nodes to the "
        "selection. Name the selection and group it into a supernode; download graph.json to "
        "keep the groups (circuit-tracer's format, qParams.supernodes)."
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
            '<div class="interp-graph-wrap"><div id="interp-graph"></div>'
            '<aside id="interp-graph-panel"><p>Click a node.</p></aside></div>\n',
            '<script type="application/json" id="interp-graph-data">',
            script_json(data),
            "</script>\n</main>\n",
            f"<script>{GRAPH_JS}</script>\n</body>\n</html>\n",
        ]
    )
