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
    assert len(set(n["jsNodeId"] for n in data["nodes"] if n["feature"] != -1 or True)) > 0
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
        "token_labels": "[...document.querySelectorAll('.interp-graph-token')]"
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

    assert v["token_labels"] == [shown(t) for t in tokens]
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
