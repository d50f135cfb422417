"""Pruning, scores and the graph's contract: influence against the closed form
``w ((I - Â)^-1 - I)``, the pruned graph's invariants, node order, text prompts with a BOS id
of 0, ``max_feature_nodes`` and ``max_bytes``. (Equality with circuit-tracer 0.5.0's graph,
scores and pruning: experiments/graph_vs_circuit_tracer.py, in its own environment.)"""

from __future__ import annotations

import pytest
import torch

from interp import attribution_graph
from interp.engine.plan import MemoryBudgetError
from interp.graphs.influence import find_threshold, node_influence, normalise_rows
from tests.transcoder_folders import random_transcoders

TOKENS = torch.tensor([0, 5, 17, 33, 99, 12, 7, 5, 17, 40, 41])


@pytest.fixture(scope="module")
def graph(zoo):
    model = zoo.model("gpt2")
    return attribution_graph(model, TOKENS, random_transcoders(model, d_tc=48, seed=2))


def test_influence_is_the_closed_form(graph):
    A = graph.adjacency.double()
    w = graph.logit_weights().double()
    n = A.shape[0]
    closed = w @ (torch.linalg.inv(torch.eye(n, dtype=A.dtype) - normalise_rows(A)) - torch.eye(n))
    torch.testing.assert_close(node_influence(A, w), closed, rtol=1e-9, atol=1e-12)


def test_find_threshold_is_the_full_sort(graph):
    scores = normalise_rows(graph.adjacency)
    for share in (0.0, 0.5, 0.8, 0.98, 1.0):
        ordered = torch.sort(scores.flatten(), descending=True).values
        cumulative = torch.cumsum(ordered, 0) / ordered.sum()
        index = min(int(torch.searchsorted(cumulative, share)), len(ordered) - 1)
        assert find_threshold(scores, share) == ordered[index]


def test_nodes_in_order(graph):
    nodes = graph.nodes
    kinds = nodes.kind.tolist()
    assert kinds == sorted(kinds, key=["feature", "error", "token", "logit"].index)
    feats = nodes[nodes.kind == "feature"]
    assert feats[["layer", "pos", "feature"]].to_numpy().tolist() == sorted(
        feats[["layer", "pos", "feature"]].to_numpy().tolist()
    )
    assert (nodes[nodes.kind.isin(["feature", "error"])].pos > 0).all()
    errors = nodes[nodes.kind == "error"]
    assert errors[["layer", "pos"]].to_numpy().tolist() == [
        [lay, p] for lay in range(2) for p in range(1, len(TOKENS))
    ]
    assert nodes[nodes.kind == "token"].token_id.tolist() == TOKENS.tolist()
    probs = nodes[nodes.kind == "logit"].probability.to_numpy()
    assert (probs[:-1] >= probs[1:]).all() and probs.sum() <= 1
    # only feature and logit rows have inputs
    inputs = graph.adjacency.abs().sum(1) > 0
    assert not inputs[torch.tensor(nodes.kind.isin(["error", "token"]).to_numpy())].any()


def test_pruned_graph(graph):
    p = graph.prune(node_threshold=0.8, edge_threshold=0.98)
    kinds = p.nodes.kind
    assert (kinds == "token").sum() == len(TOKENS)
    assert (kinds == "logit").sum() == len(graph.logit_token_ids)
    assert len(p.nodes) < len(graph.nodes)
    torch.testing.assert_close(p.adjacency, graph.adjacency[p.kept_nodes][:, p.kept_nodes])
    inner = torch.tensor(kinds.isin(["feature", "error"]).to_numpy())
    feats = torch.tensor((kinds == "feature").to_numpy())
    assert p.kept_edges[:, inner].any(0).all()  # every kept feature and error has an output
    assert p.kept_edges[feats].any(1).all()  # every kept feature has an input
    _check_cumulative(graph, p)
    # the node rule: nothing outside the smallest prefix reaching 0.8 (tokens and logits aside)
    tail = set(range(len(graph.nodes) - len(TOKENS) - len(graph.logit_token_ids), len(graph.nodes)))
    assert set(p.kept_nodes.tolist()) - tail <= _influence_prefix(graph, 0.8)[0]
    scores = graph.scores()
    assert 0 < scores["replacement"] < 1 and 0 < scores["completeness"] < 1
    with pytest.raises(ValueError, match="between 0 and 1"):
        graph.prune(node_threshold=1.5)


def _influence_prefix(graph, share: float) -> tuple[set[int], int]:
    """The node rule computed here from the closed form: the smallest set of the most
    influential nodes whose influence reaches ``share`` of the total (ties at its last score
    kept too, as circuit-tracer's ``influence >= threshold``), and the node that crosses."""
    A, w = graph.adjacency.double(), graph.logit_weights().double()
    n = A.shape[0]
    closed = w @ (torch.linalg.inv(torch.eye(n, dtype=A.dtype) - normalise_rows(A)) - torch.eye(n))
    order = sorted(range(n), key=lambda i: -float(closed[i]))
    total, running = float(closed.sum()), 0.0
    for node in order:
        running += float(closed[node])
        if running >= share * total * (1 - 1e-9):
            last = float(closed[node])
            return {i for i in range(n) if float(closed[i]) >= last * (1 - 1e-9)}, node
    raise AssertionError("the influence never reaches the share")


def _check_cumulative(graph, pruned) -> None:
    """Each kept node's ``cumulative`` is the share of the nodes at least as influential."""
    infl = node_influence(graph.adjacency, graph.logit_weights()).double()
    for k, cum in zip(pruned.kept_nodes.tolist(), pruned.nodes.cumulative, strict=True):
        at_least = float(infl[infl >= infl[k]].sum() / infl.sum())
        assert abs(cum - at_least) <= 1e-5, (k, cum, at_least)


@pytest.mark.parametrize("share", [0.5, 0.8, 0.9])
def test_node_pruning_keeps_the_smallest_prefix_reaching_the_share(graph, share):
    p = graph.prune(node_threshold=share, edge_threshold=1.0)
    prefix, crossing = _influence_prefix(graph, share)
    n_tail = len(graph.tokens) + len(graph.logit_token_ids)
    tail = set(range(len(graph.nodes) - n_tail, len(graph.nodes)))
    kept = set(p.kept_nodes.tolist())
    # nothing outside the prefix (the tokens and logits aside) is kept, and the prefix without
    # its crossing node falls short of the share: the smallest such set
    assert kept - tail <= prefix
    infl = node_influence(graph.adjacency, graph.logit_weights()).double()
    assert float(infl[sorted(prefix - {crossing})].sum()) < share * float(infl.sum())
    # the node that crosses the share is kept (at 0.5 and 0.9 it is a feature, its cumulative
    # share above the threshold: a rule of "cumulative <= share" would drop it)
    assert crossing in kept
    if share != 0.8:
        assert graph.nodes.kind[crossing] == "feature"
        assert p.nodes.cumulative[p.kept_nodes.tolist().index(crossing)] > share
    _check_cumulative(graph, p)


def test_text_with_bos_zero(zoo):
    model = zoo.model("gpt2")  # the zoo's BOS id is 0
    g = attribution_graph(model, "a b c d", random_transcoders(model))
    assert int(g.tokens[0]) == 0 and int(g.nodes[g.nodes.kind == "token"].token_id.iloc[0]) == 0


def test_max_feature_nodes_keeps_the_most_influential(zoo, graph):
    model = zoo.model("gpt2")
    tc = random_transcoders(model, d_tc=48, seed=2)
    capped = attribution_graph(model, TOKENS, tc, max_feature_nodes=20, batch_size=8)
    assert capped.n_features == 20
    # the kept features are columns of the full graph with the same entries into the logits
    full = graph.nodes
    keys = [tuple(r) for r in full[["layer", "pos", "feature"]].to_numpy().tolist()]
    kept = capped.nodes[capped.nodes.kind == "feature"][["layer", "pos", "feature"]]
    index = torch.tensor([keys.index(tuple(r)) for r in kept.to_numpy().tolist()])
    n_logits = len(graph.logit_token_ids)
    torch.testing.assert_close(
        capped.adjacency[-n_logits:, :20], graph.adjacency[-n_logits:, index], atol=1e-6, rtol=0
    )
    # the first round ranks by influence through the logit rows: the top features by direct
    # logit influence are among those kept
    influence = node_influence(graph.adjacency, graph.logit_weights())[: graph.n_features]
    assert set(influence.topk(5).indices.tolist()) <= set(index.tolist())


def test_max_bytes_refused_with_what_it_needs(zoo):
    model = zoo.model("gpt2")
    with pytest.raises(MemoryBudgetError, match="needs at least") as err:
        attribution_graph(model, TOKENS, random_transcoders(model), max_bytes="10KB")
    assert "\n" not in str(err.value)
