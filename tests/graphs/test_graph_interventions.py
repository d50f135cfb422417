"""Feature interventions on the frozen replacement model (interp.graphs.interventions) test a
graph's edges: zeroing source feature ``s`` moves every feature pre-activation and demeaned
logit by ``-A[:, s]``; doubling it, by ``+A[:, s]``. In float64, on GPT-2 and Gemma 2 (post-norms,
soft-capped logits: the logit nodes are the raw logits), per-layer and cross-layer, reading
``mlp.hook_in`` and (per-layer) ``ln2.hook_normalized``."""

from __future__ import annotations

import pytest
import torch

from interp import FeatureEdit, attribution_graph, load_model
from interp.graphs.interventions import frozen_feature_run
from tests.transcoder_folders import random_transcoders

TOKENS = torch.tensor([0, 5, 17, 33, 99, 12, 7, 5, 17])
RTOL = 1e-5  # of the largest entry: transformers' RMSNorm rounds in float32 even in float64


def _targets(g, run) -> torch.Tensor:
    feats = g.nodes[g.nodes.kind == "feature"]
    pre = torch.stack(
        [run.pre_activations[int(r.layer), int(r.pos), int(r.feature)] for r in feats.itertuples()]
    )
    demeaned = run.logits[g.logit_token_ids] - run.logits.mean()
    return torch.cat([pre, demeaned])


# ln2.hook_normalized: the MLP's norm before its weight and bias (SAELens's GPT-2 transcoders)
CASES = [(a, k, "mlp.hook_in") for a in ("gpt2", "gemma2") for k in ("per-layer", "cross-layer")]
CASES += [(a, "per-layer", "ln2.hook_normalized") for a in ("gpt2", "gemma2")]


@pytest.mark.slow
@pytest.mark.parametrize("arch,kind,hook", CASES)
def test_zeroing_a_feature_moves_targets_by_its_column(zoo, arch, kind, hook):
    model = load_model(zoo.directory(arch), device="cpu", dtype=torch.float64)
    tc = random_transcoders(model, kind=kind, skip=kind == "per-layer", seed=4, input_hook=hook)
    tc = tc.to(dtype=torch.float64)
    g = attribution_graph(model, TOKENS, tc)
    targets = torch.tensor(g.nodes.kind.isin(["feature", "logit"]).to_numpy())
    base = _targets(g, frozen_feature_run(model, TOKENS, tc))
    feats = g.nodes[g.nodes.kind == "feature"]
    scale = g.adjacency.abs().max()
    for layer in (0, 1):
        for index in feats[feats.layer == layer].index[:3]:
            node = feats.loc[index]
            site = dict(layer=layer, feature=int(node.feature), pos=int(node.pos))
            zeroed = frozen_feature_run(model, TOKENS, tc, [FeatureEdit(**site, value=0.0)])
            doubled = frozen_feature_run(model, TOKENS, tc, [FeatureEdit(**site, scale=2.0)])
            column = g.adjacency[targets, index]
            torch.testing.assert_close(
                _targets(g, zeroed) - base, -column, rtol=0, atol=RTOL * scale
            )
            torch.testing.assert_close(
                _targets(g, doubled) - base, column, rtol=0, atol=RTOL * scale
            )
    assert g.adjacency[targets][:, feats[feats.layer == 0].index[:3]].abs().max() > 1e-3 * scale


# -- issue 40, case 8: a position outside the prompt, and text, as attribution_graph takes it --


def test_an_edit_past_the_prompt_names_its_position_and_the_length(gpt2_model):
    from interp.graphs.interventions import feature_intervention

    tc = random_transcoders(gpt2_model)
    tokens = TOKENS[:5]
    for run in (feature_intervention, frozen_feature_run):
        with pytest.raises(ValueError, match=r"position 99, but the prompt has 5 tokens"):
            run(gpt2_model, tokens, tc, [FeatureEdit(0, 1, pos=99, value=0.0)])
        with pytest.raises(ValueError, match=r"position -6, but the prompt has 5 tokens"):
            run(gpt2_model, tokens, tc, [FeatureEdit(0, 1, pos=-6, value=0.0)])


def test_text_is_taken_as_its_tokens(gpt2_model):
    from interp.engine import to_tokens
    from interp.graphs.interventions import feature_intervention

    tc = random_transcoders(gpt2_model)
    edits = [FeatureEdit(0, 1, pos=-1, value=2.0)]
    by_text = feature_intervention(gpt2_model, "a b c", tc, edits)
    by_ids = feature_intervention(gpt2_model, to_tokens(gpt2_model, "a b c")[0], tc, edits)
    assert torch.equal(by_text.logits, by_ids.logits)  # the same ids: the same operations
    frozen = frozen_feature_run(gpt2_model, "a b c", tc, edits)
    assert frozen.pre_activations.shape[1] == by_text.logits.shape[0]
    with pytest.raises(ValueError, match="of one prompt, got 2 rows"):
        feature_intervention(gpt2_model, torch.stack([TOKENS, TOKENS]), tc, edits)
