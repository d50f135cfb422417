"""The one-copy backward (interp.graphs.vjp) against the batched frozen pass
(interp.graphs.frozen): the same rows for the same nodes on every architecture it covers,
capped and uncapped, per-layer and cross-layer, at every transcoder input site, in float32,
float64 and bfloat16; a model whose pass misses a relation runs the batched pass with a
warning, and a map that does not reproduce the bridge is refused (Gemma 2's own sites and
relations: tests/graphs/test_graph_vjp_gemma.py). tests/graphs/test_graph_identities.py checks
its rows (the default path) against the frozen model run forwards, in float64.
"""

from __future__ import annotations

import dataclasses
import logging
from unittest import mock

import pytest
import torch

import interp.graphs.attribute as attribute
import interp.graphs.frozen as frozen
import interp.graphs.vjp as vjp
from interp import attribution_graph, load_model
from interp.foundation.fallbacks import reset_fallback_warnings
from tests.transcoder_folders import random_transcoders
from tests.zoo import N_LAYERS, ZOO_ARCHS

TOKENS = torch.tensor([0, 5, 17, 33, 99, 12, 7, 5, 17])
COVERED = ZOO_ARCHS  # Gemma 2's sites and planted misses: tests/graphs/test_graph_vjp_gemma.py
CAP = 6  # fewer than the active features: the rounds ranked by influence


def rows_rtol(dtype: torch.dtype, d_model: int, n_layers: int = N_LAYERS) -> float:
    """Two orders of the same products: each step down the model (a layer, the final norm)
    sums ``d_model`` products, each rounding off at most ``u`` of the largest entry per term:
    ``(n_layers + 1) * d_model * u``. float32, d_model 64, 2 layers: 1.1e-5 (measured <= 7e-7
    on the zoo); float64: 2.1e-14 (measured <= 6e-16)."""
    return (n_layers + 1) * d_model * torch.finfo(dtype).eps / 2


def half_rtol(dtype: torch.dtype, n_layers: int = N_LAYERS) -> float:
    """The batched pass of a half-precision model rounds each vector it computes to ``dtype``
    (the one-copy backward computes in float32): tests/graphs/test_graph_half_precision.py's
    ``4 (n_layers + 1) u`` of the largest entry (bfloat16, 2 layers: 0.117; measured
    0.003-0.016)."""
    return 4 * (n_layers + 1) * torch.finfo(dtype).eps / 2


def both(model, tc, **options):
    """The batched and the one-copy graph of ``TOKENS``. Under a cap the one-copy build visits
    the features in the batched build's rounds: which features a cap keeps rests on influences
    the two paths compute equal only to rounding, so a near-tie at the cap's edge could go
    either way on another machine's BLAS; the ranking itself is tested in
    tests/graphs/test_graph_ranking.py."""
    rounds, real = [], attribute._RowTable.next_round

    def record(table, visited, plan):
        rounds.append(real(table, visited, plan))
        return rounds[-1]

    with mock.patch.object(attribute._RowTable, "next_round", record):
        batched = attribution_graph(model, TOKENS, tc, batch_size=5, backward="batched", **options)
    replay = iter(rounds)
    with mock.patch.object(attribute._RowTable, "next_round", lambda *args: next(replay)):
        one = attribution_graph(model, TOKENS, tc, batch_size=5, backward="one-copy", **options)
    assert next(replay, None) is None  # the same number of rounds
    assert batched.info["backward"] == "batched" and one.info["backward"] == "one-copy"
    assert one.nodes.equals(batched.nodes)
    assert torch.equal(one.row_nodes, batched.row_nodes)
    assert one.rows.dtype == batched.rows.dtype
    return batched.rows, one.rows


def assert_rows_close(want, got, rtol: float) -> None:
    scale = float(want.abs().max())
    assert scale > 0
    torch.testing.assert_close(got, want, rtol=0, atol=rtol * scale)


@pytest.mark.parametrize("kind", ["per-layer", "cross-layer"])
@pytest.mark.parametrize("arch", COVERED)
def test_one_copy_rows_are_the_batched_rows(zoo, arch, kind):
    model = zoo.model(arch)
    tc = random_transcoders(model, kind=kind, d_tc=16, seed=1)
    for cap in (None, CAP):
        want, got = both(model, tc, max_feature_nodes=cap)
        assert_rows_close(want, got, rows_rtol(torch.float32, model.cfg.d_model))


# transformers computes Llama's RMSNorm and GPT-J's attention in float32 even in a float64
# model, and the batched pass differentiates those: there it is float32-accurate only (the
# identity tests hold the one-copy rows to 1e-9 in float64 on every architecture)
FLOAT64_EXACT = ("gpt2", "gpt_neox", "gpt_neox_parallel", "phi", "opt")


@pytest.mark.parametrize("arch", FLOAT64_EXACT)
def test_float64_rows_agree_to_rounding(zoo, arch):
    model = load_model(zoo.directory(arch), device="cpu", dtype=torch.float64)
    tc = random_transcoders(model, kind="per-layer", d_tc=16, seed=1, skip=True)
    want, got = both(model, tc.to(dtype=torch.float64), max_feature_nodes=CAP)
    assert got.dtype == torch.float64
    assert_rows_close(want, got, rows_rtol(torch.float64, model.cfg.d_model))


@pytest.mark.parametrize(
    "hook,kind,skip",
    [
        ("mlp.hook_in", "per-layer", True),  # a skip term: g W_skip into the MLP's input
        ("ln2.hook_normalized", "cross-layer", False),  # inside the norm: no weight
        ("hook_resid_mid", "per-layer", True),  # the residual itself
    ],
)
def test_every_input_site(zoo, hook, kind, skip):
    model = zoo.model("gpt2")
    tc = random_transcoders(model, kind=kind, d_tc=16, seed=3, skip=skip, input_hook=hook)
    want, got = both(model, tc, max_feature_nodes=CAP)
    assert_rows_close(want, got, rows_rtol(torch.float32, model.cfg.d_model))


def test_the_mlp_input_hook_is_read_as_the_residual(zoo):
    """``hook_mlp_in`` fires only behind TransformerLens's flag (the refusal says how to turn it
    on); the bridge fires it on the MLP block's input, before ln2, so both paths read it as the
    residual, and the same weights there give the graph they give at ``hook_resid_mid`` (the
    one-copy backward had taken it for the norm's output and refused every model)."""
    model = load_model(zoo.directory("gpt2"), device="cpu")  # its own: the flag changes it
    tc = random_transcoders(model, d_tc=16, seed=3, skip=True, input_hook="hook_mlp_in")
    with pytest.raises(KeyError, match=r"set_use_hook_mlp_in\(True\)"):
        attribution_graph(model, TOKENS, tc)
    model.set_use_hook_mlp_in(True)
    want, got = both(model, tc, max_feature_nodes=CAP)
    assert_rows_close(want, got, rows_rtol(torch.float32, model.cfg.d_model))
    resid = random_transcoders(model, d_tc=16, seed=3, skip=True, input_hook="hook_resid_mid")
    at_resid = attribution_graph(model, TOKENS, resid, batch_size=5, max_feature_nodes=CAP)
    assert torch.equal(at_resid.rows, got)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_bfloat16_model_is_computed_in_float32(zoo, arch):
    model = load_model(zoo.directory(arch), device="cpu", dtype=torch.bfloat16)
    tc = random_transcoders(model, kind="per-layer", d_tc=16, seed=1)
    want, got = both(model, tc)
    assert got.dtype == torch.float32
    assert_rows_close(want, got, half_rtol(torch.bfloat16))


def test_a_model_that_misses_a_relation_runs_batched_and_says_so(zoo, caplog, monkeypatch):
    model = zoo.model("gemma2")  # its norms read as w, not Gemma's 1 + w: ln1's map misses
    monkeypatch.setattr(vjp, "with_offsets", lambda model, norms: norms)
    tc = random_transcoders(model, kind="per-layer", d_tc=16, seed=1)
    reset_fallback_warnings()
    with caplog.at_level(logging.WARNING, logger="interp.graphs.vjp"):
        g = attribution_graph(model, TOKENS, tc, batch_size=5, max_feature_nodes=CAP)
    assert g.info["backward"] == "batched"
    said = [r.getMessage() for r in caplog.records if r.name == "interp.graphs.vjp"]
    assert len(said) == 1 and "running the batched frozen pass" in said[0]
    assert "layer 0: ln1's frozen map" in said[0]
    with pytest.raises(ValueError, match="does not cover this model"):
        attribution_graph(model, TOKENS, tc, backward="one-copy")


def test_the_default_is_the_one_copy_backward_where_covered(zoo):
    model = zoo.model("llama")
    tc = random_transcoders(model, kind="cross-layer", d_tc=16, seed=1)
    assert attribution_graph(model, TOKENS, tc, max_feature_nodes=CAP).info["backward"] == (
        "one-copy"
    )
    with pytest.raises(ValueError, match="backward must be one of"):
        attribution_graph(model, TOKENS, tc, backward="fast")


@pytest.mark.parametrize("wrong", ["value path", "norm weight"])
def test_a_map_that_misses_the_bridge_is_refused(zoo, monkeypatch, wrong):
    model = zoo.model("gpt2")
    tc = random_transcoders(model, kind="per-layer", d_tc=16, seed=1)
    assert isinstance(vjp.record(model, TOKENS, tc), vjp.OneCopy)
    if wrong == "value path":  # W_V doubled: the attention's output is missed
        right = frozen.value_path_weights
        monkeypatch.setattr(
            frozen,
            "value_path_weights",
            lambda m, n: [dataclasses.replace(p, W_V=2 * p.W_V) for p in right(m, n)],
        )
        expected = "the attention's value path"
    else:  # ln2's weight doubled: its map is missed
        right = frozen.norm_paths

        def doubled(m, busy):
            paths = right(m, busy)
            paths["blocks.1.ln2"].weight = 2 * paths["blocks.1.ln2"].weight
            return paths

        monkeypatch.setattr(frozen, "norm_paths", doubled)
        expected = "layer 1: ln2's frozen map"
    got = vjp.record(model, TOKENS, tc)
    assert isinstance(got, str) and expected in got


# GPT-J's attention runs in float32 in a float64 model, rounding its pattern by the batch's
# shape (1e-7 between batches of 1 and 5): the one-copy rows, frozen at the prompt's own pass,
# are the frozen model run forwards (tests/frozen_model.py, from the clean run) to float64's
# rounding, where the batched pass's are off by 5e-8
EXACT_RTOL = 1e-12  # float64 through two layers: ~1e-15 measured


@pytest.mark.parametrize("arch", ["gptj", "gpt2"])
def test_float64_rows_are_the_frozen_model_run_forwards(zoo, arch):
    from tests.frozen_model import FrozenModel
    from tests.graphs.test_graph_identities import _sources, _targets

    model = load_model(zoo.directory(arch), device="cpu", dtype=torch.float64)
    tc = random_transcoders(model, kind="per-layer", skip=True, d_tc=24, seed=3)
    tc = tc.to(dtype=torch.float64)
    g = attribution_graph(model, TOKENS, tc, backward="one-copy")
    fm = FrozenModel(model, TOKENS, tc)
    targets = torch.tensor(g.nodes.kind.isin(["feature", "logit"]).to_numpy()).nonzero().flatten()
    A = g.adjacency[targets]
    n_pos = len(TOKENS)
    nothing = torch.zeros(1, tc.n_layers, n_pos, tc.d_model, dtype=torch.float64)
    base = _targets(fm, g, *fm.run(nothing, torch.ones(1, n_pos, dtype=torch.float64)))[0]
    removed, keep = _sources(fm, g)
    moved = _targets(fm, g, *fm.run(removed, keep)) - base  # [source target]
    torch.testing.assert_close(
        moved.T, -A[:, : len(removed)], rtol=0, atol=EXACT_RTOL * float(A.abs().max())
    )
