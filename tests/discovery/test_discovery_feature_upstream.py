"""Upstream feature edges (``feature_edge_scores(..., upstream=True)``): a writer's edges into
the features and the error sum to its edges into every reader at or after the SAE's layer, and
each edge into a feature equals ``dm/df_j`` (autograd through a spliced SAE) times the
feature's first-order change (``torch.func.jvp`` of the encoder), with no reader gradients."""

from __future__ import annotations

import pytest
import torch

import interp
from interp.discovery import EdgeGraph, edge_scores
from interp.discovery.features import feature_edge_scores
from interp.discovery.runs import writer_outputs
from tests.discovery.test_discovery_features import (
    REL,
    _corrupted_leaf_gradients,
    bundled_sae,
    random_sae,
)
from tests.discovery.test_discovery_scores import _task


def _is_sae(names):
    return names.str.startswith("SAE")


def _check_upstream_identity(model, task, sae, method, **kw):
    ours = feature_edge_scores(model, task, sae, method, upstream=True, **kw)
    theirs = edge_scores(model, task, method, **kw)
    up = ours[~_is_sae(ours.source)]
    assert _is_sae(up.target).all() and len(up)
    readers = set(ours[_is_sae(ours.source)].target)
    lhs = up.groupby("source", sort=False)["score"].sum()
    rhs = theirs[theirs.target.isin(readers)].groupby("source", sort=False)["score"].sum()
    rhs = rhs.reindex(lhs.index)
    assert not rhs.isna().any()
    err = float((lhs - rhs).abs().max() / rhs.abs().max())
    assert err <= REL, (method, err)
    return ours


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gpt_neox_parallel"])
@pytest.mark.parametrize("layer", [0, 1])
def test_a_writers_edges_into_features_and_error_sum_to_its_later_readers(zoo, arch, layer):
    model = zoo.model(arch)
    sae = random_sae(int(model.cfg.d_model), layer, seed=6)
    task = _task(model, seed=7)
    ours = _check_upstream_identity(model, task, sae, "eap")
    expected = {"embed"} if layer == 0 else set(EdgeGraph.from_model(model).writers[:6])
    assert set(ours[~_is_sae(ours.source)].source) == expected
    _check_upstream_identity(model, task, sae, "eap-ig", ig_steps=3)


def test_the_identity_on_the_bundled_model_and_sae():
    model = interp.load_model("tiny-induction", device="cpu")
    task = interp.tasks.induction(model, 4, seed=2)
    for method in ("eap", "eap-ig"):
        _check_upstream_identity(model, task, bundled_sae(), method)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "bundled"])
def test_edges_into_features_equal_autograd_and_the_encoders_jvp(zoo, arch):
    if arch == "bundled":  # TopK with apply_b_dec_to_input
        model, sae = interp.load_model("tiny-induction", device="cpu"), bundled_sae()
        task = interp.tasks.induction(model, 4, seed=3)
    else:
        model = zoo.model(arch)
        sae, task = random_sae(int(model.cfg.d_model), 1, seed=8), _task(model, seed=9)
    batch = task.tokens(model)
    ours = feature_edge_scores(model, task, sae, upstream=True)
    c, k, n = ours.attrs["clean_metric"], ours.attrs["corrupted_metric"], len(batch)
    graph = EdgeGraph.from_model(model)
    clean, _ = writer_outputs(model, batch.clean, graph)
    corrupted, _ = writer_outputs(model, batch.corrupted, graph)
    x = model.run_with_cache(batch.corrupted, names_filter=sae.hook_name)[1][sae.hook_name]
    grad_f, _ = _corrupted_leaf_gradients(model, batch, sae, "sae")
    up = ours[~_is_sae(ours.source) & (ours.target != "SAE1.error")]
    table = up.pivot(index="source", columns="target", values="score")
    checked = 0
    for writer in graph.writers[: 1 + graph.n_heads + 1]:  # embed, layer 0's heads, MLP0
        _, moved = torch.func.jvp(sae.encode, (x,), ((clean - corrupted)[writer],))
        expected = (grad_f * moved).sum((0, 1)).detach().double() / n / (c - k)
        got = torch.tensor([table.loc[writer, f"SAE1.F{j}"] for j in range(sae.d_sae)])
        scale = float(expected.abs().max())
        assert scale > 0
        assert float((got - expected).abs().max()) <= REL * scale, writer
        checked += 1
    assert checked == 6


def test_a_feature_that_never_fires_has_exactly_zero_upstream_edges(zoo):
    model = zoo.model("llama")
    sae = random_sae(int(model.cfg.d_model), 1, dead=8)
    for method in ("eap", "eap-ig"):
        scores = feature_edge_scores(model, _task(model, seed=5), sae, method, upstream=True)
        dead = scores[scores.target.isin([f"SAE1.F{j}" for j in range(8)])]
        assert len(dead) == 8 * 6 and (dead.score == 0.0).all()
        alive = scores[_is_sae(scores.target) & ~scores.target.isin(set(dead.target))]
        assert (alive.score != 0).any()
