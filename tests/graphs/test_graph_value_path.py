"""The attention's value path (interp.graphs.value_path) and the norms' frozen maps
(interp.graphs.norm_path) against differentiating the bridge's: every zoo architecture takes the
value path and most the norm path (so the identity tests check them), a path that does not
reproduce the bridge falls back, and either way the graph is the same.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import interp.graphs.frozen as frozen
from interp import attribution_graph
from interp.graphs.frozen import frozen_pass, no_param_grads
from tests.transcoder_folders import random_transcoders
from tests.zoo import ZOO_ARCHS

TOKENS = torch.tensor([0, 5, 17, 33, 99, 12, 7, 5, 17])
# float32 through two layers, the same products in another order: ~1e-7 of the largest entry
RTOL = 1e-5


@pytest.mark.parametrize("arch", ZOO_ARCHS)
def test_every_zoo_architecture_takes_the_value_path(zoo, arch):
    model = zoo.model(arch)
    tc = random_transcoders(model, kind="per-layer", d_tc=16, seed=1)
    with no_param_grads(model):
        assert frozen_pass(model, TOKENS, tc, 2).value_path


@pytest.mark.parametrize("arch", ["gpt2", "llama", "opt"])  # fused qkv; GQA; late pattern hook
def test_a_path_that_misses_falls_back_to_the_same_graph(zoo, arch, monkeypatch):
    model = zoo.model(arch)
    tc = random_transcoders(model, kind="cross-layer", d_tc=16, seed=2)
    fast = attribution_graph(model, TOKENS, tc, batch_size=5)
    right = frozen.value_path_weights

    def wrong(model, n_layers):  # W_V doubled: the check sees the output missed
        return [dataclasses.replace(p, W_V=2 * p.W_V) for p in right(model, n_layers)]

    monkeypatch.setattr(frozen, "value_path_weights", wrong)
    with no_param_grads(model):
        assert not frozen_pass(model, TOKENS, tc, 2).value_path
    slow = attribution_graph(model, TOKENS, tc, batch_size=64)
    scale = fast.adjacency.abs().max()
    torch.testing.assert_close(slow.adjacency, fast.adjacency, rtol=0, atol=RTOL * scale)
    assert slow.nodes.equals(fast.nodes)


# Gemma 2 scales by 1 + w, OPT flattens rows and positions before ln2: the bridge's norms there
NORM_PATH = {"gemma2": False, "opt": False}


@pytest.mark.parametrize("arch", ZOO_ARCHS)
def test_the_norm_path_where_it_reproduces_the_bridge(zoo, arch):
    model = zoo.model(arch)
    tc = random_transcoders(model, kind="per-layer", d_tc=16, seed=1)
    with no_param_grads(model):
        fp = frozen_pass(model, TOKENS, tc, 2)
    assert fp.value_path and fp.norm_path == NORM_PATH.get(arch, True)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])  # LayerNorm; RMSNorm
def test_a_norm_path_that_misses_falls_back_to_the_same_graph(zoo, arch, monkeypatch):
    model = zoo.model(arch)
    tc = random_transcoders(model, kind="cross-layer", d_tc=16, seed=2)
    fast = attribution_graph(model, TOKENS, tc, batch_size=5)
    right = frozen.norm_paths

    def wrong(model, busy):  # every weight doubled: the check sees the output missed
        paths = right(model, busy)
        for path in paths.values():
            path.weight = 2 * path.weight
        return paths

    monkeypatch.setattr(frozen, "norm_paths", wrong)
    with no_param_grads(model):
        fp = frozen_pass(model, TOKENS, tc, 2)
    assert fp.value_path and not fp.norm_path
    slow = attribution_graph(model, TOKENS, tc, batch_size=64)
    scale = fast.adjacency.abs().max()
    torch.testing.assert_close(slow.adjacency, fast.adjacency, rtol=0, atol=RTOL * scale)
    assert slow.nodes.equals(fast.nodes)
