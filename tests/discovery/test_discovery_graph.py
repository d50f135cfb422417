"""The discovery graph (interp/discovery/graph.py): its names, and its edge count against a
closed formula on GPT-2 small's config and on every architecture of the zoo."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import AutoConfig

from interp.discovery import EdgeGraph, edge_count, split_edge
from tests.zoo import PARALLEL_ARCHS, ZOO_ARCHS


def formula(n_layers: int, n_heads: int, n_kv: int, mlps: bool, parallel: bool) -> int:
    """Edges counted reader by reader: a reader of layer l sees the embedding and every writer
    of the layers before it; an MLP also its own layer's heads unless the block is parallel."""
    m = int(mlps)
    before = [1 + lay * (n_heads + m) for lay in range(n_layers)]
    heads = sum((n_heads + 2 * n_kv) * b for b in before)
    into_mlps = m * sum(b + (0 if parallel else n_heads) for b in before)
    return heads + into_mlps + 1 + n_layers * (n_heads + m)


def test_gpt2_small_has_32491_edges_from_its_config_alone():
    cfg = SimpleNamespace(n_layers=12, n_heads=12)
    assert edge_count(cfg) == 32_491 == formula(12, 12, 12, True, False)


def test_names_order_and_special_cases():
    graph = EdgeGraph(n_layers=2, n_heads=4, n_kv_heads=2)
    names = graph.edge_names
    assert names[0] == "embed->L0H0.q" and names[-1] == "MLP1->logits"
    assert "L0H1->L1H3.q" in names and "L0H1->L1H1.k" in names and "L0H1->L1H2.k" not in names
    assert "L0H2->MLP0" in names and "MLP0->L0H0.q" not in names and "L1H0->L1H0.q" not in names
    assert len(set(names)) == len(names) == formula(2, 4, 2, True, False)
    parallel = EdgeGraph(n_layers=2, n_heads=4, n_kv_heads=4, parallel=True)
    assert "L0H2->MLP0" not in parallel.edge_names and "L0H2->MLP1" in parallel.edge_names
    attn_only = EdgeGraph(n_layers=2, n_heads=4, n_kv_heads=4, mlps=False)
    assert not any("MLP" in name for name in attn_only.edge_names)
    assert split_edge("L0H1->L1H2.k") == ("L0H1", "L1H2.k")
    with pytest.raises(ValueError, match="SOURCE->TARGET"):
        split_edge("L0H1")
    with pytest.raises(ValueError, match="multiple of n_key_value_heads"):
        EdgeGraph(n_layers=1, n_heads=4, n_kv_heads=3)


@pytest.mark.parametrize("arch", ZOO_ARCHS)
def test_count_formula_on_every_zoo_architecture(zoo, arch):
    model = zoo.model(arch)
    hf = AutoConfig.from_pretrained(zoo.directory(arch))
    n_heads = hf.num_attention_heads
    n_kv = getattr(hf, "num_key_value_heads", None) or n_heads
    expected = formula(hf.num_hidden_layers, n_heads, n_kv, True, arch in PARALLEL_ARCHS)
    assert edge_count(model) == len(EdgeGraph.from_model(model).edge_names) == expected
