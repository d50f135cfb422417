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
