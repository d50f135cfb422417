"""The ranking under ``max_feature_nodes`` (interp.graphs.ranking): rows normalised once, as
they come, rank as the dense ``partial_influences`` of every row so far (to rounding: one pass
over the rows, the series' steps on the rows' own columns); both are
circuit-tracer's ``compute_partial_influences`` (written out here), with its 1e-8 clamp; a
capped graph is the one the dense ranking gives; the buffer's device follows the free memory;
pruning's sort of the values alone is torch.sort's."""

from __future__ import annotations

import logging

import pytest
import torch

from interp import attribution_graph
from interp.foundation.fallbacks import reset_fallback_warnings
from interp.graphs import attribute
from interp.graphs.influence import _descending, find_threshold, partial_influences
from interp.graphs.ranking import Ranking, ranking_device
from tests.transcoder_folders import random_transcoders

TOKENS = torch.tensor([0, 5, 17, 33, 99, 12, 7, 5, 17, 40, 41])
RTOL = 1e-12  # float64 series of a few steps over ~40 columns


def _circuit_tracer(rows, logit_p, row_nodes, max_iter=128):
    """circuit-tracer 0.5.0's compute_partial_influences, as it reads (graph.py)."""
    normalized = rows.clone().abs_()
    normalized /= normalized.sum(dim=1, keepdim=True).clamp(min=1e-8)
    influences = torch.zeros(rows.shape[1], dtype=rows.dtype)
    prod = torch.zeros(rows.shape[1], dtype=rows.dtype)
    prod[-len(logit_p) :] = logit_p
    for _ in range(max_iter):
        prod = prod[row_nodes] @ normalized
        if not prod.any():
            break
        influences += prod
    return influences


def _table(n_features=30, n_logits=3, seed=0):
    """Rows of a random acyclic graph: logits first (reading every feature), then features,
    each reading features of lower index only; the last columns are the logits'."""
    gen = torch.Generator().manual_seed(seed)
    n = n_features + 4 + n_logits  # features, 4 other sources, logits
    order = torch.randperm(n_features, generator=gen)
    nodes = torch.cat([torch.arange(n_features + 4, n), order])
    rows = torch.randn(len(nodes), n, generator=gen, dtype=torch.float64)
    rows[:, n_features + 4 :] = 0  # no row reads a logit
    for i, node in enumerate(nodes[n_logits:].tolist()):
        rows[n_logits + i, node:n_features] = 0  # a feature reads lower features only
    rows[n_logits + 2] = 0  # a row of zeros stays zero
    logit_p = torch.softmax(torch.randn(n_logits, generator=gen, dtype=torch.float64), 0)
    return rows, nodes, logit_p


@pytest.mark.parametrize("batch", [1, 4, 7])
def test_rows_added_in_batches_rank_as_every_row_at_once(batch):
    rows, nodes, logit_p = _table()
    ranking = Ranking(len(nodes), rows.shape[1], logit_p, dtype=rows.dtype, device="cpu")
    for i in range(0, len(nodes), batch):
        ranking.add(rows[i : i + batch, :-3], nodes[i : i + batch])  # as _RowTable: no logits
        filled = ranking.filled
        dense = partial_influences(rows[:filled], logit_p, nodes[:filled])
        # the same sum in another order ((q_0 + q_1 + ...) R̂ against q_0 R̂ + q_1 R̂ + ...)
        torch.testing.assert_close(ranking.influence(), dense, rtol=RTOL, atol=0)
        reference = _circuit_tracer(rows[:filled], logit_p, nodes[:filled])
        torch.testing.assert_close(dense, reference, rtol=RTOL, atol=0)
    assert ranking.influence()[:30].count_nonzero() > 20  # the series reached most features
    visited = torch.zeros(30, dtype=torch.bool)
    visited[::3] = True
    picked = ranking.next_round(visited, 6)
    rank = torch.argsort(ranking.influence()[:30], descending=True)  # its own values: no tie
    assert torch.equal(picked, rank[~visited[rank]][:6].sort().values)


def test_the_ranking_clamps_row_sums_as_circuit_tracer():
    """A row whose |entries| sum to less than 1e-8 passes on only sum / 1e-8 of its influence
    (circuit-tracer's compute_partial_influences; pruning's normalisation clamps at 1e-10). With
    a 1e-10 clamp this test fails: feature 0 then takes A's whole 0.5 and ranks first."""
    a, b, logit = 3, 4, 5  # features 0 (C), 1 (D), 2 (E), 3 (A), 4 (B); one logit
    rows = torch.zeros(3, 6)
    rows[0, [a, b]] = 0.5  # the logit reads A and B
    rows[1, 0] = 1e-9  # A reads C, faintly
    rows[2, [1, 2]] = torch.tensor([0.6, 0.4])  # B reads D and E
    nodes = torch.tensor([logit, a, b])
    logit_p = torch.tensor([1.0])
    ranking = Ranking(3, 6, logit_p, dtype=torch.float32, device="cpu")
    ranking.add(rows, nodes)
    influence = ranking.influence()
    torch.testing.assert_close(influence[:5], torch.tensor([0.05, 0.3, 0.2, 0.5, 0.5]))
    torch.testing.assert_close(influence, _circuit_tracer(rows, logit_p, nodes))
    torch.testing.assert_close(partial_influences(rows, logit_p, nodes), influence)
    assert ranking.next_round(torch.tensor([False, False, False, True, True]), 1).tolist() == [1]


def test_a_capped_graph_is_the_dense_rankings(zoo, monkeypatch):
    """Rounds ranked through the normalised buffer give the graph that ranking every round by
    partial_influences over the rows so far gives (the ranking before 0.7.0), bit for bit."""
    model = zoo.model("gpt2")
    tc = random_transcoders(model, d_tc=48, seed=2)
    kw = dict(max_feature_nodes=20, batch_size=2)  # rounds of 8: three rounds
    fast = attribution_graph(model, TOKENS, tc, **kw)
    assert fast.info["ranking"] == "cpu"
    assert attribution_graph(model, TOKENS, tc).info["ranking"] is None  # uncapped: no ranking

    margins = []

    def dense_round(table, visited, plan):
        logit_p = table.ranking.weights[-plan.n_logits :]
        influence = partial_influences(
            table.values[: table.filled], logit_p, table.nodes[: table.filled]
        )
        size = min(plan.round_size, plan.n_rows - table.filled)
        rank = torch.argsort(influence[: plan.n_active], descending=True)
        left = influence[rank][~visited[rank]]
        if len(left) > size:  # the gap at the round's edge, against the largest influence
            margins.append(float((left[size - 1] - left[size]) / left[0]))
        return rank[~visited[rank]][:size].sort().values

    monkeypatch.setattr(attribute._RowTable, "next_round", dense_round)
    dense = attribution_graph(model, TOKENS, tc, **kw)
    # the two orders of summing differ by ~1e-7 of the largest influence: an edge this far from
    # a tie picks alike on any machine, so the graphs' equality below rests on no near-tie
    assert margins and min(margins) > 1e-4, margins
    assert fast.nodes.equals(dense.nodes)
    assert torch.equal(fast.rows, dense.rows) and torch.equal(fast.row_nodes, dense.row_nodes)


def test_the_buffer_goes_on_a_cuda_device_where_it_fits(caplog):
    cuda = torch.device("cuda", 0)  # a name only: nothing is allocated
    assert ranking_device("cpu", 10, 100) == torch.device("cpu")
    assert ranking_device(cuda, 100, 100) == cuda
    reset_fallback_warnings()
    with caplog.at_level(logging.WARNING, logger="interp.graphs.ranking"):
        assert ranking_device(cuda, 101, 100) == torch.device("cpu")
        assert ranking_device(cuda, 1000, 100) == torch.device("cpu")  # said once
    assert len([r for r in caplog.records if "runs on the host" in r.getMessage()]) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pruning_sorts_the_values_alone_as_torch_sort(dtype):
    """find_threshold's sort of the values without indices: torch.sort's order bit for bit,
    ties and zeros included, and the threshold of the full sort."""
    gen = torch.Generator().manual_seed(3)
    scores = torch.rand(300, 200, generator=gen, dtype=dtype)
    scores[scores < 0.3] = 0
    scores[::7] = scores[1]  # ties
    flat = scores.flatten()
    full = torch.sort(flat, descending=True).values
    assert torch.equal(_descending(flat[flat > 0]), full[full > 0])
    cumulative = torch.cumsum(full, 0) / full.sum()
    for share in (0.0, 0.5, 0.8, 0.98, 1.0):
        index = min(int(torch.searchsorted(cumulative, share)), len(full) - 1)
        assert find_threshold(scores, share) == full[index]
