"""The graph's sources without a vector per feature (interp.graphs.nodes): encoder rows read
from the transcoder's weights per batch of targets, writer vectors per block of positions, bit
for bit what 0.7's sources held (``todays``, below: every encoder row and writer vector
computed once and kept, contracted in one batched matmul per layer).

The gather is the same indexing, the product the same ``activation * decoder row`` (in place,
``rows * activation``: IEEE multiplication commutes exactly), and a block's matmul the same
``[batch d_model] x [d_model slot]`` product per position, so every comparison here is exact.
"""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

import interp.graphs.attention_pass as attention_pass
import interp.graphs.attribute as attribute
import interp.graphs.nodes as nodes
from interp import attribution_graph, load_model
from interp.engine import run_cached
from interp.graphs import budget
from interp.graphs.attention_pass import sources_of
from interp.graphs.heads import head_loadings
from interp.graphs.qk import qk_parts
from tests.transcoder_folders import random_transcoders
from tests.zoo import ZOO_ARCHS

TOKENS = torch.tensor([0, 5, 17, 33, 99, 12, 7, 5, 17, 40, 41])
CAP = 6  # fewer than the active features: rounds ranked by influence
KINDS = ["per-layer", "cross-layer"]


def _old_by_position(columns, pos, vecs, n_pos):
    """0.7's grouping of writer vectors by position (verbatim)."""
    counts = torch.bincount(pos, minlength=n_pos)
    slots = max(int(counts.max()) if len(pos) else 0, 1)
    order = torch.argsort(pos, stable=True)
    pos, columns, vecs = pos[order], columns[order], vecs[order]
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(pos), device=pos.device) - starts[pos]
    padded = torch.zeros(n_pos, slots, vecs.shape[-1], dtype=vecs.dtype, device=vecs.device)
    cols = torch.full((n_pos, slots), -1, dtype=torch.long, device=pos.device)
    padded[pos, slot] = vecs
    cols[pos, slot] = columns
    return padded, cols


class TodaysSources(nodes.Sources):
    """0.7's sources: every encoder row and writer vector held, the contraction verbatim."""

    def encoder_rows(self, features):
        return self.encoders[features.to(self.encoders.device)]

    def add_writer_scores(self, out, layer, g):
        p = g.shape[1]
        vecs, cols = self.writers[layer]
        if vecs.shape[1]:
            scores = torch.bmm(g.transpose(0, 1), vecs[:p].transpose(1, 2))
            valid = cols[:p] >= 0
            out[:, cols[:p][valid]] += scores.permute(1, 0, 2)[:, valid]


def todays(src: nodes.Sources) -> TodaysSources:
    """``src`` with 0.7's tensors, built as 0.7's read_sources built them."""
    old = TodaysSources(**{f.name: getattr(src, f.name) for f in fields(src)})
    tc, n_layers, n_pos = src.tc, src.tc.n_layers, src.embed.shape[0]
    layer, index = src.feat_layer, src.feat_index
    old.encoders = torch.cat([tc.W_enc(s)[index[layer == s]] for s in range(n_layers)])
    columns = torch.arange(src.n_features)
    old.writers = []
    for j in range(n_layers):
        sources = range(j, j + 1) if tc.kind == "per-layer" else range(j + 1)
        idx, pos, vecs = [], [], []
        for s in sources:
            mine = layer == s
            rows = tc.decoder_rows(s, index[mine], j)
            idx.append(columns[mine])
            pos.append(src.feat_pos[mine])
            vecs.append(src.activation[mine, None] * rows)
        old.writers.append(_old_by_position(torch.cat(idx), torch.cat(pos), torch.cat(vecs), n_pos))
    return old


def _sources(model, tc, dtype=torch.float32, chunk_bytes=None):
    src = sources_of(model, tc.to(dtype=dtype), TOKENS, dtype)
    if chunk_bytes is not None:
        src.chunk_bytes = chunk_bytes
    return src


@pytest.mark.parametrize("tc_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arch", ["gpt2", "gemma2"])
def test_gathered_vectors_are_todays(zoo, arch, kind, tc_dtype):
    model = zoo.model(arch)
    tc = random_transcoders(model, kind=kind, d_tc=24, seed=2).to(dtype=tc_dtype)
    names = [tc.input_hook(s) for s in range(tc.n_layers)]
    names += [tc.output_hook(s) for s in range(tc.n_layers)] + ["hook_embed"]
    # a bfloat16 set read as it is (attribution_graph's is float32; 0.7 read one alike)
    src = nodes.read_sources(model, tc, run_cached(model, TOKENS[None], hooks=names), torch.float32)
    old = todays(src)
    assert src.n_features > 20
    order = torch.randperm(src.n_features, generator=torch.Generator().manual_seed(0))
    assert torch.equal(src.encoder_rows(order), old.encoders[order])
    n_pos = len(TOKENS)
    for j, (vecs, cols) in enumerate(old.writers):
        assert torch.equal(src.layout[j], cols)
        for start, stop in [(0, n_pos), (0, 1), (3, 7), (n_pos - 1, n_pos)]:
            got_vecs, got_cols = src.writer_block(j, start, stop)
            assert got_vecs.dtype == vecs.dtype  # a bfloat16 set's: bfloat16, as in 0.7
            assert torch.equal(got_vecs, vecs[start:stop])
            assert torch.equal(got_cols, cols[start:stop])
    # the sources hold no [feature d_model] tensor: their bytes are per feature a few numbers
    assert src.held_bytes < old.encoders.numel() * 4


@pytest.mark.parametrize("kind", KINDS)
def test_the_contraction_is_todays_block_by_block(zoo, kind):
    model = zoo.model("llama")
    tc = random_transcoders(model, kind=kind, d_tc=24, seed=4)
    src = _sources(model, tc)
    old = todays(src)
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(5, len(TOKENS), model.cfg.d_model, generator=gen)
    for j in range(tc.n_layers):
        want = torch.zeros(5, src.n_cols)
        old.add_writer_scores(want, j, g)
        assert want[:, : src.n_features].count_nonzero() > 10  # not a comparison of zeros
        slots = src.layout[j].shape[1]
        per_position = slots * model.cfg.d_model * 4
        # one block, blocks of one and of three positions, and a gradient over fewer positions
        for chunk_bytes in (nodes.CHUNK_BYTES, 1, 3 * per_position):
            src.chunk_bytes = chunk_bytes
            got = torch.zeros(5, src.n_cols)
            src.add_writer_scores(got, j, g)
            assert torch.equal(got, want), (j, chunk_bytes)
            short_want, short = torch.zeros(5, src.n_cols), torch.zeros(5, src.n_cols)
            old.add_writer_scores(short_want, j, g[:, :4])
            src.add_writer_scores(short, j, g[:, :4])
            assert torch.equal(short, short_want)
        assert src.chunk(j) == 3
    # one block per layer: the widest layer's vectors and one source layer's rows
    src.chunk_bytes = nodes.CHUNK_BYTES
    widest = max(c.numel() for c in src.layout)
    one_layer = max(int((src.feat_layer == s).sum()) for s in range(tc.n_layers))
    assert src.block_bytes == (widest + one_layer) * model.cfg.d_model * 4


def _graph_three_ways(monkeypatch, model, tc, **options):
    """The graph built with 0.7's sources, with one block per layer and with blocks of one
    position."""
    real = nodes.read_sources
    with monkeypatch.context() as m:
        m.setattr(attribute, "read_sources", lambda *a, **k: todays(real(*a, **k)))
        today = attribution_graph(model, TOKENS, tc, batch_size=4, **options)
    whole = attribution_graph(model, TOKENS, tc, batch_size=4, **options)
    with monkeypatch.context() as m:
        m.setattr(nodes, "CHUNK_BYTES", 1)  # one position per block
        blocks = attribution_graph(model, TOKENS, tc, batch_size=4, **options)
    return today, whole, blocks


FAST = ("gpt2", "llama", "gemma2", "gpt_neox_parallel")


def _lane(archs):
    return [a if a in FAST else pytest.param(a, marks=pytest.mark.slow) for a in archs]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arch", _lane(ZOO_ARCHS))
def test_graphs_are_todays(zoo, monkeypatch, arch, kind, dtype):
    model = load_model(zoo.directory(arch), device="cpu", dtype=dtype)
    tc = random_transcoders(model, kind=kind, d_tc=16, seed=1, skip=kind == "per-layer")
    for backward in ("one-copy", "batched"):
        for cap in (None, CAP):
            today, whole, blocks = _graph_three_ways(
                monkeypatch, model, tc, backward=backward, max_feature_nodes=cap
            )
            assert today.info["backward"] == backward
            assert today.rows.count_nonzero() > 20
            for g in (whole, blocks):
                assert g.nodes.equals(today.nodes), (backward, cap)
                assert torch.equal(g.row_nodes, today.row_nodes)
                assert torch.equal(g.rows, today.rows), (backward, cap)


@pytest.mark.parametrize("kind", KINDS)
def test_attention_decompositions_are_todays(zoo, monkeypatch, kind):
    model = zoo.model("gpt2")
    tc = random_transcoders(model, kind=kind, d_tc=16, seed=3)
    g = attribution_graph(model, TOKENS, tc)
    nodes_ = g.nodes
    logit = int(nodes_.index[nodes_.kind == "logit"][0])
    edges = [(logit, int(s)) for s in torch.nonzero(g.adjacency[logit]).flatten()[:20]]
    real = nodes.read_sources
    with monkeypatch.context() as m:
        m.setattr(attention_pass, "read_sources", lambda *a, **k: todays(real(*a, **k)))
        want_heads = head_loadings(model, tc, g, edges)
        want_qk = qk_parts(model, tc, g, 1, 0, 8, 3)
    with monkeypatch.context() as m:
        m.setattr(nodes, "CHUNK_BYTES", 1)
        got_heads = head_loadings(model, tc, g, edges)
        got_qk = qk_parts(model, tc, g, 1, 0, 8, 3)
    assert len(want_heads) > 10
    assert got_heads.equals(want_heads)
    for got, want in zip(got_qk[:2], want_qk[:2], strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("kind", KINDS)
def test_the_estimate_counts_the_layout_and_one_block(zoo, kind):
    """The sources' term: a few numbers per feature and one writer block (and the rows
    gathered into it), bounded by CHUNK_BYTES however many features fire."""
    model = zoo.model("gpt2")
    tc = random_transcoders(model, kind=kind, d_tc=16, seed=1)
    d, n_active = int(model.cfg.d_model), 10**8  # a position's writers under CHUNK_BYTES
    held = budget._sources_held(tc, 1024, n_active, d, 4) - (tc.n_layers + 1) * 1024 * d * 4
    writes = 1 if kind == "per-layer" else (tc.n_layers + 1) / 2
    assert held == n_active * (3 * 8 + 4 + 8 * budget._PADDING * writes)
    # the largest layer's vectors (padded), bounded, and one source layer's rows
    share = 1 / tc.n_layers if kind == "per-layer" else 1
    rows = 1 / (budget._PADDING * tc.n_layers * share)  # over the vectors
    bounded = budget._writer_block(tc, 1024, n_active, d, 4)
    assert bounded == int(nodes.CHUNK_BYTES * (1 + rows))
    few = budget._writer_block(tc, 1024, 1_000, d, 4)
    assert few == int(budget._PADDING * 1_000 * share * d * 4 * (1 + rows))
    kw = dict(keep=100, n_logits=10, batch=8, n_active=1_000)
    none = budget.graph_bytes(model, tc, 64, **kw, source_bytes=0, block_bytes=0)
    held = budget.graph_bytes(model, tc, 64, **kw, block_bytes=0)
    assert held == none + budget._sources_held(tc, 64, 1_000, d, 4)
    # the block is alive with a row step's gradients, not at the assembly or pruning
    big = budget.graph_bytes(model, tc, 64, **kw, source_bytes=0, block_bytes=10**9)
    assert 10**9 > big - none > 10**9 - none
