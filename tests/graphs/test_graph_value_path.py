"""The attention's value path (interp.graphs.value_path) and the norms' frozen maps
(interp.graphs.norm_path) against differentiating the bridge's: every zoo architecture takes the
value path and most the norm path (so the identity tests check them), a path that does not
reproduce the bridge falls back, and either way the graph is the same.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

import interp.graphs.frozen as frozen
import interp.graphs.value_path as value_path
from interp import attribution_graph, load_model
from interp.foundation.fallbacks import reset_fallback_warnings
from interp.graphs.frozen import frozen_pass, no_param_grads
from interp.graphs.value_path import check_rtol
from tests.checkpoints import make_checkpoint
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


# A missing head or term planted in a half-precision model's frozen maps: refused, and the
# fallback says which path ran. 16 heads of d_head 4 in a GPT-2 whose attention output is
# mostly its bias: one head is 2-7% of the largest output, well under a tolerance of a share
# of the largest value (0.25 before 0.5.0), and 1.06-3.3 times check_rtol's per-position one.
@pytest.fixture(scope="module")
def many_heads_bf16(tmp_path_factory):
    folder = make_checkpoint(tmp_path_factory.mktemp("gpt2-16-heads"), arch="gpt2", n_heads=16)
    return load_model(folder, device="cpu", dtype=torch.bfloat16)


def _frozen_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "interp.graphs.frozen" and r.levelname == "WARNING"
    ]


def test_bf16_rounding_passes_the_checks(many_heads_bf16, caplog):
    reset_fallback_warnings()
    tc = random_transcoders(many_heads_bf16, kind="per-layer", d_tc=16, seed=1)
    with (
        caplog.at_level(logging.WARNING, logger="interp.graphs.frozen"),
        no_param_grads(many_heads_bf16),
    ):
        fp = frozen_pass(many_heads_bf16, TOKENS, tc, 2)
    assert fp.value_path and fp.norm_path
    assert not _frozen_warnings(caplog)


def test_a_missing_head_is_refused_with_a_warning(many_heads_bf16, monkeypatch, caplog):
    tc = random_transcoders(many_heads_bf16, kind="per-layer", d_tc=16, seed=1)
    right = frozen.value_path_weights
    reset_fallback_warnings()
    for head in range(16):
        planted = []

        def missing(model, n_layers, head=head, planted=planted):  # layer 0's head zeroed
            paths = right(model, n_layers)
            W_O = paths[0].W_O.clone()
            W_O[head] = 0
            paths[0] = dataclasses.replace(paths[0], W_O=W_O)
            planted.append(paths[0])
            return paths

        monkeypatch.setattr(frozen, "value_path_weights", missing)
        with (
            caplog.at_level(logging.WARNING, logger="interp.graphs.frozen"),
            no_param_grads(many_heads_bf16),
        ):
            fp = frozen_pass(many_heads_bf16, TOKENS, tc, 2)
        assert not fp.value_path, f"head {head} zeroed, accepted (miss {planted[0].last_miss})"
    said = _frozen_warnings(caplog)
    assert len(said) == 1, said  # once per process, not once per pass
    assert "value path does not reproduce layers [0]" in said[0]
    assert "differentiating the bridge's attention" in said[0]


def test_a_missing_norm_term_is_refused_with_a_warning(many_heads_bf16, monkeypatch, caplog):
    tc = random_transcoders(many_heads_bf16, kind="per-layer", d_tc=16, seed=1)
    right = frozen.norm_paths
    reset_fallback_warnings()
    for term in ("bias", "centre"):

        def missing(model, busy, term=term):  # one norm's bias (or its centring) left out
            paths = right(model, busy)
            first = paths["blocks.0.ln1"]
            if term == "bias":
                first.bias = None
            else:
                first.centre = False
            return paths

        monkeypatch.setattr(frozen, "norm_paths", missing)
        with (
            caplog.at_level(logging.WARNING, logger="interp.graphs.frozen"),
            no_param_grads(many_heads_bf16),
        ):
            fp = frozen_pass(many_heads_bf16, TOKENS, tc, 2)
        assert fp.value_path and not fp.norm_path, term
    said = _frozen_warnings(caplog)
    assert len(said) == 1 and "frozen maps do not reproduce ['blocks.0.ln1']" in said[0], said
    assert "differentiating the bridge's norms" in said[0]


def test_check_rtol_from_the_dtype():
    # 4 roundings of half an eps, and float32 sums of 64 terms: bfloat16's 2^-6, float16's 2^-9
    assert check_rtol(torch.bfloat16, 64) == pytest.approx(4 * 2**-8, rel=1e-3)
    assert check_rtol(torch.float16, 64) == pytest.approx(4 * 2**-11, rel=1e-2)
    assert check_rtol(torch.float32, 64) == pytest.approx(36 * 2**-24)


def test_out_of_memory_reading_the_weights_is_raised(zoo, monkeypatch):
    # stacking a big model's W_V can run out of memory: raised, not taken for weights that
    # cannot be read (which would fall back to the bridge's attention)
    model = zoo.model("gpt2")
    tc = random_transcoders(model, kind="per-layer", d_tc=16, seed=1)

    def oom(model, name):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")

    monkeypatch.setattr(value_path, "stacked_weight", oom)
    with pytest.raises(torch.OutOfMemoryError), no_param_grads(model):
        frozen_pass(model, TOKENS, tc, 2)
