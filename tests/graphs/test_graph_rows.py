"""A graph held as its rows: the dense adjacency they make, pruning and scores on the rows
against the same functions on the dense matrix, the value path's one-position transpose
against the dense one, and the memory budget's batch (halved under ``max_bytes`` and under
the memory free on the device; a measured peak within the budget, slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from interp import AttributionGraph, attribution_graph, estimate_graph_bytes
from interp.graphs import attribute
from interp.graphs.budget import HEADROOM
from interp.graphs.influence import graph_scores, prune_masks
from interp.graphs.value_path import ValuePath, _dense, _one_position
from tests.transcoder_folders import random_transcoders

TOKENS = torch.tensor([0, 5, 17, 33, 99, 12, 7, 5, 17, 40, 41])
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(zoo):
    return zoo.model("gpt2")


@pytest.fixture(scope="module")
def graph(model):
    return attribution_graph(model, TOKENS, random_transcoders(model, d_tc=48, seed=2))


def test_rows_are_the_feature_and_logit_rows(graph):
    kinds = graph.nodes.kind.to_numpy()
    n = len(kinds)
    assert graph.rows.shape == (graph.n_features + len(graph.logit_token_ids), n)
    assert set(kinds[graph.row_nodes.numpy()]) == {"feature", "logit"}
    dense = graph.adjacency
    torch.testing.assert_close(dense[graph.row_nodes], graph.rows, rtol=0, atol=0)
    others = torch.ones(n, dtype=torch.bool)
    others[graph.row_nodes] = False
    assert not dense[others].any()
    # made again from the dense matrix: the same graph
    again = AttributionGraph(
        nodes=graph.nodes,
        adjacency=dense,
        tokens=graph.tokens,
        logit_token_ids=graph.logit_token_ids,
        logit_probabilities=graph.logit_probabilities,
    )
    torch.testing.assert_close(again.adjacency, dense, rtol=0, atol=0)
    with pytest.raises(ValueError, match="either adjacency or rows"):
        AttributionGraph(nodes=graph.nodes, tokens=graph.tokens)


def test_pruning_and_scores_on_rows_are_the_dense_ones(graph):
    dense, weights = graph.adjacency, graph.logit_weights()
    n_tail = len(graph.tokens) + len(graph.logit_token_ids)
    kw = dict(n_features=graph.n_features, n_kept_tail=n_tail, node_threshold=0.8,
              edge_threshold=0.98)  # fmt: skip
    node_d, edge_d, cum_d, infl_d = prune_masks(dense, weights, **kw)
    node_r, edge_r, cum_r, infl_r = prune_masks(
        graph.rows, weights, row_nodes=graph.row_nodes, **kw
    )
    assert torch.equal(node_d, node_r)
    assert torch.equal(edge_d[graph.row_nodes], edge_r)
    torch.testing.assert_close(infl_r, infl_d, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(cum_r, cum_d, rtol=1e-6, atol=1e-9)
    spans = dict(errors=graph._span("error"), tokens=graph._span("token"))
    want = graph_scores(dense, weights, **spans)
    assert graph.scores() == pytest.approx(want, rel=1e-6)
    pruned = graph.prune()
    kept = pruned.kept_nodes
    torch.testing.assert_close(pruned.adjacency, dense[kept][:, kept], rtol=0, atol=0)
    assert torch.equal(pruned.kept_edges, edge_d[kept][:, kept])


@pytest.mark.parametrize("n_kv", [4, 2])
def test_one_position_transpose_is_the_dense_one(n_kv):
    gen = torch.Generator().manual_seed(n_kv)
    n_heads, d_model, d_head, b, p = 4, 16, 4, 5, 7
    path = ValuePath(
        torch.randn(n_kv, d_model, d_head, generator=gen, dtype=torch.float64),
        torch.randn(n_heads, d_head, d_model, generator=gen, dtype=torch.float64),
        None,
        None,
    )
    pattern = torch.softmax(torch.randn(n_heads, p, p, generator=gen, dtype=torch.float64), -1)
    grad = torch.zeros(b, p, d_model, dtype=torch.float64)
    where = torch.tensor([6, 0, 3, 3, 5])
    grad[torch.arange(b), where] = torch.randn(b, d_model, generator=gen, dtype=torch.float64)
    grad[2] = 0  # a row without a target
    sparse = _one_position(path, pattern, grad)
    assert sparse is not None
    torch.testing.assert_close(sparse, _dense(path, pattern, grad), rtol=1e-12, atol=1e-12)
    grad[0, 1] = 1.0  # a second position in row 0: not one position any more
    assert _one_position(path, pattern, grad) is None


def test_max_bytes_halves_the_batch(model):
    tc = random_transcoders(model, d_tc=48, seed=2)
    full = attribution_graph(model, TOKENS, tc, batch_size=64)
    need = full.info["estimated_bytes"]
    n_active = full.info["active_features"]
    one = estimate_graph_bytes(model, tc, len(TOKENS), None, 1, n_active=n_active,
                               n_logits=len(full.logit_token_ids))  # fmt: skip
    assert one < need  # the batch matters: halving it can fit a budget
    budget = (one + need) // 2 + HEADROOM  # the estimate may fill max_bytes less HEADROOM
    g = attribution_graph(model, TOKENS, tc, batch_size=64, max_bytes=budget)
    assert g.info["batch_size"] < 64 and g.info["estimated_bytes"] <= budget - HEADROOM
    torch.testing.assert_close(g.adjacency, full.adjacency, rtol=0, atol=1e-6)


def test_default_batch_follows_free_memory(model, monkeypatch):
    tc = random_transcoders(model, d_tc=48, seed=2)
    roomy = attribution_graph(model, TOKENS, tc)
    assert roomy.info["batch_size"] == min(64, len(roomy.row_nodes))
    monkeypatch.setattr(attribute, "free_bytes", lambda device: roomy.info["estimated_bytes"] - 1)
    tight = attribution_graph(model, TOKENS, tc)
    assert tight.info["batch_size"] < roomy.info["batch_size"]
    assert tight.info["estimated_bytes"] < roomy.info["estimated_bytes"]


@pytest.mark.slow
def test_measured_peak_stays_within_the_budget(tmp_path):
    """A fresh process's peak resident size over its build, under max_bytes (the memory
    benchmark's child; half the unbudgeted estimate as the budget)."""
    spec = {"device": "cpu", "layers": 2, "d_model": 128, "d_tc": 512, "dir": str(tmp_path),
            "kind": "per-layer", "dtype": "float32", "n_pos": 256, "cap": 128}  # fmt: skip

    def run(extra: dict) -> dict:
        out = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "bench_graph_memory.py"), "--child",
             json.dumps(spec | extra)],
            capture_output=True, text=True, check=True, env={"PYTHONPATH": str(ROOT)} | _env(),
        )  # fmt: skip
        return json.loads(out.stdout.split("RESULT ", 1)[1])

    free = run({})
    budget = (free["estimate"] + free["one"]) // 2 + HEADROOM  # fits with a smaller batch
    bound = run({"max_bytes": budget})
    assert bound["batch"] < free["batch"]
    assert bound["peak"] <= 1.10 * budget


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_a_budget_keeps_the_same_features(model):
    """Rounds follow the batch asked for, not the one the budget allows."""
    tc = random_transcoders(model, d_tc=48, seed=2)
    free = attribution_graph(model, TOKENS, tc, max_feature_nodes=20, batch_size=8)
    one = estimate_graph_bytes(model, tc, len(TOKENS), 20, 1,
                               n_active=free.info["active_features"],
                               n_logits=len(free.logit_token_ids))  # fmt: skip
    budget = (one + free.info["estimated_bytes"]) // 2 + HEADROOM
    bound = attribution_graph(model, TOKENS, tc, max_feature_nodes=20, batch_size=8,
                              max_bytes=budget)  # fmt: skip
    assert bound.info["batch_size"] < 8
    cols = ["layer", "pos", "feature"]
    assert bound.nodes[cols].equals(free.nodes[cols])
