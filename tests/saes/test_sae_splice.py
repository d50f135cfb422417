"""SAEs spliced into run_cached: with the error term the run is the model's own; without it,
the run a plain hook replacing the activation by the reconstruction gives; features cached
under ``hook_sae_acts``; memory estimates count them; misfits refused before running."""

from __future__ import annotations

import pytest
import torch

from interp import estimate_cache_bytes, load_sae, run_cached
from interp.engine import MemoryBudgetError
from interp.saes.sae import SAE

ATOL = 1e-5  # float32 logits of a 2-layer model
PROMPT = "def f(x):\n    return x + x"
HOOK = "blocks.1.hook_resid_pre"


@pytest.fixture(scope="module")
def sae():
    return load_sae("tiny-induction-sae")


def test_with_the_error_term_the_logits_are_the_models(bundled_model, sae):
    plain = run_cached(bundled_model, PROMPT)
    spliced = run_cached(bundled_model, PROMPT, saes=[sae])
    assert torch.allclose(spliced.logits, plain.logits, atol=ATOL)
    acts = spliced[f"{HOOK}.hook_sae_acts"]
    assert acts.shape == (*spliced.tokens.shape, 512)
    resid = run_cached(bundled_model, PROMPT, hooks=[HOOK])[HOOK]
    assert torch.equal(acts, sae.encode(resid).detach())
    assert ((acts > 0).sum(-1) <= 16).all()  # TopK k=16


def test_without_the_error_term_the_run_is_the_reconstructions(bundled_model, sae):
    tokens = run_cached(bundled_model, PROMPT).tokens
    with torch.no_grad():
        expected = bundled_model.run_with_hooks(tokens, fwd_hooks=[(HOOK, lambda x, hook: sae(x))])
    spliced = run_cached(bundled_model, PROMPT, saes=[sae], use_error_term=False)
    assert torch.allclose(spliced.logits, expected, atol=ATOL)
    plain = run_cached(bundled_model, PROMPT)
    assert not torch.allclose(spliced.logits, plain.logits, atol=1e-3)  # it does change them


def test_a_cached_hook_at_the_sae_is_what_the_model_read(bundled_model, sae):
    resid = run_cached(bundled_model, PROMPT, hooks=[HOOK])[HOOK]
    spliced = run_cached(bundled_model, PROMPT, hooks=[HOOK], saes=[sae], use_error_term=False)
    assert torch.allclose(spliced[HOOK], sae(resid), atol=ATOL)


def test_estimates_count_the_feature_activations(bundled_model, sae):
    plain = estimate_cache_bytes(bundled_model, (3, 20))
    with_sae = estimate_cache_bytes(bundled_model, (3, 20), saes=[sae])
    assert with_sae - plain == 3 * 20 * 512 * 4
    need = estimate_cache_bytes(bundled_model, (1, 12), saes=[sae])
    with pytest.raises(MemoryBudgetError, match="sae_acts"):
        run_cached(bundled_model, "a" * 200, saes=[sae], max_bytes=need)


def test_misfits_are_refused_in_one_line(bundled_model, sae):
    weights = (sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec)
    elsewhere = SAE(*weights, architecture="topk", k=16, hook_name="blocks.7.hook_resid_pre")
    with pytest.raises(ValueError, match="no hook for") as info:
        run_cached(bundled_model, PROMPT, saes=[elsewhere])
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="two SAEs read"):
        run_cached(bundled_model, PROMPT, saes=[sae, sae])
    g = torch.Generator().manual_seed(0)
    narrow = SAE(
        torch.randn(8, 4, generator=g), torch.zeros(4), torch.randn(4, 8, generator=g),
        torch.zeros(8), hook_name=HOOK,
    )  # fmt: skip
    with pytest.raises(ValueError, match="d_in=8.*width 64"):
        run_cached(bundled_model, PROMPT, saes=[narrow])
