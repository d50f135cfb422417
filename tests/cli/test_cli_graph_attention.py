"""``interp graph --attention``: edges.csv and graph.json carry each kept edge's head loadings
(a ``heads`` field circuit-tracer's viewer ignores), summing to the edge's weight, and graph.json
the strongest heads' QK pairs (``qk``), whose scores are the model's own; the page, in a real
browser, lists a clicked edge's heads and a clicked head's QK pairs; without the flag the files
are as before."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from interp.cli import main
from interp.cli.graph_attention import MAX_QK_SCORES, TOP_QK_PAIRS
from interp.engine import run_cached
from tests.test_browser import ARTIFACTS
from tests.transcoder_folders import make_transcoder_folder

RTOL = 1e-5  # float32 loadings of a 2-layer model: a few terms each, rounded at 1e-7


@pytest.fixture(scope="module")
def tc_dir(gpt2_model, tmp_path_factory):
    return make_transcoder_folder(tmp_path_factory.mktemp("tc") / "tc", gpt2_model, d_tc=32)


SCORE_ATOL = 1e-4  # float32 scores of a 2-layer, d_head 16 model: sums of a few hundred terms


def _argv(gpt2_dir, tc_dir, out):
    return ["graph", "--model", str(gpt2_dir), "--transcoders", str(tc_dir), "--out", str(out),
            "--prompt", "a b c a b", "--attention"]  # fmt: skip


@pytest.fixture(scope="module")
def attention_out(gpt2_dir, tc_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("attention") / "out"
    assert main(_argv(gpt2_dir, tc_dir, out)) == 0
    return out


@pytest.mark.slow
def test_attention_adds_head_loadings_to_the_edges(gpt2_dir, tc_dir, attention_out, tmp_path):
    out = attention_out
    argv = _argv(gpt2_dir, tc_dir, out)
    edges = pd.read_csv(out / "edges.csv", keep_default_na=False)
    data = json.loads((out / "graph.json").read_text())
    nodes = pd.read_csv(out / "nodes.csv").set_index("node_id")
    scale = float(edges.weight.abs().max())
    split = 0
    for row, link in zip(edges.itertuples(), data["links"], strict=True):
        assert (row.source, row.target) == (link["source"], link["target"])
        if nodes.kind[row.source] == "logit":
            assert link["heads"] == [] and row.heads == ""
            continue
        weights = [w for _, _, w in link["heads"]]
        assert sum(weights) == pytest.approx(row.weight, abs=RTOL * scale)
        parsed = [float(part.split(":")[1]) for part in row.heads.split()]
        assert parsed == pytest.approx(weights, rel=1e-5)
        crosses = nodes.pos[row.source] != nodes.pos[row.target]
        assert not (crosses and any(layer == -1 for layer, _, _ in link["heads"]))
        split += crosses
    assert split > 0  # some edges cross positions: carried by heads alone
    plain = tmp_path / "plain"
    assert main([*argv[:6], str(plain), *argv[7:-1]]) == 0
    assert "heads" not in pd.read_csv(plain / "edges.csv").columns


@pytest.mark.slow
def test_attention_adds_the_strongest_heads_qk_pairs(gpt2_model, attention_out):
    data = json.loads((attention_out / "graph.json").read_text())
    pos = {n["node_id"]: n["ctx_idx"] for n in data["nodes"]}
    carried = {
        (layer, head, pos[link["target"]], pos[link["source"]])
        for link in data["links"]
        for layer, head, _ in link["heads"]
        if layer >= 0
    }
    qk = data["qk"]
    assert 0 < len(qk) <= MAX_QK_SCORES and len(qk) == min(MAX_QK_SCORES, len(carried))
    tokens = torch.tensor(json.loads((attention_out / "summary.json").read_text())["tokens"])
    names = [f"blocks.{layer}.attn.hook_attn_scores" for layer in range(2)]
    scores = run_cached(gpt2_model, tokens[None], hooks=names)
    ids = set(pos) | {"other", "constant", "bias"}
    for e in qk:
        key = (e["layer"], e["head"], e["query_pos"], e["key_pos"])
        assert key in carried
        model_score = scores[names[e["layer"]]][0, e["head"], e["query_pos"], e["key_pos"]]
        assert e["score"] == pytest.approx(float(model_score), abs=SCORE_ATOL)
        sizes = [abs(c) for _, _, c in e["pairs"]]
        assert 0 < len(sizes) <= TOP_QK_PAIRS and sizes == sorted(sizes, reverse=True)
        assert all(q in ids and k in ids for q, k, _ in e["pairs"])


def _label(node: dict, tokens: list[str]) -> str:  # the page's label of a node (graph_view.py)
    kind, where = node["feature_type"], f" @{node['ctx_idx']}"
    if kind == "embedding":
        return "token " + tokens[node["ctx_idx"]].replace(" ", "\u00b7") + where
    if kind == "mlp reconstruction error":
        return f"error L{node['layer']}" + where
    return f"L{node['layer']} F{node['node_id'].split('_')[1]}" + where


@pytest.mark.slow
@pytest.mark.browser
def test_the_page_lists_an_edges_heads_and_a_heads_qk_pairs(browser, attention_out):
    data = json.loads((attention_out / "graph.json").read_text())
    nodes = {n["node_id"]: n for n in data["nodes"]}
    qk = {(e["layer"], e["head"], e["query_pos"], e["key_pos"]): e for e in data["qk"]}
    tokens = data["metadata"]["prompt_tokens"]

    def inputs(target):  # the panel's "strongest inputs": the 12 largest |weight|
        return sorted((x for x in data["links"] if x["target"] == target),
                      key=lambda x: -abs(x["weight"]))[:12]  # fmt: skip

    def with_pairs(link):
        q, k = nodes[link["target"]]["ctx_idx"], nodes[link["source"]]["ctx_idx"]
        return [(h[0], h[1], q, k) for h in link["heads"] if (h[0], h[1], q, k) in qk]

    target, row, link, key = next(
        (t, i, x, with_pairs(x)[0])
        for t in nodes
        for i, x in enumerate(inputs(t))
        if nodes[t]["ctx_idx"] != nodes[x["source"]]["ctx_idx"] and with_pairs(x)
    )
    heads_li = "[...document.querySelectorAll('.interp-edge-heads li')]"
    pairs_li = "[...document.querySelectorAll('.interp-qk-pairs li')]"
    cells = ".map(li => [...li.children].map(c => c.textContent))"
    checks = {
        "clicked_edge": f"(window.interpGraph.select({json.dumps(target)}, false),"
        " document.querySelector('#interp-graph-panel ul.interp-graph-list')"
        f".children[{row}].querySelector('button.interp-heads-button').click(),"
        " document.body.dataset.edge)",
        "heads": heads_li + cells,
        "clicked_head": f"(document.querySelector('button.interp-head[data-head=\"{key[0]},"
        f"{key[1]}\"]').click(), document.body.dataset.head)",
        "pairs": pairs_li + cells,
        "panel": "document.getElementById('interp-graph-panel').textContent",
    }
    page = attention_out / "report.html"
    result = browser.open(
        page, ready_js="document.body.dataset.ready === '1'", checks=checks,
        screenshot=ARTIFACTS / "graph_attention.png",
    )  # fmt: skip
    v = result.values
    assert result.exceptions == [] and result.errors == [] and result.network_requests() == []
    assert v["clicked_edge"] == f"{link['source']}>{link['target']}"
    assert len(v["heads"]) == len(link["heads"])
    for (weight, *name), (layer, head, expected) in zip(v["heads"], link["heads"], strict=True):
        assert float(weight) == pytest.approx(expected, rel=1e-3)
        assert name == ([" residual (no head)"] if layer < 0 else [f"L{layer}H{head}"])
    assert v["clicked_head"] == f"{key[0]},{key[1]}"
    entry = qk[key]
    assert f"score at query {key[2]}, key {key[3]}" in v["panel"]
    assert len(v["pairs"]) == len(entry["pairs"]) > 0
    for (value, text), (q, k, expected) in zip(v["pairs"], entry["pairs"], strict=True):
        assert float(value) == pytest.approx(expected, rel=1e-3)
        names = [_label(nodes[i], tokens) if i in nodes else i for i in (q, k)]
        assert text == f" {names[0]} \u00d7 {names[1]}"
