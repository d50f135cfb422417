"""Direct logit attribution with SAE features: the feature, b_dec and error rows replace the
components before the SAE's layer and add up to what they replace; with the later rows they
add up to the logit difference; each feature row equals an independent computation from the
unfolded model's own final norm and unembedding."""

from __future__ import annotations

import pytest
import torch

from interp import load_sae, run_cached
from interp.attribution.features import feature_attribution
from interp.models.layernorm import fold_layernorm
from interp.saes.sae import SAE

PROMPT = "def f(x):\n    return x + x\n\nclass A:\n    def g(self):\n        return self.g"
ATOL = 1e-4  # float32 logits of a few units, summed over a few dozen rows


def _random_sae(model, layer: int, seed: int = 0) -> SAE:
    d = int(model.cfg.d_model)
    g = torch.Generator().manual_seed(seed)
    return SAE(
        torch.randn(d, 48, generator=g) / d**0.5, torch.zeros(48),
        torch.randn(48, d, generator=g) / 48**0.5, torch.randn(d, generator=g) * 0.1,
        hook_name=f"blocks.{layer}.hook_resid_pre", apply_b_dec_to_input=True,
    )  # fmt: skip


def _independent(model, tokens, sae, answer: int, wrong: int) -> torch.Tensor:
    """Each feature's contribution from the unfolded model: f_j W_dec[j] through ln_final with
    its scale from the run, its weight, and W_U[:, answer] - W_U[:, wrong]."""
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
        x = cache[sae.hook_name][0, -1]
        scale = cache["ln_final.hook_scale"][0, -1].double()
        f = sae.encode(x).double()
    final = model.ln_final
    rms = bool(getattr(final, "uses_rms_norm", False))
    w = final.weight.detach().double()
    w = 1 + w if getattr(final, "uses_weight_offset", False) else w
    u = (model.W_U[:, answer] - model.W_U[:, wrong]).detach().double()
    vectors = f[:, None] * sae.W_dec.detach().double()  # [d_sae d_model]
    if not rms:
        vectors = vectors - vectors.mean(-1, keepdim=True)
    return vectors / scale @ (w * u)


def _check(model, prompt, sae, answer, wrong):
    frame = feature_attribution(model, prompt, sae, answer, wrong=wrong)
    total = float(frame.loc[frame["component"] == "total", "contribution"].iloc[0])
    rows = frame[frame["component"] != "total"]["contribution"].sum()
    assert rows == pytest.approx(total, abs=ATOL)
    logits = run_cached(model, prompt).logits[0, -1]
    assert total == pytest.approx(float(logits[answer] - logits[wrong]), abs=ATOL)
    tokens = run_cached(model, prompt).tokens
    expected = _independent(model, tokens, sae, answer, wrong)
    features = frame[frame["component"] == "sae_feature"]
    assert len(features) > 0
    got = torch.tensor(features["contribution"].to_numpy())
    assert torch.allclose(got, expected[features["feature"].to_numpy(dtype=int)], atol=ATOL)
    active = set(torch.nonzero(expected != 0).flatten().tolist())
    assert set(features["feature"].astype(int)) >= active  # an inactive feature has no row
    layer = int(sae.hook_name.split(".")[1])
    kept = frame[frame["layer"].notna() & ~frame["component"].str.startswith("sae_")]
    assert (kept["layer"] >= layer).all() and not frame["component"].isin(["embed"]).any()
    return frame


def test_the_bundled_sae_rows_add_up(bundled_model):
    sae = load_sae("tiny-induction-sae")
    frame = _check(bundled_model, PROMPT, sae, 5, 9)
    assert ((frame["component"] == "sae_feature").sum()) <= 16  # TopK k=16
    assert frame.attrs["sae_identity_error"] < 1e-4


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gpt_neox_parallel"])
@pytest.mark.parametrize("layer", [0, 1])
def test_random_saes_on_zoo_models(zoo, arch, layer):
    model = zoo.model(arch)
    tokens = torch.randint(
        3, int(model.cfg.d_vocab), (1, 9), generator=torch.Generator().manual_seed(1)
    )
    _check(model, tokens, _random_sae(model, layer), 5, 7)


def test_gemma2_post_norms_add_up(zoo):
    model = zoo.model("gemma2")
    tokens = torch.randint(
        3, int(model.cfg.d_vocab), (1, 9), generator=torch.Generator().manual_seed(1)
    )
    frame = feature_attribution(model, tokens, _random_sae(model, 1), 5, wrong=7)
    total = float(frame.loc[frame["component"] == "total", "contribution"].iloc[0])
    assert frame[frame["component"] != "total"]["contribution"].sum() == pytest.approx(
        total, abs=ATOL
    )


def test_other_hooks_and_folded_models_are_refused(bundled_model):
    sae = load_sae("tiny-induction-sae")
    mid = SAE(sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec, architecture="topk", k=16,
              hook_name="blocks.1.hook_resid_mid")  # fmt: skip
    with pytest.raises(ValueError, match="hook_resid_pre"):
        feature_attribution(bundled_model, PROMPT, mid, 5)
    with pytest.raises(ValueError, match="unfolded model"):
        feature_attribution(fold_layernorm(bundled_model), PROMPT, sae, 5)
