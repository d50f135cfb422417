"""Grouped-query attention: every analysis is per query head and names the shared kv head.

The zoo's Llama and Qwen2 have 4 query heads reading 2 key/value heads (query head h reads
kv head h // 2, as transformers' ``repeat_kv``). Identities: scores and head outputs rebuilt
from the per-query-head circuits equal the model's own, whose patterns and outputs match
transformers (tests/test_model_zoo.py).
"""

from __future__ import annotations

import pytest
import torch

from interp import detect_induction_heads, run_cached
from interp.circuits import (
    attention_scores_from_weights,
    circuit_weights,
    composition_scores,
    copying_scores,
    head_outputs_from_weights,
)

ATOL = 1e-4  # float32 products over d_model 64


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma2", "mistral"])
def gqa(request, zoo):
    return zoo.model(request.param), zoo.hf(request.param)


def _tokens(model):
    generator = torch.Generator().manual_seed(0)
    return torch.randint(2, int(model.cfg.d_vocab), (2, 10), generator=generator)


def test_bridge_shapes_are_grouped(gqa):
    model, _ = gqa
    assert tuple(model.W_Q.shape) == (2, 4, 64, 16)
    assert tuple(model.W_K.shape) == tuple(model.W_V.shape) == (2, 2, 64, 16)
    names = ["blocks.0.attn.hook_k", "blocks.0.attn.hook_v", "blocks.0.attn.hook_z"]
    run = run_cached(model, _tokens(model), hooks=names)
    assert run["blocks.0.attn.hook_k"].shape[2] == run["blocks.0.attn.hook_v"].shape[2] == 2
    assert run["blocks.0.attn.hook_z"].shape[2] == 4  # mixed values per query head


def test_circuit_weights_expand_per_query_head(gqa):
    model, _ = gqa
    w = circuit_weights(model, fold_ln=False)
    assert w.n_kv_heads == 2 and w.W_K.shape[1] == 4
    for head in range(4):
        assert w.kv_head(head) == head // 2
        torch.testing.assert_close(w.W_K[:, head], model.W_K[:, head // 2].float())
        torch.testing.assert_close(w.W_V[:, head], model.W_V[:, head // 2].float())


def test_query_head_scores_from_weights_match_model(gqa):
    model, _ = gqa
    tokens = _tokens(model)
    run = run_cached(
        model,
        tokens,
        scores=True,
        hooks=[f"blocks.{layer}.ln1.hook_normalized" for layer in range(2)],
    )
    for layer in range(2):
        x = run[f"blocks.{layer}.ln1.hook_normalized"]
        got = attention_scores_from_weights(model, layer, x, ignore_rotary=True)
        # rotary rotates query and key by the same angle where q_pos == k_pos: equal there
        want = run.scores()[layer]
        torch.testing.assert_close(
            got.diagonal(dim1=-2, dim2=-1), want.diagonal(dim1=-2, dim2=-1), atol=ATOL, rtol=1e-4
        )


def test_query_head_outputs_from_weights_match_model_and_transformers(gqa):
    model, hf = gqa
    tokens = _tokens(model)
    run = run_cached(
        model,
        tokens,
        patterns=True,
        head_outputs=True,
        hooks=[f"blocks.{layer}.ln1.hook_normalized" for layer in range(2)],
    )
    with torch.no_grad():
        attentions = hf(tokens, output_attentions=True).attentions
    for layer in range(2):
        torch.testing.assert_close(run.patterns()[layer], attentions[layer], atol=1e-5, rtol=0)
        x = run[f"blocks.{layer}.ln1.hook_normalized"]
        got = head_outputs_from_weights(model, layer, x, attentions[layer])
        torch.testing.assert_close(got, run.head_outputs()[layer], atol=ATOL, rtol=1e-4)


def test_tables_name_the_shared_kv_head(gqa):
    model, _ = gqa
    copying = copying_scores(model)
    assert len(copying) == 8 and (copying["kv_head"] == copying["head"] // 2).all()
    assert copying["copying_score"].notna().all()
    comp = composition_scores(model, "QKV", baseline_samples=10)
    assert (comp["src_kv_head"] == comp["src_head"] // 2).all()
    assert (comp["dst_kv_head"] == comp["dst_head"] // 2).all()
    table = detect_induction_heads(model, ablate=False, batch_size=1)
    assert (table["kv_head"] == table["head"] // 2).all() and len(table) == 8
    # query heads sharing a kv head still get their own scores (their W_Q / W_O differ)
    k = comp[comp["kind"] == "K"].set_index(["src_head", "dst_head"])["score"]
    assert k.loc[(0, 0)] != k.loc[(0, 1)]
