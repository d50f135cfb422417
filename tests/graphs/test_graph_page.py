"""The graph's files and page: circuit-tracer's frontend JSON equals the pruned graph (every
kept edge, its raw weight, ids that never collide), the page stays in its size budget, keeps
hostile token text as text, and in a real browser draws every node, lists a clicked node's
edges and details, and groups nodes into supernodes that the saved JSON keeps."""

from __future__ import annotations

import html
import json
import re

import pandas as pd
import pytest
import torch

from interp.graphs.attribute import attribution_graph
from interp.graphs.frontend import frontend_json, node_ids
from interp.pages.assets import csp_hash
from interp.pages.graph import graph_page
from interp.pages.graph_script import GRAPH_JS
from tests.test_browser import ARTIFACTS, PWNED
from tests.transcoder_folders import random_transcoders

# the fields of circuit-tracer 0.5's frontend Node and Metadata (frontend/graph_models.py)
NODE_FIELDS = {
    "node_id", "feature", "layer", "ctx_idx", "feature_type", "token_prob", "is_target_logit",
    "run_idx", "reverse_ctx_idx", "jsNodeId", "clerp", "influence", "activation",
}  # fmt: skip
METADATA_FIELDS = {
    "slug", "scan", "transcoder_list", "prompt_tokens", "prompt", "node_threshold",
    "schema_version",
}  # fmt: skip


@pytest.fixture(scope="module")
def pruned(neox_model):
    tc = random_transcoders(neox_model, d_tc=32)
    tokens = torch.tensor([0, 5, 17, 230, 5, 17, 99, 12])
    graph = attribution_graph(neox_model, tokens, tc)
    return graph, graph.prune(0.8, 0.98), tc


def _json(pruned, tokens=None, logits=None, **kwargs):
    graph, small, tc = pruned
    tokens = tokens or [f"t{i}" for i in range(len(graph.tokens))]
    logits = logits or [f"l{i}" for i in range(len(graph.logit_token_ids))]
    return frontend_json(
        small, tokens, logits, prompt="p", slug="s", scan=tc.name, n_layers=tc.n_layers, **kwargs
    )


def test_the_frontend_json_holds_every_kept_edge_with_its_raw_weight(pruned):
    graph, small, tc = pruned
    data = _json(pruned, node_threshold=0.8)
    assert set(data["metadata"]) == METADATA_FIELDS
    assert all(set(n) == NODE_FIELDS for n in data["nodes"])
    ids = [n["node_id"] for n in data["nodes"]]
    assert len(set(ids)) == len(ids) == len(small.nodes)
    # the viewer's ids (jsNodeId): a feature's is shared by its positions (checked below),
    # every other node's is its own (in the graph pruned at 1.0: a layer's errors at several
    # positions)
    everything = _json((graph, graph.prune(1.0, 1.0), tc))["nodes"]
    others = [n["jsNodeId"] for n in everything if n["feature_type"] != "cross layer transcoder"]
    errors = [n["layer"] for n in everything if n["feature_type"].endswith("error")]
    assert max(errors.count(layer) for layer in errors) >= 2
    assert len(set(others)) == len(others)
    index = {node_id: i for i, node_id in enumerate(ids)}
    assert len(data["links"]) == int(small.kept_edges.sum())
    for link in data["links"]:
        t, s = index[link["target"]], index[link["source"]]
        assert small.kept_edges[t, s]
        assert link["weight"] == float(small.adjacency[t, s])  # the same float32, unchanged
    kinds = small.nodes["kind"].tolist()
    for node, kind, row in zip(data["nodes"], kinds, small.nodes.itertuples(), strict=True):
        assert node["influence"] == pytest.approx(float(row.influence), rel=1e-12)
        if kind == "feature":
            x, y = int(row.layer), int(row.feature)
            assert node["feature"] == (x + y) * (x + y + 1) // 2 + y  # circuit-tracer's pairing
            assert node["jsNodeId"] == f"{x}_{y}-0"
            assert node["activation"] == pytest.approx(float(row.activation), rel=1e-12)
        if kind == "logit":
            assert (
                node["layer"] == str(tc.n_layers + 1) and node["ctx_idx"] == len(graph.tokens) - 1
            )
    targets = [n["is_target_logit"] for n in data["nodes"]]
    assert sum(targets) == 1 and data["nodes"][kinds.index("logit")]["is_target_logit"]
    assert data["qParams"]["supernodes"] == []


def test_node_ids_never_collide_where_circuit_tracer_s_do():
    """circuit-tracer names the error node of layer 1 at position 3 ``0_1_3``: the id of
    feature 1 of layer 0 at position 3. Here they differ."""
    nodes = pd.DataFrame(
        {
            "kind": ["feature", "feature", "error", "token", "logit"],
            "layer": [0, 1, 1, -1, 2],
            "pos": [3, 3, 3, 3, 3],
            "feature": [1, 3, -1, -1, -1],
            "token_id": [7, 7, 7, 7, 9],
        }
    )
    ids = node_ids(nodes, n_layers=2)
    assert len(set(ids)) == 5
    assert f"0_{1}_{3}" == ids[0]  # circuit-tracer's error id would be this feature's


def test_supernodes_are_kept_and_unknown_nodes_refused(pruned):
    ids = [n["node_id"] for n in _json(pruned)["nodes"]]
    data = _json(pruned, supernodes=[["group", ids[0], ids[1]]])
    assert data["qParams"]["supernodes"] == [["group", ids[0], ids[1]]]
    with pytest.raises(ValueError, match="not in the graph"):
        _json(pruned, supernodes=[["group", "nope"]])


def _page(pruned, tokens=None, logits=None, details=None, **kwargs):
    data = _json(pruned, tokens=tokens, logits=logits)
    page = graph_page(
        data, details or {}, title="t <b>", n_layers=pruned[2].n_layers, info=["x"], **kwargs
    )
    return data, page


def test_the_page_runs_one_script_allowed_by_hash_and_keeps_hostile_text_as_data(pruned):
    graph = pruned[0]
    tokens = [PWNED[i % len(PWNED)] for i in range(len(graph.tokens))]
    _, page = _page(pruned, tokens=tokens, logits=[PWNED[0]] * len(graph.logit_token_ids))
    scripts = re.findall(r"<script(?: [^>]*)?>", page)
    assert scripts == ['<script type="application/json" id="interp-graph-data">', "<script>"]
    assert html.escape(csp_hash(GRAPH_JS)) in page and "connect-src &#x27;none&#x27;" in page
    assert page.count("</script>") == 2  # the hostile '</script>' is escaped in the data
    assert "<img" not in page and "<svg onload" not in page and "<b>" not in page


def test_a_page_over_its_budget_leaves_the_weakest_links_out_and_says_so(pruned):
    data, full = _page(pruned)
    n_links = len(data["links"])
    budget = len(full.encode()) - 2000
    _, page = _page(pruned, max_bytes=budget)
    assert len(page.encode()) <= budget
    kept = json.loads(re.search(r'id="interp-graph-data">(.*?)</script>', page, re.S).group(1))[
        "graph"
    ]["links"]
    assert 0 < len(kept) < n_links and kept == data["links"][: len(kept)]  # the strongest
    assert f"The weakest {n_links - len(kept)} edges are left out" in page


def test_features_are_named_for_the_transcoders_kind(pruned):
    _, per_layer = _page(pruned)
    _, cross = _page(pruned, transcoder_kind="cross-layer")
    legend = re.compile(r'id="interp-graph-legend">(.*?)</div>', re.S)
    assert "transcoder feature (per-layer)" in legend.search(per_layer).group(1)
    assert "cross" not in legend.search(per_layer).group(1)
    assert "cross-layer transcoder feature" in legend.search(cross).group(1)
    with pytest.raises(ValueError, match="transcoder_kind must be one of"):
        _page(pruned, transcoder_kind="crosscoder")


READY = "document.body.dataset.ready === '1'"


@pytest.mark.browser
def test_the_explorer_draws_clicks_and_groups_offline(browser, pruned, tmp_path):
    graph, small, _ = pruned
    tokens = [PWNED[i % len(PWNED)] for i in range(len(graph.tokens))]
    data, page = _page(
        pruned,
        tokens=tokens,
        details={
            f"{int(r.layer)}_{int(r.feature)}": {
                "promoted": [[PWNED[1], 1.5]],
                "suppressed": [[PWNED[0], -1.0]],
                "contexts": [{"tokens": [PWNED[2], "b"], "acts": [0.5, 2.0], "mark": 1}],
            }
            for r in small.nodes[small.nodes["kind"] == "feature"].itertuples()
        },
    )
    path = tmp_path / "graph.html"
    path.write_text(page, encoding="utf-8")
    feature = next(n["node_id"] for n in data["nodes"] if n["feature_type"].startswith("cross"))
    logit = next(n["node_id"] for n in data["nodes"] if n["feature_type"] == "logit")
    checks = {
        "nodes": "document.querySelectorAll('.interp-graph-node').length",
        "edges": "document.querySelectorAll('.interp-graph-edge').length",
        "token_labels": "[...document.querySelectorAll('.interp-graph-token title')]"
        ".map(t => t.textContent)",
        "panel": f"(window.interpGraph.select({json.dumps(feature)}, false),"
        " document.getElementById('interp-graph-panel').textContent)",
        "grouped": f"(window.interpGraph.select({json.dumps(logit)}, true),"
        " document.getElementById('interp-group-name').value = 'my group',"
        " document.getElementById('interp-group').click(),"
        " JSON.parse(window.interpGraph.json()).qParams.supernodes)",
        "listed": "document.getElementById('interp-supernodes').textContent",
        "pwned": "typeof window.__pwned",
        "on_attributes": "[...document.querySelectorAll('*')].filter(e => [...e.attributes]"
        ".some(a => a.name.startsWith('on'))).length",
        "foreign": "document.querySelectorAll('img, iframe, object, embed, form, a').length",
    }
    result = browser.open(path, ready_js=READY, checks=checks, screenshot=ARTIFACTS / "graph.png")
    v = result.values
    assert v["ready"], v
    assert result.exceptions == [] and result.errors == [] and result.dialogs == []
    assert result.network_requests() == []
    assert v["pwned"] == "undefined" and v["on_attributes"] == 0 and v["foreign"] == 0
    assert v["nodes"] == len(data["nodes"]) and v["edges"] == len(data["links"])
    visible = {" ": "\u00b7", "\n": "\u23ce", "\t": "\u21e5"}

    def shown(text: str) -> str:  # whitespace drawn visibly, as the page does
        return "".join(visible.get(c, c) for c in text)

    assert v["token_labels"] == [f"position {p}: {shown(t)}" for p, t in enumerate(tokens)]
    assert (
        shown(PWNED[1]) in v["panel"]
        and "strongest inputs" in v["panel"]
        and "promotes" in v["panel"]
    )
    assert v["grouped"] == [["my group", feature, logit]]
    assert "my group" in v["listed"]


def test_feature_details_match_the_weights(neox_model):
    from interp.graphs.details import feature_details

    tc = random_transcoders(neox_model, d_tc=32)
    text = neox_model.tokenizer.decode(list(range(1, 400)) * 3)
    got = feature_details(neox_model, tc, [(0, 1), (1, 2)], texts=[text], n_tokens=600)
    W_U = neox_model.W_U.detach().double()
    W_U = W_U - W_U.mean(dim=1, keepdim=True)
    for (layer, f), d in got.items():
        effect = tc.W_dec(layer)[f].double() @ W_U  # float64 here, float32 in the library
        top = effect.topk(8)
        assert [t for t, _ in d["promoted"]] == [
            neox_model.tokenizer.decode([i]) for i in top.indices
        ]
        assert [v for _, v in d["promoted"]] == pytest.approx(top.values.tolist(), abs=1e-5)
        low = (-effect).topk(8)
        assert [v for _, v in d["suppressed"]] == pytest.approx((-low.values).tolist(), abs=1e-5)
        marks = [c["acts"][c["mark"]] for c in d["contexts"]]
        assert marks == sorted(marks, reverse=True) and all(m > 0 for m in marks)


# -- the page at any size: synthetic graphs of 19, 94 and 1,000 positions, 12 layers ---------

SIZES = [19, 94, 1000]
N_LAYERS = 12
BOX = "document.getElementById('interp-graph')"
STATUS = "document.getElementById('interp-graph-status').textContent"
SHOWN_NODES = (
    "[...document.querySelectorAll('.interp-graph-node')].filter(e => e.style.display !== 'none')"
    ".map(e => e.dataset.id).sort()"
)


def _shown(text: str) -> str:  # whitespace drawn visibly, as the page does
    return "".join({" ": "\u00b7", "\n": "\u23ce", "\t": "\u21e5"}.get(c, c) for c in text)


def _set(**controls) -> str:
    """JS: set filter controls (id suffix -> value), fire one input event, read the result."""
    sets = "".join(
        f"document.getElementById('interp-{k.replace('_', '-')}').value = {json.dumps(str(v))}, "
        for k, v in controls.items()
    )
    return (
        f"({sets}document.getElementById('interp-weight').dispatchEvent(new Event('input')), "
        f"[{STATUS}, {SHOWN_NODES}, document.querySelectorAll('.interp-graph-edge').length])"
    )


def _expected(data, max_drawn, layers=(0, N_LAYERS - 1), positions=None, min_w=0.0):
    """What the filters should show: (shown node ids, drawn, hidden by weight, by filter,
    past the drawn cap), computed here from the data."""
    n_pos = len(data["metadata"]["prompt_tokens"])
    lo, hi = positions or (0, n_pos - 1)

    def visible(n):
        if n["feature_type"] == "logit":
            return True
        if not lo <= n["ctx_idx"] <= hi:
            return False
        return n["feature_type"] == "embedding" or layers[0] <= int(n["layer"]) <= layers[1]

    seen = {n["node_id"]: visible(n) for n in data["nodes"]}
    drawn = weight = filtered = cap = 0
    for link in data["links"]:
        if abs(link["weight"]) < min_w:
            weight += 1
        elif not (seen[link["source"]] and seen[link["target"]]):
            filtered += 1
        elif drawn >= max_drawn:
            cap += 1
        else:
            drawn += 1
    return sorted(k for k, v in seen.items() if v), drawn, weight, filtered, cap


def _counts(status: str) -> dict[str, int]:
    """The numbers the page's status line says."""
    number = r"([\d,]+)"
    found = {
        "drawn": re.search(rf"Drawing {number} of", status),
        "weight": re.search(rf"{number} below \|weight\|", status),
        "filter": re.search(rf"{number} at a layer or position filtered out", status),
        "cap": re.search(rf"{number} past the", status),
    }
    return {k: int(m.group(1).replace(",", "")) if m else 0 for k, m in found.items()}


@pytest.mark.browser
@pytest.mark.parametrize("n_pos", SIZES)
def test_the_page_at_any_size_starts_left_labelled_zooms_pans_and_filters(browser, tmp_path, n_pos):
    from interp.pages.graph import MAX_DRAWN_LINKS
    from tests.graphs.synthetic_graph import synthetic_graph_json

    tokens = [PWNED[i % len(PWNED)] if i % 7 == 3 else f" w{i}" for i in range(n_pos)]
    data = synthetic_graph_json(n_pos, n_layers=N_LAYERS, tokens=tokens, seed=n_pos)
    page = graph_page(data, {}, title=f"{n_pos} tokens", n_layers=N_LAYERS, info=["synthetic"])
    in_page = json.loads(re.search(r'id="interp-graph-data">(.*?)</script>', page, re.S).group(1))
    data = in_page["graph"]  # the links the page kept (all of them under its budget)
    path = tmp_path / "graph.html"
    path.write_text(page, encoding="utf-8")
    max_w = abs(data["links"][0]["weight"])
    logits = [n for n in data["nodes"] if n["feature_type"] == "logit"]
    first = next(n["node_id"] for n in data["nodes"] if n["ctx_idx"] == 0)
    feature = next(n for n in data["nodes"] if n["feature_type"] == "cross layer transcoder")
    layer, index = feature["node_id"].split("_")[:2]
    feature_label = f"L{layer} F{index} @{feature['ctx_idx']}"
    feature = feature["node_id"]
    node_x = "(id => document.querySelector(`.interp-graph-node[data-id='${id}']`)" \
        ".getBoundingClientRect().x)"  # fmt: skip
    span = f"({node_x}({json.dumps(logits[0]['node_id'])}) - {node_x}({json.dumps(first)}))"
    checks = {
        "scroll_left": f"{BOX}.scrollLeft",
        "rows": "[...document.querySelectorAll('.interp-graph-rows text')].map(t => t.textContent)",
        "first_in_view": f"(r => r.x >= {BOX}.getBoundingClientRect().x + 64 && r.right <= "
        f"{BOX}.getBoundingClientRect().right)(document.querySelector("
        f"`.interp-graph-node[data-id='{first}']`).getBoundingClientRect())",
        "legend": "document.getElementById('interp-graph-legend').textContent",
        "text": "document.body.innerText",
        "logit_labels": "[...document.querySelectorAll('.interp-graph-logit-label')]"
        ".map(t => t.textContent)",
        "status": STATUS,
        "edges": "document.querySelectorAll('.interp-graph-edge').length",
        "zoom": f"(z => [z, {span}, (interpGraph.zoom(z * 2), {span}), interpGraph.zoom(z)])"
        "(interpGraph.zoom())",
        "wheel": f"({BOX}.dispatchEvent(new WheelEvent('wheel', {{deltaY: -200, ctrlKey: true, "
        "clientX: 300, bubbles: true, cancelable: true})), interpGraph.zoom())",
        "rows_stay": f"(b => (b.scrollLeft = 300, Math.round(document.querySelector("
        f"'.interp-graph-rows').getBoundingClientRect().x - b.getBoundingClientRect().x)))({BOX})",
        "drag": f"(b => {{ b.scrollLeft = 0; b.dispatchEvent(new MouseEvent('mousedown', "
        "{clientX: 600, clientY: 500, button: 0, bubbles: true})); window.dispatchEvent("
        "new MouseEvent('mousemove', {clientX: 480, clientY: 500})); window.dispatchEvent("
        "new MouseEvent('mouseup', {})); return [b.scrollLeft, b.scrollWidth - b.clientWidth]; "
        f"}})({BOX})",
        "overview": f"(b => {{ b.scrollLeft = 0; const o = document.querySelector("
        "'.interp-graph-overview'), r = o.getBoundingClientRect(); o.dispatchEvent(new "
        "MouseEvent('mousedown', {clientX: r.right - 1, clientY: r.y + 5, bubbles: true})); "
        "window.dispatchEvent(new MouseEvent('mouseup', {})); return [b.scrollLeft, "
        "b.scrollWidth - b.clientWidth, document.querySelectorAll('.interp-graph-overview-bar')"
        f".length]; }})({BOX})",
        "click": "(e => { e.dispatchEvent(new MouseEvent('mouseover', {bubbles: true})); "
        "e.dispatchEvent(new MouseEvent('click', {bubbles: true})); const seen = [document"
        ".querySelector('.interp-graph-tip').textContent, document.getElementById("
        "'interp-graph-panel').textContent]; e.dispatchEvent(new MouseEvent('mouseout', "
        f"{{bubbles: true}})); return seen; }})(document.querySelector("
        f"`.interp-graph-node[data-id='{feature}']`))",
        "by_layer": _set(layer_lo=3, layer_hi=8),
        "by_position": _set(layer_lo=0, layer_hi=N_LAYERS - 1, pos_lo=n_pos // 2, pos_hi=n_pos),
        "by_weight": _set(pos_lo=0, pos_hi=n_pos - 1, weight=75),
        "reset": f"(document.getElementById('interp-filter-reset').click(), interpGraph.home(), "
        f"{STATUS})",
        "ready_ms": "Number(document.body.dataset.readyMs)",
    }
    result = browser.open(
        path,
        ready_js=READY,
        checks=checks,
        screenshot=ARTIFACTS / f"graph-{n_pos}-tokens.png",
        width=1400,
    )
    v = result.values
    assert v["ready"], v
    assert result.exceptions == [] and result.errors == [] and result.dialogs == []
    assert result.network_requests() == []
    # it starts at the left with its rows labelled, and the labels stay when it pans
    assert v["scroll_left"] == 0 and v["first_in_view"] is True
    assert v["rows"] == ["logits", *[f"L{i}" for i in reversed(range(N_LAYERS))], "tokens"]
    assert v["rows_stay"] in (0, 1)  # the label column sits at the box's left edge
    # a legend for shapes and colours; per-layer features are never called cross-layer
    for words in ("transcoder feature (per-layer)", "error node", "token", "logit", "positive",
                  "negative"):  # fmt: skip
        assert words in v["legend"], words
    assert not re.search(r"cross.layer", v["text"], re.I)
    # logit nodes labelled with their token and probability
    parts = [re.fullmatch(r'Output "(.*)" \(p=(.*)\)', n["clerp"], re.S).groups() for n in logits]
    want = [f"\u201c{_shown(token)}\u201d {p}" for token, p in parts]
    assert v["logit_labels"] == want
    # zoom doubles the distance between two columns; ctrl + wheel zooms in
    z0, before, after, _ = v["zoom"]
    assert after == pytest.approx(2 * before, rel=0.02, abs=1.0)
    assert v["wheel"] > z0
    # drag pans (as far as there is room)
    scrolled, room = v["drag"]
    assert scrolled == min(120, room)
    # the overview has a bar at each position with nodes (tokens aside); its right end goes
    # to the end
    scrolled, room, bars = v["overview"]
    assert scrolled == room and (room > 0 or n_pos < 1000)
    assert bars == len({n["ctx_idx"] for n in data["nodes"] if n["feature_type"] != "embedding"})
    # hovering a node names it; clicking it fills the panel
    tip, panel = v["click"]
    assert tip.startswith(feature_label) and panel.startswith(feature_label)
    assert "kind: transcoder feature (per-layer)" in panel and "strongest inputs" in panel
    # every edge drawn or counted as hidden, and why
    _, drawn, *_, cap = _expected(data, MAX_DRAWN_LINKS)
    assert _counts(v["status"]) == {"drawn": drawn, "weight": 0, "filter": 0, "cap": cap}
    assert v["edges"] == drawn == min(len(data["links"]), MAX_DRAWN_LINKS)
    if n_pos == 1000:
        assert cap > 0 and f"{cap:,} past the {MAX_DRAWN_LINKS:,} strongest drawn" in v["status"]
    cases = {
        "by_layer": {"layers": (3, 8)},
        "by_position": {"positions": (n_pos // 2, n_pos - 1)},
        "by_weight": {"min_w": max_w * 10 ** ((75 - 100) / 25)},
    }
    for name, kwargs in cases.items():
        status, shown, n_edges = v[name]
        ids, drawn, weight, filtered, cap = _expected(data, MAX_DRAWN_LINKS, **kwargs)
        assert shown == ids, name
        assert _counts(status) == {"drawn": drawn, "weight": weight, "filter": filtered, "cap": cap}
        assert n_edges == drawn and weight + filtered > 0, name
    assert "none hidden" in v["reset"] or "past the" in v["reset"]
    (ARTIFACTS / f"graph-{n_pos}-tokens.json").write_text(
        json.dumps({"ready_ms": v["ready_ms"], "load_s": result.load_s}) + "\n"
    )
