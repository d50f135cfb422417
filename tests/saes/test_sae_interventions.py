"""Feature interventions: zero-ablating or patching one SAE feature equals the stream the SAE
writes with that feature replaced (decode of the edited features plus the error), computed in
a plain TransformerLens hook; a feature at 0 ablated changes nothing; bad input refused."""

from __future__ import annotations

import pytest
import torch

from interp import FeatureEdit, intervene, load_sae, run_cached
from interp.saes.interventions import ablate_feature, patch_feature

ATOL = 1e-5  # float32 logits of a 2-layer model
CLEAN = "x = len(self); y = len("
CORRUPTED = "x = len(args); y = len("
HOOK = "blocks.1.hook_resid_pre"


@pytest.fixture(scope="module")
def sae():
    return load_sae("tiny-induction-sae")


def _by_decoding(model, sae, tokens, feature, values, pos):
    """Logits with the activation at the hook rebuilt as decode(f edited) + (x - decode(f))."""

    def hook(x, hook):
        f = sae.encode(x)
        edited = f.clone()
        where = slice(None) if pos is None else pos
        edited[:, where, feature] = values[:, where]
        return sae.decode(edited) + (x - sae.decode(f))

    with torch.no_grad():
        return model.run_with_hooks(tokens, fwd_hooks=[(HOOK, hook)])


def _active(model, sae, prompt, pos):
    acts = run_cached(model, prompt, saes=[sae])[f"{HOOK}.hook_sae_acts"]
    return acts, int(acts[0, pos].argmax())


@pytest.mark.parametrize("pos", [None, -1])
def test_zero_ablation_equals_decoding_without_the_feature(bundled_model, sae, pos):
    acts, feature = _active(bundled_model, sae, CLEAN, -1)
    tokens = run_cached(bundled_model, CLEAN).tokens
    ablated = run_cached(
        bundled_model, CLEAN, interventions=[ablate_feature(sae, feature, pos=pos)]
    )
    zeros = torch.zeros(acts.shape[:2])
    expected = _by_decoding(bundled_model, sae, tokens, feature, zeros, pos)
    assert torch.allclose(ablated.logits, expected, atol=ATOL)
    plain = run_cached(bundled_model, CLEAN).logits
    assert not torch.allclose(ablated.logits, plain, atol=1e-3)  # the feature mattered


def test_patching_a_feature_from_the_clean_run(bundled_model, sae):
    clean_acts, feature = _active(bundled_model, sae, CLEAN, -1)
    source = clean_acts[..., feature]
    edit = patch_feature(sae, feature, source, pos=-1)
    patched = run_cached(bundled_model, CORRUPTED, interventions=[edit])
    tokens = run_cached(bundled_model, CORRUPTED).tokens
    expected = _by_decoding(bundled_model, sae, tokens, feature, source, -1)
    assert torch.allclose(patched.logits, expected, atol=ATOL)
    with intervene(bundled_model, [edit]), torch.no_grad():  # the same through intervene
        assert torch.allclose(bundled_model(tokens), expected, atol=ATOL)


def test_ablating_a_feature_that_is_zero_changes_nothing(bundled_model, sae):
    acts, _ = _active(bundled_model, sae, CLEAN, -1)
    silent = int(torch.nonzero(acts[0].amax(0) == 0)[0])
    plain = run_cached(bundled_model, CLEAN).logits
    ablated = run_cached(bundled_model, CLEAN, interventions=[ablate_feature(sae, silent)])
    assert torch.equal(ablated.logits, plain)


def test_bad_features_and_positions_are_refused(bundled_model, sae):
    with pytest.raises(ValueError, match="0 .. 511"):
        ablate_feature(sae, 512)
    with pytest.raises(ValueError, match="the prompt has 11 positions") as info:
        run_cached(bundled_model, CLEAN, interventions=[FeatureEdit(sae, 3, pos=40)])
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="one number or"):
        run_cached(bundled_model, CLEAN, interventions=[patch_feature(sae, 3, torch.zeros(2, 3))])
