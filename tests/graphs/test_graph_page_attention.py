"""The graph page's attention section on a graph carrying ``heads`` and ``qk``
(:mod:`interp.cli.graph_attention`'s fields; the real ones are checked in
tests/cli/test_cli_graph_attention.py): a click on the drawn edge or its "heads" button lists its
heads, hostile token text in the edge's and the pairs' labels
stays text, and a page without the fields has no heads buttons."""

from __future__ import annotations

import json

import pytest
import torch

from interp.graphs.attribute import attribution_graph
from interp.graphs.frontend import frontend_json
from interp.pages.graph import graph_page
from tests.test_browser import ARTIFACTS, PWNED
from tests.transcoder_folders import random_transcoders


@pytest.fixture(scope="module")
def data(neox_model):
    tc = random_transcoders(neox_model, d_tc=32)
    tokens = torch.tensor([0, 5, 17, 230, 5, 17, 99, 12])
    small = attribution_graph(neox_model, tokens, tc).prune(0.8, 0.98)
    strings = [PWNED[i % len(PWNED)] for i in range(len(tokens))]
    return frontend_json(
        small, strings, ["x"] * len(small.logit_token_ids), prompt="p", slug="s", scan=tc.name,
        n_layers=tc.n_layers,
    )  # fmt: skip


def _with_attention(data):
    """A cross-position link given two heads, and one head's QK pairs naming hostile tokens."""
    data = json.loads(json.dumps(data))
    nodes = {n["node_id"]: n for n in data["nodes"]}
    link = next(
        x for x in data["links"]
        if nodes[x["source"]]["ctx_idx"] != nodes[x["target"]]["ctx_idx"]
        and nodes[x["target"]]["feature_type"] != "logit"
    )  # fmt: skip
    for x in data["links"]:
        x["heads"] = []
    link["heads"] = [[1, 0, 0.75 * link["weight"]], [0, 1, 0.25 * link["weight"]]]
    q, k = nodes[link["target"]]["ctx_idx"], nodes[link["source"]]["ctx_idx"]
    token = next(n["node_id"] for n in data["nodes"] if n["feature_type"] == "embedding")
    pairs = [[token, link["source"], 2.5], ["bias", token, -1.25]]
    data["qk"] = [{"layer": 1, "head": 0, "query_pos": q, "key_pos": k, "score": 3.0,
                   "pairs": pairs}]  # fmt: skip
    return data, link, nodes[token]


@pytest.mark.browser
def test_an_edges_heads_and_a_heads_pairs_show_hostile_tokens_as_text(browser, data, tmp_path):
    data, link, token = _with_attention(data)
    page = graph_page(data, {}, title="t", n_layers=2, info=["x"])
    assert "heads" in page and '"qk"' in page
    path = tmp_path / "graph.html"
    path.write_text(page, encoding="utf-8")
    line = (
        f"line[data-source={json.dumps(link['source'])}][data-target={json.dumps(link['target'])}]"
    )
    checks = {
        "clickable": "document.querySelectorAll('.interp-graph-edge.interp-clickable').length",
        "hit": f"getComputedStyle(document.querySelector('{line}')).pointerEvents",
        "drawn_edge": f"(document.querySelector('{line}').dispatchEvent("
        "new MouseEvent('click', {bubbles: true})),"
        " [document.body.dataset.edge, document.querySelectorAll('.interp-edge-heads li').length])",
        "edge": f"(window.interpGraph.select({json.dumps(link['target'])}, false),"
        " [...document.querySelectorAll('button.interp-heads-button')].map(b => b.click()),"
        " document.body.dataset.edge)",
        "heads": "[...document.querySelectorAll('.interp-edge-heads li')]"
        ".map(li => li.textContent)",
        "absent": "(document.querySelector('button.interp-head[data-head=\"0,1\"]').click(),"
        " document.querySelector('.interp-qk').textContent)",
        "pairs": "(document.querySelector('button.interp-head[data-head=\"1,0\"]').click(),"
        " [...document.querySelectorAll('.interp-qk-pairs li')].map(li => li.textContent))",
        "pwned": "typeof window.__pwned",
        "on_attributes": "[...document.querySelectorAll('*')].filter(e => [...e.attributes]"
        ".some(a => a.name.startsWith('on'))).length",
    }
    result = browser.open(
        path, ready_js="document.body.dataset.ready === '1'", checks=checks,
        screenshot=ARTIFACTS / "graph_attention_hostile.png",
    )  # fmt: skip
    v = result.values
    assert result.exceptions == [] and result.errors == [] and result.dialogs == []
    assert v["pwned"] == "undefined" and v["on_attributes"] == 0
    assert v["clickable"] == 1 and v["hit"] == "visiblestroke"  # the one link with heads
    assert v["drawn_edge"] == [f"{link['source']}>{link['target']}", 2]
    assert v["edge"] == f"{link['source']}>{link['target']}"
    assert [t.split(" ")[-1] for t in v["heads"]] == ["L1H0", "L0H1"]
    assert "Not decomposed" in v["absent"]
    shown = PWNED[token["ctx_idx"] % len(PWNED)].replace(" ", "\u00b7")
    assert len(v["pairs"]) == 2 and v["pairs"][0].startswith("2.500 token " + shown)
    assert v["pairs"][1].startswith("-1.250 bias \u00d7 token " + shown)


def test_a_page_without_attention_fields_has_no_heads_section(data):
    page = graph_page(data, {}, title="t", n_layers=2, info=["x"])
    assert 'the "heads" button' not in page and '"qk"' not in page
