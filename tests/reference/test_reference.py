"""The from-scratch GPT-2 (interp.reference) against torch, the hooked model and run_cached.

Three layers of checks: each piece against an independent torch computation; the whole
model against TransformerLens's hooked model on the GPT-2 fixtures (every activation both
record, greedy generation); and the reference as the oracle for ``interp.engine.run_cached``.
Sensitivity tests show the tolerances are tight enough to catch a wrong reference.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from interp import load_model
from interp.engine import run_cached
from interp.models.loading import BUNDLED_DIR
from interp.reference import (
    GPT2,
    Attention,
    LayerNorm,
    ReferenceConfig,
    UnsupportedArchitectureError,
    gelu_new,
)
from tests.checkpoints import make_tokenizer

LOGITS_ATOL = 1e-4  # float32 through up to 12 layers; measured <= 1.1e-6 on the fixtures
PATTERN_ATOL = 1e-5  # probabilities; measured <= 2e-7
ACT_ATOL = 1e-5  # O(1) activations (resid, q/k/v, LN outputs) in float32; measured <= 3e-6
SCALE_ATOL = 1e-6  # LayerNorm scales are O(0.01-1); measured <= 1.2e-7
UNIT_ATOL = 1e-6  # one piece against torch's own op, single float32 rounding
MASKED_BELOW = -1e30  # TransformerLens masks scores with finfo.min (-3.4e38), not -inf

TINY_CFG = ReferenceConfig(
    d_model=32, n_heads=4, d_head=8, d_mlp=128, n_layers=2, n_ctx=16, d_vocab=50
)


def random_tokens(d_vocab: int, batch: int, pos: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", params=["gpt2_model", "gpt2_small_shaped_model"])
def pair(request):
    """(hooked model, reference loaded from it, tokens) for each GPT-2 fixture."""
    model = request.getfixturevalue(request.param)
    tokens = random_tokens(model.cfg.d_vocab, batch=2, pos=24, seed=1)
    return model, GPT2.from_hooked(model), tokens


@pytest.fixture(scope="module")
def tiny_pair(gpt2_model):
    return gpt2_model, GPT2.from_hooked(gpt2_model)


# ---- the pieces, against torch --------------------------------------------------------------


def test_config_is_frozen_and_validated():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TINY_CFG.d_model = 8  # type: ignore[misc]
    with pytest.raises(ValueError, match="n_heads must be a positive integer"):
        dataclasses.replace(TINY_CFG, n_heads=0)
    with pytest.raises(ValueError, match="eps must be a positive number"):
        dataclasses.replace(TINY_CFG, eps=0.0)
    small = ReferenceConfig.gpt2_small()
    assert (small.d_model, small.n_heads * small.d_head, small.d_mlp) == (768, 768, 3072)


def test_gelu_new_is_the_tanh_approximation():
    x = torch.linspace(-6, 6, 1001)
    torch.testing.assert_close(gelu_new(x), F.gelu(x, approximate="tanh"), atol=UNIT_ATOL, rtol=0)
    # and not the exact GELU, which differs by up to ~5e-4 on this range
    assert (gelu_new(x) - F.gelu(x)).abs().max() > 1e-4


def test_layernorm_matches_torch_with_eps_inside_the_root():
    torch.manual_seed(0)
    ln = LayerNorm(TINY_CFG, name="ln")
    with torch.no_grad():
        ln.w.copy_(1 + 0.3 * torch.randn(32))
        ln.b.copy_(0.1 * torch.randn(32))
    x = torch.randn(2, 5, 32) * 3 + 1
    cache: dict = {}
    out = ln(x, cache)
    expected = F.layer_norm(x, (32,), ln.w, ln.b, eps=TINY_CFG.eps)
    torch.testing.assert_close(out, expected, atol=UNIT_ATOL, rtol=0)
    variance = x.var(dim=-1, keepdim=True, unbiased=False)
    torch.testing.assert_close(cache["ln.hook_scale"], (variance + TINY_CFG.eps).sqrt())
    # a constant vector has zero variance: eps keeps the division finite, the output is b
    constant = torch.full((1, 1, 32), 7.0)
    torch.testing.assert_close(ln(constant)[0, 0], ln.b.detach())


def test_attention_matches_torch_sdpa():
    torch.manual_seed(0)
    attn = Attention(TINY_CFG, name="attn")
    with torch.no_grad():
        for p in (attn.b_Q, attn.b_K, attn.b_V, attn.b_O):
            p.normal_(0, 0.1)
        for p in (attn.W_Q, attn.W_K):
            p.mul_(20)  # sharp patterns, so a mask or scale error shows
    x = torch.randn(2, 7, 32)
    cache: dict = {}
    out = attn(x, cache)
    q, k, v = (cache[f"attn.hook_{n}"].transpose(1, 2) for n in "qkv")  # [batch head pos d_head]
    z = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    expected = z.flatten(2) @ attn.W_O.flatten(0, 1) + attn.b_O
    torch.testing.assert_close(out, expected, atol=UNIT_ATOL, rtol=0)
    pattern, scores = cache["attn.hook_pattern"], cache["attn.hook_attn_scores"]
    future = torch.triu(torch.ones(7, 7, dtype=torch.bool), diagonal=1)
    assert torch.isneginf(scores[..., future]).all() and torch.isfinite(scores[..., ~future]).all()
    assert (pattern[..., future] == 0).all()
    torch.testing.assert_close(pattern.sum(-1), torch.ones(2, 4, 7))
    assert pattern.max() > 0.9  # the patterns really are sharp
    # each head's write, summed over heads, plus b_O, is the layer's output
    torch.testing.assert_close(
        cache["attn.hook_result"].sum(2) + attn.b_O, out, atol=UNIT_ATOL, rtol=0
    )


def test_model_is_causal():
    torch.manual_seed(0)
    ref = GPT2(TINY_CFG).eval()
    tokens = random_tokens(50, 1, 10)
    changed = tokens.clone()
    changed[0, 6] = (changed[0, 6] + 1) % 50
    a, b = ref(tokens), ref(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=0, rtol=0)
    assert (a[:, 6:] - b[:, 6:]).abs().max() > 1e-4


def test_bad_tokens_are_refused_clearly():
    ref = GPT2(TINY_CFG)
    with pytest.raises(ValueError, match="context is 16"):
        ref(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match=r"must lie in \[0, 49\]"):
        ref(torch.tensor([[3, 50]]))
    with pytest.raises(ValueError, match="integer ids"):
        ref(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="exceed the context"):
        ref.generate_greedy(torch.zeros(1, 10, dtype=torch.long), 7)


# ---- against the hooked model ---------------------------------------------------------------


def test_logits_patterns_and_residual_streams_match_the_hooked_model(pair):
    model, ref, tokens = pair
    logits, cache = ref.run_with_cache(tokens)
    hooked_logits, hooked = model.run_with_cache(tokens)
    assert (logits - hooked_logits).abs().max() <= LOGITS_ATOL
    shared = [name for name in cache if name in hooked]
    # everything the reference records except per-head results, which the bridge gates
    assert set(cache) - set(shared) == {
        f"blocks.{i}.attn.hook_result" for i in range(model.cfg.n_layers)
    }
    for name in shared:
        ours, theirs = cache[name], hooked[name]
        assert ours.shape == theirs.shape, name
        if name.endswith("hook_attn_scores"):
            masked = torch.isneginf(ours)
            assert (theirs[masked] < MASKED_BELOW).all(), name
            ours, theirs = ours[~masked], theirs[~masked]
        atol = {"hook_pattern": PATTERN_ATOL, "hook_scale": SCALE_ATOL}.get(
            name.rsplit(".", 1)[-1], ACT_ATOL
        )
        assert (ours - theirs).abs().max() <= atol, name


@pytest.mark.parametrize(
    "fixture", ["gpt2", pytest.param("gpt2_small_shaped", marks=pytest.mark.slow)]
)
def test_from_pretrained_dir_reads_exactly_the_hooked_weights(request, fixture):
    """Splitting the fused Conv1D c_attn [d_model, 3 d_model] gives the bridge's W_Q/K/V."""
    directory = request.getfixturevalue(f"{fixture}_dir")
    model = request.getfixturevalue(f"{fixture}_model")
    from_dir = GPT2.from_pretrained_dir(directory).state_dict()
    from_hooked = GPT2.from_hooked(model).state_dict()
    assert from_dir.keys() == from_hooked.keys()
    for name in from_dir:
        assert torch.equal(from_dir[name], from_hooked[name]), name


@pytest.fixture(scope="module")
def untied_dir(tmp_path_factory):
    """A GPT-2 with its own lm_head (not W_E^T) and larger weights (init std 0.3), so that
    greedy decoding wanders over many tokens instead of repeating one."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(3)
    tokenizer = make_tokenizer(400)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=False,
        initializer_range=0.3,
    )
    directory = tmp_path_factory.mktemp("gpt2-untied")
    GPT2LMHeadModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def untied_pair(untied_dir):
    """(hooked model, reference read from the directory) of the untied GPT-2."""
    return load_model(untied_dir, device="cpu"), GPT2.from_pretrained_dir(untied_dir)


def test_untied_unembedding_is_read_from_lm_head(untied_pair):
    model, ref = untied_pair
    assert (ref.unembed.W_U - ref.embed.W_E.T).abs().max() > 0.01  # really untied
    tokens = random_tokens(model.cfg.d_vocab, 2, 20)
    assert (ref(tokens) - model(tokens)).abs().max() <= LOGITS_ATOL
    from_hooked = GPT2.from_hooked(model).state_dict()
    for name, value in ref.state_dict().items():
        assert torch.equal(value, from_hooked[name]), name


def test_a_folded_hooked_model_is_reproduced_too(gpt2_compat_model):
    model = gpt2_compat_model
    ref = GPT2.from_hooked(model)
    assert torch.equal(ref.blocks[0].ln1.w, torch.ones(64))  # the LN weights moved into W_Q...
    tokens = random_tokens(model.cfg.d_vocab, 2, 20)
    assert (ref(tokens) - model(tokens)).abs().max() <= LOGITS_ATOL


def _hooked_greedy(model, tokens: torch.Tensor, n: int) -> tuple[torch.Tensor, float]:
    """Greedy decoding by repeated argmax over the hooked model's logits, and the smallest
    gap between the top two logits (an agreement decided by less than LOGITS_ATOL is luck)."""
    gaps = []
    with torch.inference_mode():
        for _ in range(n):
            last = model(tokens, return_type="logits")[:, -1]
            top2 = last.topk(2, dim=-1).values
            gaps.append((top2[:, 0] - top2[:, 1]).min().item())
            tokens = torch.cat([tokens, last.argmax(-1, keepdim=True)], dim=1)
    return tokens, min(gaps)


@pytest.mark.parametrize(
    "fixture, n",
    [("gpt2_model", 12), pytest.param("gpt2_small_shaped_model", 6, marks=pytest.mark.slow)],
)
def test_greedy_generation_matches_the_hooked_model(request, fixture, n):
    model = request.getfixturevalue(fixture)
    ref = GPT2.from_hooked(model)
    prompt = random_tokens(model.cfg.d_vocab, 2, 8, seed=5)
    expected, min_gap = _hooked_greedy(model, prompt, n)
    assert min_gap > 10 * LOGITS_ATOL, "near-tie in the hooked model's argmax: pick another seed"
    assert torch.equal(ref.generate_greedy(prompt, n), expected)


def test_greedy_generation_over_varied_tokens_matches_the_hooked_model(untied_pair):
    model, ref = untied_pair
    prompt = random_tokens(model.cfg.d_vocab, 2, 8, seed=5)
    expected, min_gap = _hooked_greedy(model, prompt, 16)
    assert min_gap > 10 * LOGITS_ATOL, "near-tie in the hooked model's argmax: pick another seed"
    generated = ref.generate_greedy(prompt, 16)
    assert torch.equal(generated, expected)
    assert all(len(set(row)) >= 5 for row in generated[:, 8:].tolist())  # not one repeated token


def test_greedy_generation_from_text(tiny_pair):
    model, ref = tiny_pair
    prompt = model.to_tokens("When Mary and John went to the store")  # BOS prepended
    expected, _ = _hooked_greedy(model, prompt, 6)
    assert torch.equal(ref.generate_greedy(prompt, 6), expected)


def test_the_tolerances_catch_a_wrong_reference(tiny_pair):
    """A reference with one realistic bug must fail the checks above (no vacuous test)."""
    model, ref = tiny_pair
    tokens = random_tokens(model.cfg.d_vocab, 2, 24, seed=1)
    hooked_logits, hooked = model.run_with_cache(tokens)
    no_ln_weights = copy.deepcopy(ref)
    with torch.no_grad():
        for block in no_ln_weights.blocks:
            block.ln1.w.fill_(1.0)
    assert (no_ln_weights(tokens) - hooked_logits).abs().max() > 100 * LOGITS_ATOL
    swapped_heads = copy.deepcopy(ref)
    with torch.no_grad():
        swapped_heads.blocks[0].attn.W_K[[0, 1]] = swapped_heads.blocks[0].attn.W_K[[1, 0]]
    _, cache = swapped_heads.run_with_cache(tokens)
    pattern_error = cache["blocks.0.attn.hook_pattern"] - hooked["blocks.0.attn.hook_pattern"]
    assert pattern_error.abs().max() > 100 * PATTERN_ATOL


# ---- the reference as the oracle for interp.engine.run_cached ------------------------------


def test_run_cached_matches_the_reference(pair):
    model, ref, tokens = pair
    logits, cache = ref.run_with_cache(tokens)
    run = run_cached(
        model,
        tokens,
        resid=("pre", "mid", "post"),
        patterns=True,
        scores=True,
        head_outputs=True,
        ln_scales=True,
    )
    n_layers = model.cfg.n_layers

    def stacked(suffix: str) -> torch.Tensor:  # [layer ...], the layout CachedRun returns
        return torch.stack([cache[f"blocks.{layer}.{suffix}"] for layer in range(n_layers)])

    assert torch.equal(run.tokens, tokens)
    assert (run.logits - logits).abs().max() <= LOGITS_ATOL
    for kind in ("pre", "mid", "post"):
        assert (run.resid(kind) - stacked(f"hook_resid_{kind}")).abs().max() <= ACT_ATOL, kind
    assert (run.patterns() - stacked("attn.hook_pattern")).abs().max() <= PATTERN_ATOL
    ours, theirs = stacked("attn.hook_attn_scores"), run.scores()
    masked = torch.isneginf(ours)  # the same entries must be masked, by finfo.min there
    assert masked.any() and (theirs[masked] < MASKED_BELOW).all()
    assert (theirs[~masked] > MASKED_BELOW).all()
    assert (ours[~masked] - theirs[~masked]).abs().max() <= ACT_ATOL
    heads = run.head_outputs()  # [layer batch pos head d_model]
    assert (heads - stacked("attn.hook_result")).abs().max() <= ACT_ATOL
    b_O = torch.stack([block.attn.b_O.detach() for block in ref.blocks])  # [layer d_model]
    attn_out = heads.sum(dim=3) + b_O[:, None, None, :]
    assert (attn_out - stacked("hook_attn_out")).abs().max() <= ACT_ATOL
    for ln in ("ln1", "ln2"):
        assert (run.ln_scales(ln) - stacked(f"{ln}.hook_scale")).abs().max() <= SCALE_ATOL, ln
    assert (run["ln_final.hook_scale"] - cache["ln_final.hook_scale"]).abs().max() <= SCALE_ATOL


def test_run_cached_layer_subset_is_indexed_right(tiny_pair):
    model, ref = tiny_pair
    tokens = random_tokens(model.cfg.d_vocab, 1, 12, seed=2)
    _, cache = ref.run_with_cache(tokens)
    run = run_cached(model, tokens, resid=("post",), patterns=True, layers=[1])
    assert run.layers == (1,)
    assert (run.resid("post")[0] - cache["blocks.1.hook_resid_post"]).abs().max() <= ACT_ATOL
    assert (run.patterns()[0] - cache["blocks.1.attn.hook_pattern"]).abs().max() <= PATTERN_ATOL


def test_run_cached_head_ablation_matches_zeroing_W_O_in_the_reference(tiny_pair):
    """Zeroing head 2's z in layer 0 through run_cached equals removing its W_O here."""
    model, ref = tiny_pair
    tokens = random_tokens(model.cfg.d_vocab, 2, 16, seed=3)
    ablated = copy.deepcopy(ref)
    with torch.no_grad():
        ablated.blocks[0].attn.W_O[2] = 0.0

    def zero_head_2(z, hook):
        z = z.clone()
        z[:, :, 2] = 0.0
        return z

    run = run_cached(model, tokens, interventions=[("blocks.0.attn.hook_z", zero_head_2)])
    assert (run.logits - ablated(tokens)).abs().max() <= LOGITS_ATOL
    assert (run.logits - ref(tokens)).abs().max() > 100 * LOGITS_ATOL  # the ablation mattered


# ---- refusals --------------------------------------------------------------------------------


def test_rotary_neox_hooked_model_is_refused(neox_model):
    with pytest.raises(UnsupportedArchitectureError, match="GPT-2 only") as info:
        GPT2.from_hooked(neox_model)
    assert "rotary" in str(info.value) and "GPTNeoXForCausalLM" in str(info.value)


def test_rotary_neox_checkpoint_is_refused(neox_dir):
    with pytest.raises(UnsupportedArchitectureError, match="GPT-2 only") as info:
        GPT2.from_pretrained_dir(neox_dir)
    assert "'gpt_neox'" in str(info.value) and "rotary" in str(info.value)


@pytest.mark.skipif(
    not (BUNDLED_DIR / "tiny-induction" / "config.json").is_file(),
    reason="the bundled model is not installed in this checkout",
)
def test_bundled_model_is_refused():
    with pytest.raises(UnsupportedArchitectureError, match="GPT-2 only"):
        GPT2.from_pretrained_dir(BUNDLED_DIR / "tiny-induction")
    with pytest.raises(UnsupportedArchitectureError, match="GPT-2 only"):
        GPT2.from_hooked(load_model("tiny-induction", device="cpu"))


def test_gpt2_variants_the_reference_does_not_implement_are_refused(gpt2_dir, tmp_path):
    config = json.loads((gpt2_dir / "config.json").read_text())
    for change, expected in (
        ({"activation_function": "relu"}, "'relu'"),
        ({"scale_attn_by_inverse_layer_idx": True}, "1/\\(layer \\+ 1\\)"),
    ):
        (tmp_path / "config.json").write_text(json.dumps(config | change))
        with pytest.raises(UnsupportedArchitectureError, match=expected):
            GPT2.from_pretrained_dir(tmp_path)


def test_incomplete_checkpoint_directories_are_refused(gpt2_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        GPT2.from_pretrained_dir(tmp_path)
    (tmp_path / "config.json").write_text((gpt2_dir / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="safetensors only"):
        GPT2.from_pretrained_dir(tmp_path)
