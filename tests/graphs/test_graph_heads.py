"""Head loadings and QK attribution on every zoo architecture, in float64:

- head loadings: per edge, the (layer, head) weights plus the residual part sum to
  ``adjacency[target, source]``; an edge between two positions has no residual part;
- QK attribution: the pair contributions sum to the head's score, the model's own
  ``hook_attn_scores`` (after Gemma 2's soft cap; OPT's and GPT-J's bridges write the pattern
  there, so their scores are checked through the pattern: the score differences along a query's
  row are the log-pattern's); GPT-NeoX's rotary is applied from the bridge's cos and sin, GPT-J's
  from its definition (neither bridge runs hook_rot_q).

The independent float64 implementation and the planted pair are in test_graph_qk.py.
"""

from __future__ import annotations

import pytest
import torch

from interp import attribution_graph, load_model, run_cached
from interp.graphs.heads import head_loadings
from interp.graphs.qk import attention_pairs, qk_attribution
from tests.transcoder_folders import random_transcoders
from tests.zoo import RMSNORM_ARCHS, ZOO_ARCHS

TOKENS = torch.tensor([0, 5, 17, 33, 99, 12, 7, 5, 17])
# float64 sums of a few dozen terms: rounding ~1e-15 of the edge scale; a path missed or
# counted twice is off by the size of one head's loading (1e-3 or more)
RTOL = 1e-10
# transformers' RMSNorms normalise in float32 even in a float64 model (and GPT-J's attention
# upcasts q and k): the model's own scores are float32-accurate there, the frozen model float64
RTOL_F32 = 1e-5
FAST = ("gpt2", "llama")  # the rest of the zoo runs in the slow lane
# TransformerLens 4.3's bridges: hook_attn_scores holds the pattern
SCORE_IS_PATTERN = ("opt", "gptj")
_graphs: dict = {}


def _graph(zoo, arch, kind="per-layer"):
    if (arch, kind) not in _graphs:
        model = load_model(zoo.directory(arch), device="cpu", dtype=torch.float64)
        tc = random_transcoders(model, kind=kind, skip=kind == "per-layer", d_tc=24, seed=3)
        tc = tc.to(dtype=torch.float64)
        _graphs[arch, kind] = model, tc, attribution_graph(model, TOKENS, tc)
    return _graphs[arch, kind]


def _lane(archs):
    return [a if a in FAST else pytest.param(a, marks=pytest.mark.slow) for a in archs]


@pytest.mark.parametrize("arch", _lane(ZOO_ARCHS))
def test_head_loadings_sum_to_edges(zoo, arch):
    model, tc, g = _graph(zoo, arch)
    pruned = g.prune(node_threshold=0.9, edge_threshold=0.99)
    table = pruned.head_loadings()
    A = pruned.adjacency
    kept = torch.nonzero(pruned.kept_edges)
    kinds = pruned.nodes["kind"].to_numpy()
    kept = kept[[kinds[int(s)] != "logit" for s in kept[:, 1]]]
    sums = table.groupby(["target", "source"])["weight"].sum()
    assert len(sums) == len(kept)  # every kept edge has loadings
    want = torch.tensor([float(A[t, s]) for t, s in sums.index], dtype=torch.float64)
    got = torch.tensor(sums.to_numpy(), dtype=torch.float64)
    # GPT-J's attention runs in float32 in a float64 model, rounding its pattern by the batch's
    # shape: the graph's one-copy rows freeze the prompt's own (batch 1) pattern, the head
    # loadings' pass that of its batch, 1e-7 apart (the graph's rows are the frozen model run
    # forwards to 2e-15: tests/graphs/test_graph_vjp.py)
    rtol = RTOL_F32 if arch == "gptj" else RTOL
    torch.testing.assert_close(got, want, rtol=0, atol=rtol * float(A.abs().max()))
    pos = pruned.nodes["pos"].to_numpy()
    residual = table[table.layer == -1]
    assert (pos[residual.target] == pos[residual.source]).all()
    cross = table[pos[table.target] != pos[table.source]]
    assert len(cross) and (cross.layer >= 0).all()  # cross-position edges: heads only
    assert table["head"].max() == model.cfg.n_heads - 1  # per query head, also where GQA
    # a head below a feature source carries nothing from it
    heads = table[table.layer >= 0]
    src_layer = pruned.nodes["layer"].to_numpy()[heads.source]
    is_feature = kinds[heads.source] == "feature"
    assert (heads.layer[is_feature] > src_layer[is_feature]).all()


def test_head_loadings_cross_layer_and_edges_argument(zoo):
    model, tc, g = _graph(zoo, "gpt2", "cross-layer")
    A = g.adjacency
    nodes = g.nodes
    logit = int(nodes.index[nodes.kind == "logit"][0])
    sources = torch.nonzero(A[logit]).flatten()[:40].tolist()
    edges = [(logit, s) for s in sources]
    table = head_loadings(model, tc, g, edges)
    sums = table.groupby("source")["weight"].sum()
    want = torch.tensor([float(A[logit, s]) for s in sums.index], dtype=torch.float64)
    torch.testing.assert_close(
        torch.tensor(sums.to_numpy()), want, rtol=0, atol=RTOL * float(A.abs().max())
    )
    assert set(sums.index) == set(sources)
    token = int(nodes.index[nodes.kind == "token"][2])
    with pytest.raises(ValueError, match="no inputs"):
        head_loadings(model, tc, g, [(token, sources[0])])
    with pytest.raises(ValueError, match="no edge's source"):
        head_loadings(model, tc, g, [(logit, logit)])


def _model_scores(model, layer):
    name = f"blocks.{layer}.attn.hook_attn_scores"
    pattern = f"blocks.{layer}.attn.hook_pattern"
    run = run_cached(model, TOKENS[None], hooks=[name, pattern])
    return run[name][0], run[pattern][0]


@pytest.mark.parametrize("arch", _lane(ZOO_ARCHS))
def test_qk_attribution_sums_to_score(zoo, arch):
    model, tc, g = _graph(zoo, arch)
    layer, head, q = 1, 1, 7
    scores, pattern = _model_scores(model, layer)
    rtol = RTOL_F32 if arch in RMSNORM_ARCHS else RTOL
    mine, named = [], set()
    for k in range(q + 1):
        table = g.qk_attribution(layer, head, q, k)
        total = float(table["contribution"].sum())
        assert total == pytest.approx(table.attrs["score"], abs=RTOL * abs(total) + 1e-12)
        mine.append(table.attrs["capped"])
        named |= set(table.query_id[table.query_node == -1])
    # Gemma 2's token 0 embeds to zero (its padding row): that key has no parts at all
    assert named <= {"other", "constant", "bias"} and "constant" in named
    mine = torch.tensor(mine, dtype=torch.float64)
    scale = float(mine.abs().max())
    if arch in SCORE_IS_PATTERN:  # the score up to a constant, through the pattern
        logp = pattern[head, q, : q + 1].log()
        # OPT's softmax and GPT-J's attention run in float32: the log-pattern is float32-accurate
        torch.testing.assert_close(mine - mine[0], logp - logp[0], rtol=0, atol=RTOL_F32 * scale)
    else:
        want = scores[head, q, : q + 1]
        torch.testing.assert_close(mine, want, rtol=0, atol=rtol * scale)


def test_qk_top_pairs_and_attention_pairs(zoo):
    model, tc, g = _graph(zoo, "gpt2")
    full = g.qk_attribution(1, 0, 6, 3)
    top = g.qk_attribution(1, 0, 6, 3, top=5)
    assert len(top) == 5
    assert qk_attribution(model, tc, g, 1, 0, 6, 3).equals(full)  # the plain function
    assert top.contribution.abs().tolist() == full.contribution.abs().head(5).tolist()
    pairs = attention_pairs(model, g, 1, 0, top=4)
    assert list(pairs.columns) == ["layer", "head", "query_pos", "key_pos", "attention"]
    assert pairs.attention.is_monotonic_decreasing and (pairs.key_pos <= pairs.query_pos).all()
    _, pattern = _model_scores(model, 1)
    assert pairs.attention.iloc[0] == pytest.approx(float(pattern[0].max()))
    with pytest.raises(ValueError, match="key_pos <= query_pos"):
        g.qk_attribution(1, 0, 3, 6)


def test_budgets_shrink_the_batch_or_refuse(zoo):
    """Under max_bytes the batch is the largest whose estimate fits; a budget under the least
    estimate is refused up front. (The measured peak against max_bytes: test_graph_rows.py.)"""
    from interp.engine.plan import MemoryBudgetError

    model, tc, g = _graph(zoo, "gpt2")
    pruned = g.prune()
    big = pruned.head_loadings()
    qk = g.qk_attribution(1, 0, 6, 3)
    for table, run, what in [
        (big, pruned.head_loadings, "head loadings"),
        (qk, lambda **kw: g.qk_attribution(1, 0, 6, 3, **kw), "QK attribution"),
    ]:
        least = table.attrs["least_bytes"]
        assert least < table.attrs["estimated_bytes"]
        with pytest.raises(MemoryBudgetError, match=f"{what} needs at least {least} bytes"):
            run(max_bytes=least - 1)
        # the smallest batch: the same numbers in more, smaller backward passes
        small = run(max_bytes=least)
        assert small.attrs["batch_size"] < table.attrs["batch_size"]
        assert small.attrs["estimated_bytes"] <= least
        column = "weight" if what == "head loadings" else "contribution"
        assert (small[column] - table[column]).abs().max() < 1e-12


def test_first_and_last_head_split_the_same_edges_differently(zoo):
    model, tc, g = _graph(zoo, "gpt2")
    pruned = g.prune()
    last, first = pruned.head_loadings(), pruned.head_loadings(by="first")
    scale = float(pruned.adjacency.abs().max())
    keys = ["target", "source"]
    sums = last.groupby(keys).weight.sum() - first.groupby(keys).weight.sum()
    assert sums.abs().max() < RTOL * scale  # both sum to the edges
    merged = last.merge(first, on=[*keys, "layer", "head"], how="outer").fillna(0.0)
    # paths through both layers' heads: layer 0's head for "first", layer 1's for "last"
    assert (merged.weight_x - merged.weight_y).abs().max() > 1e-3 * scale
    with pytest.raises(ValueError, match="by must be one of"):
        pruned.head_loadings(by="middle")


def test_a_pickled_graph_leaves_the_model_behind(zoo):
    import pickle

    _, _, g = _graph(zoo, "gpt2")
    back = pickle.loads(pickle.dumps(g))
    assert back.context is None and g.context is not None
    assert torch.equal(back.adjacency, g.adjacency)
    with pytest.raises(ValueError, match="holds no model"):
        back.head_loadings()
