"""SAE features as writers in the discovery graph (interp/discovery/features.py): a reader's
feature edges plus its error edge equal its edges from the writers before the SAE (the stream
there is their sum), feature scores equal autograd through a spliced SAE with the features as a
leaf, an unchanged feature scores exactly 0, and GQA and parallel-residual models run."""

from __future__ import annotations

import pytest
import torch

import interp
from interp.discovery import edge_scores, feature_gradients
from interp.discovery.features import feature_edge_scores, sae_layer
from interp.saes.loading import load_sae
from interp.saes.sae import SAE
from tests.discovery.test_discovery_scores import _task

REL = 1e-5  # float32 sums of a few thousand terms, against the largest score of the frame
ARCHS = ["gpt2", "llama", "gpt_neox_parallel", "gemma2"]  # plain, GQA, parallel, post-norms


def bundled_sae() -> SAE:
    """The bundled SAE."""
    return load_sae("tiny-induction-sae")


def random_sae(d_in: int, layer: int, *, seed: int = 0, d_sae: int = 48, dead: int = 8) -> SAE:
    """A ReLU SAE with random weights; its first ``dead`` features can never fire."""
    g = torch.Generator().manual_seed(seed)
    W_enc = torch.randn(d_in, d_sae, generator=g) / d_in**0.5
    b_enc = 0.1 * torch.randn(d_sae, generator=g)
    b_enc[:dead] = -1e4
    W_dec = torch.randn(d_sae, d_in, generator=g) / d_in**0.5
    b_dec = 0.1 * torch.randn(d_in, generator=g)
    return SAE(W_enc, b_enc, W_dec, b_dec, hook_name=f"blocks.{layer}.hook_resid_pre")


@pytest.fixture(scope="module")
def bundled():
    return interp.load_model("tiny-induction", device="cpu"), bundled_sae()


def _check_identity(model, task, sae, method, **kw):
    layer = sae_layer(model, sae)
    ours = feature_edge_scores(model, task, sae, method, **kw)
    theirs = edge_scores(model, task, method, **kw)
    before = _writers_before(theirs, layer)
    lhs = ours.groupby("target", sort=False)["score"].sum()
    rhs = theirs[theirs.source.isin(before)].groupby("target", sort=False)["score"].sum()
    rhs = rhs.reindex(lhs.index)
    assert not rhs.isna().any(), "a feature reader the graph does not have"
    err = (lhs - rhs).abs().max() / rhs.abs().max()
    assert err <= REL, (method, err)
    assert ours.attrs["clean_metric"] == theirs.attrs["clean_metric"]
    return ours, float(err)


def _writers_before(frame, layer: int) -> set[str]:
    def at(w: str) -> int:
        if w == "embed":
            return -1
        return int(w[3:] if w.startswith("MLP") else w[1:].split("H")[0])

    return {w for w in frame.source.unique() if at(w) < layer}


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_features_and_error_sum_to_the_writers_before_the_sae_bundled(bundled, method):
    model, sae = bundled
    task = interp.tasks.induction(model, 6, seed=0)
    ours, _ = _check_identity(model, task, sae, method)
    assert set(ours.target) == {"logits", "MLP1"} | {f"L1H{h}.{k}" for h in range(4) for k in "qkv"}
    assert ours.attrs["active_features"] > 0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("layer", [0, 1])
def test_the_identity_holds_on_zoo_models(zoo, arch, layer):
    model = zoo.model(arch)
    sae = random_sae(int(model.cfg.d_model), layer)
    task = _task(model, seed=2)
    _check_identity(model, task, sae, "eap")
    _check_identity(model, task, sae, "eap-ig", ig_steps=3)


def _corrupted_leaf_gradients(model, batch, sae, at: str, shift=None):
    """Autograd, independently of reader_gradients: the corrupted run with the SAE's stream
    written as ``decode(f) + error`` (``at="sae"``: f a leaf, every reader after it) or with
    ``f @ W_dec`` added at ``ln_final``'s input by a zero leaf (``at="logits"``); ``shift``
    is added to the input embeddings (an EAP-IG point)."""
    leaves = {}

    def spliced(x, hook):
        f = sae.encode(x).detach().requires_grad_(True)
        error = (x - sae.decode(f)).detach().requires_grad_(True)
        leaves.update(f=f, error=error)
        return sae.decode(f) + error

    def at_logits(x, hook):
        f = torch.zeros(*x.shape[:2], sae.d_sae, requires_grad=True)
        error = torch.zeros_like(x, requires_grad=True)
        leaves.update(f=f, error=error)
        return x + f @ sae.W_dec.detach() + error

    hooks = [(sae.hook_name, spliced) if at == "sae" else ("ln_final.hook_in", at_logits)]
    if shift is not None:
        hooks.insert(0, ("blocks.0.hook_resid_pre", lambda x, hook: x + shift))
    with torch.enable_grad():
        logits = model.run_with_hooks(batch.corrupted, fwd_hooks=hooks)
        batch.metric()(logits).sum().backward()
    return leaves["f"].grad, leaves["error"].grad


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_feature_scores_equal_autograd_through_a_spliced_sae(zoo, arch):
    model = zoo.model(arch)
    sae = random_sae(int(model.cfg.d_model), 1, seed=3)
    task = _task(model, seed=4)
    batch = task.tokens(model)
    ours = feature_edge_scores(model, task, sae)
    c, k, n = ours.attrs["clean_metric"], ours.attrs["corrupted_metric"], len(batch)
    runs = {}
    for side in ("clean", "corrupted"):
        x = model.run_with_cache(getattr(batch, side), names_filter=sae.hook_name)[1]
        x = x[sae.hook_name]
        runs[side] = (sae.encode(x).detach(), (x - sae(x)).detach())
    delta_f = runs["clean"][0] - runs["corrupted"][0]
    delta_e = runs["clean"][1] - runs["corrupted"][1]
    for at, rows in (("logits", ours[ours.target == "logits"]), ("sae", ours)):
        grad_f, grad_e = _corrupted_leaf_gradients(model, batch, sae, at)
        expected = (grad_f * delta_f).sum((0, 1)).double() / n / (c - k)
        expected_error = float((grad_e * delta_e).sum()) / n / (c - k)
        by_source = rows.groupby("source", sort=False)["score"].sum()
        got = torch.tensor([by_source[f"SAE1.F{j}"] for j in range(sae.d_sae)])
        scale = float(expected.abs().max())
        assert scale > 0
        assert float((got - expected).abs().max()) <= REL * scale, at
        assert abs(by_source["SAE1.error"] - expected_error) <= REL * max(
            scale, abs(expected_error)
        ), at


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox_parallel"])
def test_eap_ig_feature_scores_equal_autograd_averaged_over_the_points(zoo, arch):
    model = zoo.model(arch)
    sae, steps = random_sae(int(model.cfg.d_model), 1, seed=10), 4
    task = _task(model, seed=11)
    batch = task.tokens(model)
    ours = feature_edge_scores(model, task, sae, "eap-ig", ig_steps=steps)
    c, k, n = ours.attrs["clean_metric"], ours.attrs["corrupted_metric"], len(batch)
    names = ["blocks.0.hook_resid_pre", sae.hook_name]
    (embed_c, x_c), (embed_k, x_k) = (
        [model.run_with_cache(t, names_filter=names)[1][name] for name in names]
        for t in (batch.clean, batch.corrupted)
    )
    delta_f = (sae.encode(x_c) - sae.encode(x_k)).detach()
    grad_f = (
        sum(
            _corrupted_leaf_gradients(
                model, batch, sae, "sae", shift=i / steps * (embed_c - embed_k)
            )[0]
            for i in range(steps)
        )
        / steps
    )
    expected = (grad_f * delta_f).sum((0, 1)).double() / n / (c - k)
    by_source = ours.groupby("source", sort=False)["score"].sum()
    got = torch.tensor([by_source[f"SAE1.F{j}"] for j in range(sae.d_sae)])
    scale = float(expected.abs().max())
    assert scale > 0 and float((got - expected).abs().max()) <= REL * scale


def test_a_feature_unchanged_between_the_runs_scores_exactly_zero(zoo):
    model = zoo.model("gpt2")
    sae = random_sae(int(model.cfg.d_model), 1, dead=8)
    task = _task(model, seed=5)
    batch = task.tokens(model)
    fired = torch.zeros(sae.d_sae, dtype=torch.bool)
    for tokens in (batch.clean, batch.corrupted):
        x = model.run_with_cache(tokens, names_filter=sae.hook_name)[1][sae.hook_name]
        fired |= sae.encode(x).ne(0).flatten(0, 1).any(0)
    assert not fired[:8].any() and fired.any()
    for method in ("eap", "eap-ig"):
        scores = feature_edge_scores(model, task, sae, method)
        dead = scores[scores.source.isin([f"SAE1.F{j}" for j in range(sae.d_sae) if not fired[j]])]
        assert len(dead) and (dead.score == 0.0).all()
        assert (scores.score != 0).sum() > 0


def test_rows_per_pass_and_top_features_change_no_number(bundled, monkeypatch):
    model, sae = bundled
    task = interp.tasks.induction(model, 5, seed=1)
    kw = dict(ig_steps=2, upstream=True)
    whole = feature_edge_scores(model, task, sae, "eap-ig", **kw)
    split = feature_edge_scores(model, task, sae, "eap-ig", max_rows=3, **kw)
    monkeypatch.setattr(feature_gradients, "_PRODUCT_ELEMENTS", 5000)  # products in pieces
    pieces = feature_edge_scores(model, task, sae, "eap-ig", **kw)
    monkeypatch.undo()
    others = [split, pieces, feature_edge_scores(model, task.tokens(model), sae, "eap-ig", **kw)]
    for fraction in (0.0, 1.01):  # every product dense, every product entry by entry
        monkeypatch.setattr(feature_gradients, "_SPARSE_BELOW", fraction)
        others.append(feature_edge_scores(model, task, sae, "eap-ig", **kw))
        monkeypatch.setattr(feature_gradients, "_PRODUCT_ELEMENTS", 5000)
        others.append(feature_edge_scores(model, task, sae, "eap-ig", **kw))
        monkeypatch.undo()
    for other in others:
        assert (whole.edge == other.edge).all()
        assert (whole.score - other.score).abs().max() <= REL * whole.score.abs().max()
    top = feature_edge_scores(model, task, sae, "eap-ig", top_features=5, **kw)
    node = whole.source.where(whole.source.str.startswith("SAE"), whole.target)
    totals = whole.score.abs().groupby(node).sum().drop("SAE1.error")
    kept = set(top.source[top.source.str.startswith("SAE1.F")])
    assert kept == set(top.target[top.target.str.startswith("SAE1.F")])
    assert kept == set(totals.nlargest(5).index)
    merged = top.merge(whole, on="edge")
    assert len(merged) == len(top) and (merged.score_x == merged.score_y).all()


def test_other_hooks_and_methods_are_refused(bundled):
    model, sae = bundled
    task = interp.tasks.induction(model, 2, seed=0)
    bad = SAE(sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec, architecture="topk", k=16,
              hook_name="blocks.1.hook_resid_mid")  # fmt: skip
    with pytest.raises(ValueError, match="hook_resid_pre") as info:
        feature_edge_scores(model, task, bad)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="method must be one of eap, eap-ig"):
        feature_edge_scores(model, task, sae, "exact")


def test_an_sae_that_does_not_fit_and_bad_arguments_are_refused_in_one_line(bundled):
    model, sae = bundled
    task = interp.tasks.induction(model, 2, seed=0)
    cases = [
        (random_sae(32, 1), {}, "does not fit this model"),
        (random_sae(64, 5), {}, "does not fit this model"),
        (sae, {"method": "eap-ig", "ig_steps": 0}, "ig_steps"),
        (sae, {"top_features": -1}, "top_features"),
        (sae, {"max_rows": 2, "max_bytes": "1GB"}, "not both"),
        (sae, {"metric": "accuracy"}, "metric must be one of"),
    ]
    for bad_sae, kw, match in cases:
        with pytest.raises(ValueError, match=match) as info:
            feature_edge_scores(model, task, bad_sae, **kw)
        assert "\n" not in str(info.value)
