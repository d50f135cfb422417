"""feature_intervention's constrained layers (circuit-tracer's ``constrained_layers``): every
layer constrained is the frozen replacement model (-A[:, s] of the graph), none is the
propagating run, and some are each layer's MLP output held at clean + the edit's decoder change
with the other layers recomputed, checked against oracles built from ``run_cached``'s own hooks.
circuit-tracer itself: experiments/interventions_vs_circuit_tracer.py."""

from __future__ import annotations

import pytest
import torch

from interp import FeatureEdit, attribution_graph, feature_intervention, load_model, run_cached
from interp.graphs.interventions import frozen_feature_run
from tests.transcoder_folders import random_transcoders

TOKENS = torch.tensor([0, 5, 17, 33, 99, 12, 7, 5, 17])
ATOL = 1e-9  # float64 throughout: only rounding separates the two sides
PATTERNS = ("attn.hook_pattern", "attn.hook_q", "attn.hook_k")


@pytest.fixture(scope="module")
def model3(zoo):
    """A 3-layer GPT-2, in float64: a constrained range can sit between free layers."""
    return load_model(zoo.directory("gpt2", n_layer=3), device="cpu", dtype=torch.float64)


def _tc(model, kind: str):
    tc = random_transcoders(model, kind=kind, skip=kind == "per-layer", seed=4, d_tc=48)
    return tc.to(dtype=torch.float64)


def _active(model, tc, layer: int, pos: int) -> int:
    """The feature of ``layer`` most active at ``pos`` in the clean run."""
    x = run_cached(model, TOKENS[None], hooks=[tc.input_hook(layer)])[tc.input_hook(layer)]
    return int(tc.encode(x[0, pos], layer).argmax())


def _frozen_patterns(model):
    names = [n for n in model.hook_dict if n.endswith(PATTERNS)]
    clean = run_cached(model, TOKENS[None], hooks=names)
    return [(n, lambda act, hook, v=clean[n]: v.reshape(act.shape)) for n in names]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["per-layer", "cross-layer"])
def test_every_layer_constrained_is_the_frozen_model(model3, kind):
    tc = _tc(model3, kind)
    g = attribution_graph(model3, TOKENS, tc)
    feats = g.nodes[g.nodes.kind == "feature"]
    everything = range(tc.n_layers)
    base = feature_intervention(model3, TOKENS, tc, constrained_layers=everything)
    targets = torch.tensor(g.nodes.kind.isin(["feature", "logit"]).to_numpy())
    strength = g.adjacency[targets].abs().amax(0)  # each source's strongest edge
    for layer in range(tc.n_layers):
        index = max(feats[feats.layer == layer].index, key=lambda i: float(strength[i]))
        node = feats.loc[index]
        edit = FeatureEdit(int(node.layer), int(node.feature), int(node.pos), value=0.0)
        run = feature_intervention(model3, TOKENS, tc, [edit], constrained_layers=everything)
        frozen = frozen_feature_run(model3, TOKENS, tc, [edit])
        torch.testing.assert_close(run.pre_activations, frozen.pre_activations, rtol=0, atol=0)
        moved = torch.stack(
            [run.pre_activations[int(r.layer), int(r.pos), int(r.feature)]
             - base.pre_activations[int(r.layer), int(r.pos), int(r.feature)]
             for r in feats.itertuples()]
        )  # fmt: skip
        change = run.logits[-1] - base.logits[-1]
        moved = torch.cat([moved, change[g.logit_token_ids] - change.mean()])
        column = g.adjacency[targets, index]
        assert column.abs().max() > 1e-3
        torch.testing.assert_close(moved, -column, rtol=0, atol=1e-9 * g.adjacency.abs().max())


@pytest.mark.slow
@pytest.mark.parametrize("freeze", [False, True])
@pytest.mark.parametrize("kind", ["per-layer", "cross-layer"])
def test_no_layer_constrained_is_the_propagating_run(model3, kind, freeze):
    tc = _tc(model3, kind)
    edits = [
        FeatureEdit(0, _active(model3, tc, 0, 4), 4, value=0.0),
        FeatureEdit(1, 3, None, scale=2.0),
    ]
    run = feature_intervention(model3, TOKENS, tc, edits, freeze_attention=freeze)
    hooks = _frozen_patterns(model3) if freeze else []
    prop = run_cached(
        model3, TOKENS[None], transcoders=tc, feature_edits=edits, interventions=hooks
    )
    torch.testing.assert_close(run.logits, prop.logits[0], rtol=0, atol=ATOL)
    # layer 2 is never edited: the run's features there are the propagating run's
    torch.testing.assert_close(
        run.activations[2], prop["blocks.2.hook_transcoder_acts"][0], rtol=0, atol=ATOL
    )
    clean = run_cached(model3, TOKENS[None], transcoders=tc)
    assert (run.logits - clean.logits[0]).abs().max() > 1e-3  # the edits do something


@pytest.mark.slow
@pytest.mark.parametrize("layers", [(0, 1), (1, 2), (1,)])
@pytest.mark.parametrize("kind", ["per-layer-noskip", "cross-layer"])
def test_constrained_layers_hold_their_outputs_and_the_rest_recompute(model3, kind, layers):
    tc = random_transcoders(model3, kind=kind.removesuffix("-noskip"), seed=4, d_tc=48)
    tc = tc.to(dtype=torch.float64)
    first = layers[0]
    edits = [FeatureEdit(first, _active(model3, tc, first, 5), 5, value=0.0),
             FeatureEdit(layers[-1], 2, 6, value=3.0)]  # fmt: skip
    run = feature_intervention(model3, TOKENS, tc, edits, constrained_layers=layers)
    # the oracle: every constrained layer's MLP output is its clean value plus the edits'
    # decoder change from the clean features (a CLT writes only into constrained layers);
    # patterns frozen; everything else the model's own run
    names = [tc.input_hook(lay) for lay in range(3)] + [tc.output_hook(lay) for lay in layers]
    clean = run_cached(model3, TOKENS[None], hooks=names)
    acts = {lay: tc.encode(clean[tc.input_hook(lay)][0], lay) for lay in range(3)}
    hooks = _frozen_patterns(model3)
    for out in layers:
        held = clean[tc.output_hook(out)].clone()
        for e in edits:
            if e.layer == out or (tc.kind == "cross-layer" and e.layer < out):
                row = tc.W_dec(e.layer)[e.feature]
                row = row if tc.kind == "per-layer" else row[out - e.layer]
                held[0, e.pos] += (e.value - acts[e.layer][e.pos, e.feature]) * row
        hooks.append((tc.output_hook(out), lambda act, hook, v=held: v))
    oracle = run_cached(model3, TOKENS[None], interventions=hooks, hooks=names[:3])
    torch.testing.assert_close(run.logits, oracle.logits[0], rtol=0, atol=ATOL)
    for lay in range(3):
        torch.testing.assert_close(
            run.pre_activations[lay],
            tc.pre_activations(oracle[tc.input_hook(lay)][0], lay),
            rtol=0,
            atol=ATOL,
        )


def test_edits_outside_the_constrained_layers_are_refused(gpt2_model):
    tc = random_transcoders(gpt2_model, seed=4)
    edit = FeatureEdit(0, 1, 2, value=0.0)
    with pytest.raises(ValueError, match=r"edits layer 0, outside constrained_layers \[1\]"):
        feature_intervention(gpt2_model, TOKENS, tc, [edit], constrained_layers=[1])
    with pytest.raises(ValueError, match="constrained_layers has layer 2; the transcoders"):
        feature_intervention(gpt2_model, TOKENS, tc, [edit], constrained_layers=range(6))
