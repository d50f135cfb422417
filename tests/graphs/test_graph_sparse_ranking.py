"""The sparse ranking under ``max_feature_nodes`` (interp.graphs.sparse_ranking): its bounds hold
the dense ranking's influence at every column (random causal tables, and every round of a real
build), its certificate is right (a certified and an uncertified case built by hand, and sound
on a real build), nothing dropped ranks as the dense ranking, its kept rows are the dense path's
rows bit for bit, ``ranking="auto"`` picks it only where the dense ranking does not fit, and bad
options are refused."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from interp import attribution_graph, estimate_graph_bytes
from interp.foundation.fallbacks import reset_fallback_warnings
from interp.graphs import attribute, budget, sparse_ranking
from interp.graphs.influence import RANKING_CLAMP, normalise_rows
from interp.graphs.sparse_ranking import SparseRanking
from tests.transcoder_folders import random_transcoders

TOKENS = torch.tensor([0, 5, 17, 33, 99, 12, 7, 5, 17, 40, 41])
CAPPED = dict(max_feature_nodes=20, batch_size=2)  # rounds of 8: three rounds
# the bounds and the reference are float64 sums of the same float32 normalised entries: they
# differ by float64 rounding (~1e-16 relative per term, a few dozen terms)
BOUND_RTOL = 1e-12


def _exact_influence(normalised: torch.Tensor, nodes: torch.Tensor, weights: torch.Tensor):
    """circuit-tracer's series ``p_{k+1} = p_k[row_nodes] @ R̂`` (compute_partial_influences)
    in float64 over normalised rows: the dense ranking's influence without its float32 sums."""
    p, total = weights.clone(), torch.zeros_like(weights)
    for _ in range(128):
        p = p[nodes] @ normalised
        if not p.any():
            return total
        total += p
    raise AssertionError("no convergence")


def _causal_table(seed: int, n_layers=3, n_pos=6, per_site=3, n_logits=2, n_rows=24):
    """Rows of a random graph shaped as a model's: features at (layer, position), error and
    token columns, logits last; a row reads features of lower layers at no later position.
    Logit rows first, then feature rows in a random order; float32, as the build's rows."""
    gen = torch.Generator().manual_seed(seed)
    layer = torch.arange(n_layers).repeat_interleave(n_pos * per_site)
    pos = torch.arange(n_pos).repeat_interleave(per_site).repeat(n_layers)
    n_feat, n_other = len(layer), 5
    n_cols = n_feat + n_other
    feature_rows = torch.randperm(n_feat, generator=gen)[: n_rows - n_logits]
    nodes = torch.cat([torch.arange(n_logits) + n_cols, feature_rows])
    row_layer = torch.cat([torch.full((n_logits,), n_layers), layer[feature_rows]])
    row_pos = torch.cat([torch.full((n_logits,), n_pos - 1), pos[feature_rows]])
    # heavy-tailed magnitudes: a few large entries, many small ones
    rows = (
        torch.randn(n_rows, n_cols, generator=gen) * torch.rand(n_rows, n_cols, generator=gen) ** 4
    )
    readable = (layer[None] < row_layer[:, None]) & (pos[None] <= row_pos[:, None])
    rows[:, :n_feat] *= readable
    logit_p = torch.softmax(torch.randn(n_logits, generator=gen, dtype=torch.float64), 0)
    return rows, nodes, logit_p, layer, pos, n_layers, n_pos


def _ranking(rows, nodes, logit_p, layer, pos, n_layers, n_pos, entries):
    """An empty sparse ranking for ``_causal_table``'s rows."""
    return SparseRanking(
        len(nodes), rows.shape[1], logit_p, entries=entries, feat_layer=layer, feat_pos=pos,
        n_layers=n_layers, n_pos=n_pos, device="cpu",
    )  # fmt: skip


def _reference(rows, nodes, logit_p, n_filled):
    """The exact influence through the first rows, normalised as the ranking normalises them."""
    width = rows.shape[1] + len(logit_p)
    padded = torch.zeros(n_filled, width, dtype=rows.dtype)
    padded[:, : rows.shape[1]] = rows[:n_filled]
    normalised = normalise_rows(padded, RANKING_CLAMP).double()
    weights = torch.zeros(width, dtype=torch.float64)
    weights[rows.shape[1] :] = logit_p
    return _exact_influence(normalised, nodes[:n_filled], weights)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("entries", [2, 4, 16])
def test_the_bounds_hold_the_dense_influence_at_every_column(seed, entries, monkeypatch):
    # kept entries merged into groups of at most 20 (the library's 2^22): several groups
    monkeypatch.setattr(sparse_ranking, "MERGED", 20 if seed % 2 else sparse_ranking.MERGED)
    rows, nodes, logit_p, layer, pos, n_layers, n_pos = _causal_table(seed)
    ranking = _ranking(rows, nodes, logit_p, layer, pos, n_layers, n_pos, entries)
    n_feat, gaps = len(layer), []
    for start in range(0, len(nodes), 5):  # batches of 5 rows: old rows' entries linked later
        ranking.add(rows[start : start + 5], nodes[start : start + 5])
        lower, upper, margin = ranking.bounds()
        exact = _reference(rows, nodes, logit_p, ranking.filled)[:n_feat]
        tol = BOUND_RTOL * float(exact.max())
        assert margin < 1e-12
        assert (lower <= exact + tol).all(), float((lower - exact).max())
        assert (exact <= upper + tol).all(), float((exact - upper).max())
        gaps.append(float((upper - lower).max()))
    assert max(gaps) > 1e-3  # entries were dropped: the bounds are not trivially equal
    for _, counts, _, _ in ranking.kept:  # at most `entries` a row
        assert int(counts.max()) <= entries
    assert bool((ranking.slack < 1 / entries).all())  # every entry >= 1/entries kept


def test_with_nothing_dropped_the_bounds_are_the_dense_influence():
    rows, nodes, logit_p, layer, pos, n_layers, n_pos = _causal_table(7)
    ranking = _ranking(rows, nodes, logit_p, layer, pos, n_layers, n_pos, entries=rows.shape[1])
    ranking.add(rows[:9], nodes[:9])
    ranking.add(rows[9:], nodes[9:])
    assert not ranking.drops
    lower, upper, _ = ranking.bounds()
    exact = _reference(rows, nodes, logit_p, len(nodes))[: len(layer)]
    torch.testing.assert_close(lower, exact, rtol=BOUND_RTOL, atol=0)
    torch.testing.assert_close(upper, exact, rtol=BOUND_RTOL, atol=0)


def _one_logit(entries: dict[int, float], keep: int):
    """A ranking with one logit row (probability 1) reading features 0..7 (one layer, one
    position: nothing reads anything else) with ``entries`` (they sum to 1)."""
    row = torch.zeros(1, 8 + 2)  # 8 features, an error and a token column
    for feature, value in entries.items():
        row[0, feature] = value
    ranking = SparseRanking(
        1, 10, torch.tensor([1.0]), entries=keep, feat_layer=torch.zeros(8, dtype=torch.long),
        feat_pos=torch.ones(8, dtype=torch.long), n_layers=1, n_pos=2, device="cpu",
    )  # fmt: skip
    ranking.add(row, torch.tensor([10]))
    return ranking


def test_a_round_is_certified_where_the_bounds_separate_it():
    # the two largest kept: A (0.3), B (0.2); dropped C (0.15), D..H (0.07 each): each dropped
    # one may hold up to 0.15 (the largest dropped), less than A's and B's exact 0.3 and 0.2
    entries = {0: 0.3, 1: 0.2, 2: 0.15, **{f: 0.07 for f in range(3, 8)}}
    ranking = _one_logit(entries, keep=2)
    nothing = torch.zeros(8, dtype=torch.bool)
    assert ranking.next_round(nothing, 1).tolist() == [0]
    assert ranking.next_round(nothing, 2).tolist() == [0, 1]
    assert (ranking.rounds, ranking.certified) == (2, 2)
    # three: the third is among the dropped ones, each ranked by a lower bound of 0, and the
    # dense ranking's third (C) is not told apart from the rest: not certified
    ranking.next_round(nothing, 3)
    assert (ranking.rounds, ranking.certified) == (3, 2)
    # three kept: C's 0.15 exceeds what any dropped one may hold (0.07): certified
    wider = _one_logit(entries, keep=3)
    assert wider.next_round(nothing, 3).tolist() == [0, 1, 2]
    assert (wider.rounds, wider.certified) == (1, 1)
    # every unvisited feature picked: nothing left to tell apart
    assert ranking.next_round(torch.arange(8) < 2, 6).tolist() == [2, 3, 4, 5, 6, 7]
    assert ranking.certified == 3


def test_a_row_reading_a_later_layer_breaks_the_bounds_premise_and_is_refused():
    rows, nodes, logit_p, layer, pos, n_layers, n_pos = _causal_table(1)
    ranking = _ranking(rows, nodes, logit_p, layer, pos, n_layers, n_pos, entries=4)
    bad = rows[:3].clone()
    bad[2, len(layer) - 1] = 1.0  # a feature row reading a feature of the last layer
    with pytest.raises(RuntimeError, match="later layer or position"):
        ranking.add(bad, nodes[:3])


def _recorded(monkeypatch):
    """Every round of a build: (rows so far, their nodes, logit probabilities, lower, upper,
    picked), with the full rows kept beside the sparse ranking to check it."""
    seen, rounds = [], []
    add, pick = SparseRanking.add, SparseRanking.next_round

    def recording_add(self, rows, nodes):
        seen.append((rows.clone(), nodes.clone()))
        add(self, rows, nodes)

    def recording_pick(self, visited, size):
        lower, upper, _ = self.bounds()
        before = self.certified
        picked = pick(self, visited, size)
        rows = torch.cat([r for r, _ in seen])
        nodes = torch.cat([n for _, n in seen])
        logit_p = self.weights[self.n_cols :]
        exact = _reference(rows, nodes, logit_p, len(nodes))[: self.n_active]
        rounds.append((exact, lower, upper, visited.clone(), picked, self.certified > before))
        return picked

    monkeypatch.setattr(SparseRanking, "add", recording_add)
    monkeypatch.setattr(SparseRanking, "next_round", recording_pick)
    return rounds


@pytest.mark.parametrize("entries", [4, 32, 400])  # 400: < the 434 columns, some certified
def test_a_builds_rounds_are_bounded_and_their_certificates_sound(zoo, monkeypatch, entries):
    model = zoo.model("gpt2")
    tc = random_transcoders(model, d_tc=48, seed=2)
    monkeypatch.setattr(sparse_ranking, "ENTRIES", entries)
    rounds = _recorded(monkeypatch)
    graph = attribution_graph(model, TOKENS, tc, ranking="sparse", **CAPPED)
    assert graph.info["ranking_mode"] == "sparse" and graph.info["ranking_entries"] == entries
    assert graph.info["ranking_rounds"] == len(rounds) == 3
    assert graph.info["ranking_certified"] == sum(r[-1] for r in rounds)
    for exact, lower, upper, visited, picked, certified in rounds:
        tol = BOUND_RTOL * float(exact.max())
        assert (lower <= exact + tol).all() and (exact <= upper + tol).all()
        if certified:  # the dense ranking, given these rows, picks the same features
            rank = torch.argsort(exact, descending=True)
            dense = rank[~visited[rank]][: len(picked)].sort().values
            assert torch.equal(dense, picked)
    assert graph.info["ranking_certified"] >= (entries == 400)  # the check above ran


def _rounds_of(monkeypatch, build):
    """The rounds a build visits, and a function replaying them in another build."""
    rounds, real = [], attribute._RowTable.next_round

    def record(table, visited, plan):
        rounds.append(real(table, visited, plan))
        return rounds[-1]

    with monkeypatch.context() as patch:
        patch.setattr(attribute._RowTable, "next_round", record)
        graph = build()
    return graph, rounds


@pytest.mark.parametrize(
    "arch, kind, skip, backward",
    [
        ("gpt2", "per-layer", False, "one-copy"),
        ("gpt2", "per-layer", False, "batched"),
        ("llama", "per-layer", True, "batched"),
        ("gemma2", "cross-layer", False, "one-copy"),
    ],
)
def test_the_kept_rows_are_the_dense_paths_rows_bit_for_bit(
    zoo, monkeypatch, arch, kind, skip, backward
):
    """With few entries a row (features near the cap's edge may differ from the dense
    ranking's), the dense path visiting the sparse ranking's rounds gives the same graph: the
    kept rows are computed again by the same row step in the same batches. Every row passes
    the bound's causal check on the way (per-layer and cross-layer, skip terms, post-norms)."""
    model = zoo.model(arch)
    tc = random_transcoders(model, d_tc=48, seed=2, kind=kind, skip=skip)
    monkeypatch.setattr(sparse_ranking, "ENTRIES", 8)
    options = dict(CAPPED, backward=backward)
    sparse, rounds = _rounds_of(
        monkeypatch, lambda: attribution_graph(model, TOKENS, tc, ranking="sparse", **options)
    )
    replay = iter(rounds)
    with monkeypatch.context() as patch:
        patch.setattr(attribute._RowTable, "next_round", lambda *args: next(replay))
        dense = attribution_graph(model, TOKENS, tc, ranking="dense", **options)
    assert next(replay, None) is None
    assert dense.info["ranking_mode"] == "dense"
    assert sparse.nodes.equals(dense.nodes)
    assert torch.equal(sparse.row_nodes, dense.row_nodes)
    assert torch.equal(sparse.rows, dense.rows)


def test_with_nothing_dropped_the_sparse_graph_is_the_dense_one(zoo):
    """Every nonzero kept (entries >= the columns: tau 0): every round certified and the graph
    the dense ranking's bit for bit. The features rest on the rounds' edges being far from a
    tie (tests/graphs/test_graph_ranking.py checks this graph's margins: > 1e-4 of the largest
    influence; the two rankings' sums differ by ~1e-7); the rows then on the same row step."""
    model = zoo.model("gpt2")
    tc = random_transcoders(model, d_tc=48, seed=2)
    dense = attribution_graph(model, TOKENS, tc, ranking="dense", **CAPPED)
    sparse = attribution_graph(model, TOKENS, tc, ranking="sparse", **CAPPED)
    assert sparse.info["ranking_entries"] >= sparse.rows.shape[1]  # tau 0 (2^16 entries)
    assert sparse.info["ranking_certified"] == sparse.info["ranking_rounds"] == 3
    assert sparse.nodes.equals(dense.nodes)
    assert torch.equal(sparse.row_nodes, dense.row_nodes) and torch.equal(sparse.rows, dense.rows)


def test_an_uncertified_round_is_warned_of_once_per_graph(zoo, monkeypatch, caplog):
    model = zoo.model("gpt2")
    tc = random_transcoders(model, d_tc=48, seed=2)
    monkeypatch.setattr(sparse_ranking, "ENTRIES", 2)
    with caplog.at_level(logging.WARNING, logger="interp.graphs.row_table"):
        for _ in range(2):
            graph = attribution_graph(model, TOKENS, tc, ranking="sparse", **CAPPED)
    assert graph.info["ranking_certified"] < graph.info["ranking_rounds"]
    said = [r.getMessage() for r in caplog.records if "not certified" in r.getMessage()]
    assert len(said) == 2  # once for each graph
    missing = graph.info["ranking_rounds"] - graph.info["ranking_certified"]
    assert said[0].startswith(f"{missing} of the sparse ranking's 3 rounds")


def test_auto_ranks_dense_where_it_fits_and_sparse_with_a_warning_where_not(
    zoo, monkeypatch, caplog
):
    model = zoo.model("gpt2")
    tc = random_transcoders(model, d_tc=1024, seed=2)  # thousands of active features
    monkeypatch.setattr(sparse_ranking, "ENTRIES", 16)
    options = dict(max_feature_nodes=20, batch_size=1)  # one batch: one estimate each
    need = {
        mode: attribution_graph(model, TOKENS, tc, ranking=mode, max_bytes="1 GiB", **options)
        for mode in ("dense", "sparse")
    }
    dense, sparse = (need[m].info["estimated_bytes"] for m in ("dense", "sparse"))
    assert sparse < dense - 2**20  # the rows over every active feature go
    reset_fallback_warnings()
    with caplog.at_level(logging.WARNING, logger="interp.graphs.sparse_ranking"):
        roomy = attribution_graph(model, TOKENS, tc, max_bytes=dense + budget.HEADROOM, **options)
        tight = attribution_graph(
            model, TOKENS, tc, max_bytes=dense + budget.HEADROOM - 1, **options
        )
        attribution_graph(model, TOKENS, tc, max_bytes=sparse + budget.HEADROOM, **options)
    assert roomy.info["ranking_mode"] == "dense" and "ranking_rounds" not in roomy.info
    assert torch.equal(roomy.rows, need["dense"].rows)
    assert tight.info["ranking_mode"] == "sparse"
    assert tight.info["estimated_bytes"] == sparse
    said = [r.getMessage() for r in caplog.records if "sparse copy of the rows" in r.getMessage()]
    assert len(said) == 1 and "max_bytes allows" in said[0]  # once
    uncapped = attribution_graph(model, TOKENS, tc)
    assert uncapped.info["ranking_mode"] is None


def test_bad_ranking_options_are_refused():
    model = SimpleNamespace(cfg=SimpleNamespace(d_model=64, n_heads=4, dtype=torch.float32,
                                                device="cpu"))  # fmt: skip
    tc = SimpleNamespace(n_layers=2, d_tc=128, kind="per-layer")
    with pytest.raises(
        ValueError, match=r"^ranking must be one of auto, dense, sparse, got 'fast'$"
    ):
        estimate_graph_bytes(model, tc, 16, 8, backward="batched", ranking="fast")
    with pytest.raises(ValueError, match="ranking must be one of"):
        attribution_graph(model, TOKENS, tc, max_feature_nodes=8, ranking="Sparse")
    with pytest.raises(ValueError, match="pass max_feature_nodes"):
        attribution_graph(model, TOKENS, tc, ranking="sparse")


def test_the_estimate_of_the_sparse_ranking_holds_no_row_over_every_feature():
    model = SimpleNamespace(cfg=SimpleNamespace(d_model=2304, n_heads=8, dtype=torch.bfloat16,
                                                device="cuda"))  # fmt: skip
    tc = SimpleNamespace(n_layers=26, d_tc=16384, kind="per-layer")

    def estimate(n_active, ranking):
        return estimate_graph_bytes(model, tc, 1024, 8192, 64, n_active=n_active,
                                    backward="batched", ranking=ranking)  # fmt: skip

    # a million more active features: the sources grow by some 40 bytes a feature either way
    # (graphs.nodes: no vector per feature), the dense ranking's two copies of the rows by
    # 2 x 8,202 rows x 4 bytes a feature; the sparse one holds a batch's rows and per-column
    # vectors only (~1 KB a feature)
    rows, work, more = 8192 + 10, 4, 1_000_000
    dense = estimate(2 * more, "dense") - estimate(more, "dense")
    sparse = estimate(2 * more, "sparse") - estimate(more, "sparse")
    assert dense >= more * 2 * rows * work
    assert 0 < sparse < more * 2_000
    assert estimate(4_360_000, "sparse") < estimate(4_360_000, "dense") / 3
    # auto: dense where it fits the budget, else sparse
    assert estimate_graph_bytes(model, tc, 64, 32, n_active=2000, backward="batched",
                                max_bytes="1 TiB") == estimate_graph_bytes(
        model, tc, 64, 32, n_active=2000, backward="batched", ranking="dense")  # fmt: skip
    assert estimate_graph_bytes(model, tc, 1024, 8192, n_active=4_360_000, backward="batched",
                                max_bytes="80 GiB") == estimate(4_360_000, "sparse")  # fmt: skip


def test_a_tasks_rows_are_ranked_as_asked():
    """``ranking`` reaches each row's graph of a Task (graphs.task_graph passes it on)."""
    import interp
    from interp.graphs.task_graph import task_graph
    from interp.tasks import induction

    model = interp.load_model("tiny-induction")
    task = induction(model, 2, seed=3, seq_len=3)
    asked = []

    def one_graph(model, tokens, tc, **options):
        asked.append(options["ranking"])
        raise StopIteration  # the options are all this test reads

    with pytest.raises(StopIteration):
        task_graph(one_graph, model, task, None, max_feature_nodes=4, ranking="sparse")
    assert asked == ["sparse"]
