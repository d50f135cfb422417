"""Head loadings and QK attribution against an independent float64 implementation
(tests/attention_oracle.py: dense frozen maps from transformers' weights, no interp code) on a
small GPT-2 and a small grouped-query, rotary Llama; and removing one key-side feature from the
frozen model changes the score by what the decomposition says.
"""

from __future__ import annotations

import pytest
import torch

from interp import attribution_graph, load_model
from interp.graphs.heads import head_loadings
from interp.graphs.qk import qk_attribution, qk_parts
from tests.attention_oracle import Oracle
from tests.transcoder_folders import random_transcoders

TOKENS = torch.tensor([0, 5, 17, 33, 99, 12, 7, 5, 17])
# float64 on both sides; transformers' RMSNorm normalises in float32 even in a float64 model, so
# the Llama oracle's norm scales (float64, from the run's inputs) and the bridge's (float32
# rounded) differ by ~1e-7 relative. A wrong path, head or rotary is off by 1e-2 or more.
RTOL = {"gpt2": 1e-10, "llama": 1e-5}
_cases: dict = {}


def _case(zoo, arch):
    if arch not in _cases:
        model = load_model(zoo.directory(arch), device="cpu", dtype=torch.float64)
        tc = random_transcoders(model, skip=True, d_tc=24, seed=3).to(dtype=torch.float64)
        g = attribution_graph(model, TOKENS, tc)
        _cases[arch] = model, tc, g, Oracle(zoo.directory(arch), TOKENS, tc)
    return _cases[arch]


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_head_loadings_equal_the_oracle(zoo, arch):
    model, tc, g, oracle = _case(zoo, arch)
    nodes, A = g.nodes, g.adjacency
    scale = float(A.abs().max())
    targets = [
        int(nodes.index[nodes.kind == "logit"][0]),
        int(nodes.index[(nodes.kind == "feature") & (nodes.layer == 1)][-1]),
        int(nodes.index[(nodes.kind == "feature") & (nodes.layer == 0)][-1]),
    ]
    edges = [(t, int(s)) for t in targets for s in torch.nonzero(A[t]).flatten()[:25]]
    table = head_loadings(model, tc, g, edges)
    checked = 0
    for t, s in edges:
        want = oracle.loadings(nodes.iloc[t], nodes.iloc[s])
        assert sum(want.values()) == pytest.approx(float(A[t, s]), abs=RTOL[arch] * scale)
        mine = table[(table.target == t) & (table.source == s)]
        got = {(int(r.layer), int(r.head)): r.weight for r in mine.itertuples()}
        for key, value in want.items():
            if key == (-1, -1) and nodes.pos[t] != nodes.pos[s]:
                assert value == pytest.approx(0, abs=RTOL[arch] * scale)  # no such path
                continue
            assert got.get(key, 0.0) == pytest.approx(value, abs=RTOL[arch] * scale), (t, s, key)
            checked += abs(value) > 1e-3 * scale
    assert checked > 10  # the comparison is not between zeros


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("where", [(1, 1, 7, 2), (1, 3, 8, 5), (0, 2, 6, 6)])
def test_qk_attribution_equals_the_oracle(zoo, arch, where):
    model, tc, g, oracle = _case(zoo, arch)
    layer, head, q, k = where
    Q, K, scale, labels = qk_parts(model, tc, g, layer, head, q, k)
    Q_o, K_o, scale_o = oracle.qk_parts(layer, head, q, k, g.nodes)
    assert scale == pytest.approx(scale_o)
    size = float(Q_o.abs().max() * K_o.abs().max())
    tol = RTOL[arch] * size**0.5
    torch.testing.assert_close(Q, Q_o, rtol=0, atol=tol)
    torch.testing.assert_close(K, K_o, rtol=0, atol=tol)
    table = qk_attribution(model, tc, g, layer, head, q, k)
    pairs = scale_o * Q_o @ K_o.T
    want = pairs[
        torch.tensor(table.query_node.where(table.query_node >= 0, len(Q_o) + table.query_id.map(
            {"other": -3, "constant": -2, "bias": -1}).fillna(0).astype(int)).to_numpy()),
        torch.tensor(table.key_node.where(table.key_node >= 0, len(K_o) + table.key_id.map(
            {"other": -3, "constant": -2, "bias": -1}).fillna(0).astype(int)).to_numpy()),
    ]  # fmt: skip
    got = torch.tensor(table.contribution.to_numpy())
    torch.testing.assert_close(got, want, rtol=0, atol=RTOL[arch] * float(pairs.abs().max()))
    assert float(pairs.sum()) == pytest.approx(table.attrs["score"], abs=RTOL[arch] * size)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("k", [4, 7])  # 7: the feature sits on both sides
def test_removing_a_key_side_feature_moves_the_score_as_decomposed(zoo, arch, k):
    """Zeroing one feature in the frozen model (tests/frozen_model.py: every pattern and norm
    scale held, layer ``layer``'s q and k computed from the run) moves the score by
    ``-(its row as a query item) - (its column as a key item) + (its own pair)``: the score is
    bilinear in what reaches the query and the key."""
    from tests.frozen_model import FrozenModel

    model, tc, g, _ = _case(zoo, arch)
    layer, head, q = 1, 1, 7
    table = qk_attribution(model, tc, g, layer, head, q, k)
    keys = table[table.key_node >= 0].groupby("key_node")["contribution"].sum()
    feats = g.nodes.index[g.nodes.kind == "feature"]
    keys = keys[keys.index.isin(feats)]
    node = int(keys.abs().idxmax())  # the key-side feature with the largest part
    as_query = float(table.contribution[table.query_node == node].sum())
    as_key = float(table.contribution[table.key_node == node].sum())
    own = float(table.contribution[(table.query_node == node) & (table.key_node == node)].sum())
    predicted = -as_query - as_key + own
    assert abs(as_key) > 1e-2 * abs(table.attrs["score"])  # a feature that matters
    if k == q:
        assert abs(as_query) > 1e-2 * abs(table.attrs["score"])

    fm = FrozenModel(model, TOKENS, tc)
    info = g.nodes.iloc[node]
    n_pos = len(TOKENS)
    removed = torch.zeros(2, tc.n_layers, n_pos, tc.d_model, dtype=torch.float64)
    for j, vec in fm.feature_vectors(int(info.layer), int(info.pos), int(info.feature)).items():
        removed[1, j, int(info.pos)] = vec
    attn = f"blocks.{layer}.attn"
    scores = f"{attn}.hook_attn_scores"
    fm.run(
        removed, torch.ones(2, n_pos, dtype=torch.float64),
        free=(f"{attn}.hook_q", f"{attn}.hook_k"), record=(scores,),
    )  # fmt: skip
    got = fm.recorded[scores][:, head, q, k]
    size = float(table.contribution.abs().max())
    assert float(got[0]) == pytest.approx(table.attrs["score"], abs=RTOL[arch] * size)
    assert float(got[1] - got[0]) == pytest.approx(predicted, abs=RTOL[arch] * size)
