"""fold_layernorm: a new model, with the LayerNorms really folded, computing the same log-probs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from interp.models.layernorm import (
    FoldError,
    check_foldable,
    fold_info,
    fold_layernorm,
    is_folded,
)

# float32 forward passes of a 2-layer model agree to ~1e-6 after exact refactoring of weights
LOGPROB_ATOL = 1e-5
# a weight that is centred in float32 has a mean of rounding size
CENTRED_ATOL = 1e-6

ARCHS = ["gpt2_model", "neox_model"]


def random_prompts(model, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    d_vocab = int(model.cfg.d_vocab)
    return [
        torch.randint(0, d_vocab, (batch, n), generator=generator)
        for batch, n in ((1, 1), (3, 17), (2, int(model.cfg.n_ctx)))
    ]


def logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(tokens, return_type="logits").double()


def ln_params(model) -> list[torch.Tensor]:
    params = [
        p
        for name, p in model.state_dict().items()
        if name.split(".")[-2] in ("ln1", "ln2", "ln_final")
    ]
    assert len(params) == 2 * (2 * int(model.cfg.n_layers) + 1)  # weight and bias of each
    return params


@pytest.mark.parametrize("arch", ARCHS + ["neox_parallel_model"])
def test_fold_keeps_log_probs(arch, request):
    model = request.getfixturevalue(arch)
    # the fold is only exercised if the LayerNorms are not the identity to begin with
    assert not any(torch.allclose(p, torch.ones_like(p)) or not p.any() for p in ln_params(model))
    folded = fold_layernorm(model)
    worst = 0.0
    for tokens in random_prompts(model):
        before, after = logits(model, tokens), logits(folded, tokens)
        worst = max(worst, float((before.log_softmax(-1) - after.log_softmax(-1)).abs().max()))
        # centring the unembedding shifts every logit at a position by the same constant
        shift = before - after
        assert torch.allclose(shift, shift[..., :1].expand_as(shift), atol=LOGPROB_ATOL)
    assert worst <= LOGPROB_ATOL, worst


@pytest.mark.slow
def test_fold_keeps_log_probs_gpt2_small_shaped(gpt2_small_shaped_model):
    model = gpt2_small_shaped_model
    folded = fold_layernorm(model)
    tokens = random_prompts(model)[1]
    before, after = logits(model, tokens), logits(folded, tokens)
    # 12 layers of float32: rounding stays below LOGPROB_ATOL still
    assert float((before.log_softmax(-1) - after.log_softmax(-1)).abs().max()) <= LOGPROB_ATOL


@pytest.mark.parametrize("arch", ARCHS)
def test_folded_weights_are_folded_and_centred(arch, request):
    folded = fold_layernorm(request.getfixturevalue(arch))
    for param in ln_params(folded):  # weights 1, biases 0: only the normalisation is left
        assert torch.allclose(param, torch.full_like(param, float(param.flatten()[0])))
        assert float(param.flatten()[0]) in (0.0, 1.0)
    for name in ("W_O", "W_out", "W_E"):  # writing weights have no mean over d_model
        assert float(getattr(folded, name).detach().mean(-1).abs().max()) <= CENTRED_ATOL, name
    assert float(folded.W_U.detach().mean(-1).abs().max()) <= CENTRED_ATOL  # over the vocab
    assert float(folded.b_U.detach().mean().abs()) <= CENTRED_ATOL
    assert is_folded(folded) and fold_info(folded).center_unembed


@pytest.mark.parametrize("arch", ARCHS)
def test_input_model_is_left_unchanged(arch, request):
    model = request.getfixturevalue(arch)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    tokens = random_prompts(model)[1]
    before = logits(model, tokens)
    folded = fold_layernorm(model)
    logits(folded, tokens)  # running the copy must not touch the original either
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert torch.equal(before, logits(model, tokens))
    assert not model._weights_processed and not model.compatibility_mode and not is_folded(model)
    assert folded.cfg is not model.cfg
    check_foldable(model)  # and it can still be folded again


@pytest.mark.parametrize("arch", ARCHS)
def test_fold_info_is_the_removed_mean_logit(arch, request):
    """FoldInfo is computed from the original weights; check it against the logits' mean."""
    model = request.getfixturevalue(arch)
    folded = fold_layernorm(model)
    tokens = random_prompts(model)[1]
    resid = {}

    def keep(act, hook):
        resid["x"] = act.detach()

    with torch.inference_mode(), folded.hooks(fwd_hooks=[("ln_final.hook_normalized", keep)]):
        folded(tokens)
    mean_logit = fold_info(folded).mean_logit(resid["x"])  # [batch pos]
    before, after = logits(model, tokens), logits(folded, tokens)
    assert torch.allclose(mean_logit, before.mean(-1), atol=LOGPROB_ATOL)
    assert torch.allclose(after + mean_logit[..., None], before, atol=LOGPROB_ATOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_fold_without_centring_the_unembedding_keeps_logits(arch, request):
    model = request.getfixturevalue(arch)
    folded = fold_layernorm(model, center_unembed=False)
    tokens = random_prompts(model)[1]
    assert float((logits(model, tokens) - logits(folded, tokens)).abs().max()) <= LOGPROB_ATOL
    info = fold_info(folded)
    assert not info.center_unembed and info.unembed_bias_mean == 0.0
    assert not info.unembed_mean.any()


def test_folding_twice_is_refused(gpt2_model):
    folded = fold_layernorm(gpt2_model)
    with pytest.raises(FoldError, match="already folded"):
        fold_layernorm(folded)


def test_a_model_processed_by_transformer_lens_is_refused(gpt2_model):
    from interp.models.layernorm import _clone

    processed = _clone(gpt2_model)
    processed.enable_compatibility_mode(disable_warnings=True)
    with pytest.raises(FoldError, match="already processed by TransformerLens"):
        fold_layernorm(processed)


def fake_bridge(**cfg) -> SimpleNamespace:
    defaults = dict(normalization_type="LN", output_logits_soft_cap=None)
    return SimpleNamespace(
        enable_compatibility_mode=None,
        adapter=SimpleNamespace(),
        cfg=SimpleNamespace(**(defaults | cfg)),
        _weights_processed=False,
        W_U=None,
        ln_final=None,
    )


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (dict(normalization_type=None), "no LayerNorm"),
        (dict(normalization_type="LNPre"), "already folded"),
        (dict(normalization_type="RMSPre"), "RMSNorms have no weights"),
        (dict(normalization_type="LN2"), "unsupported normalization_type"),
    ],
)
def test_unfoldable_configurations_are_refused(cfg, message):
    with pytest.raises(FoldError, match=message):
        check_foldable(fake_bridge(**cfg))
    check_foldable(fake_bridge())  # the same fake with LayerNorm passes


def test_post_ln_adapter_is_refused():
    bridge = fake_bridge()
    bridge.adapter.supports_fold_ln = False
    with pytest.raises(FoldError, match="does not support LayerNorm folding"):
        check_foldable(bridge)


def test_not_a_bridge_is_refused():
    with pytest.raises(FoldError, match="TransformerBridge"):
        fold_layernorm(torch.nn.Linear(2, 2))


def test_a_fold_that_changes_the_output_is_caught(gpt2_model, monkeypatch):
    """verify=True compares the copy with the original; simulate a wrong fold."""
    import interp.models.layernorm as layernorm

    real_clone = layernorm._clone

    def clone_then_break(model):
        copy = real_clone(model)
        with torch.no_grad():
            copy.blocks[0].ln2.weight.mul_(1.5)  # as if one LayerNorm were dropped by the fold
        return copy

    monkeypatch.setattr(layernorm, "_clone", clone_then_break)
    with pytest.raises(FoldError, match="changed the model's log-probabilities"):
        fold_layernorm(gpt2_model)
    assert not is_folded(gpt2_model)
