"""run_cached: identities against the forward pass, what is kept, bad prompts, hook hygiene."""

from __future__ import annotations

import pytest
import torch

from interp import PromptError, run_cached
from interp.engine import to_tokens

ATOL = 1e-5  # float32, a few d_model=64 matmuls


@pytest.fixture(scope="module")
def tokens(gpt2_model):
    text = to_tokens(gpt2_model, "The cat sat on the mat.")
    noise = torch.randint(
        1, gpt2_model.cfg.d_vocab, text.shape, generator=torch.Generator().manual_seed(0)
    )
    return torch.cat([text, noise])


def test_head_outputs_sum_to_attention_output(gpt2_model, tokens):
    layers = range(gpt2_model.cfg.n_layers)
    run = run_cached(
        gpt2_model,
        tokens,
        head_outputs=True,
        hooks=[f"blocks.{layer}.hook_attn_out" for layer in layers],
    )
    per_head = run.head_outputs()  # [layer batch pos head d_model]
    for layer in layers:
        summed = per_head[layer].sum(dim=2) + gpt2_model.b_O[layer]
        assert torch.allclose(summed, run[f"blocks.{layer}.hook_attn_out"], atol=ATOL)


def test_scores_are_scaled_q_dot_k(gpt2_model, tokens):
    n_layers = gpt2_model.cfg.n_layers
    hooks = [f"blocks.{layer}.attn.hook_{x}" for layer in range(n_layers) for x in "qk"]
    run = run_cached(gpt2_model, tokens, scores=True, patterns=True, hooks=hooks)
    causal = torch.tril(torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool))
    for layer in range(n_layers):
        q, k = run[f"blocks.{layer}.attn.hook_q"], run[f"blocks.{layer}.attn.hook_k"]
        expected = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
        scores = run.scores()[layer]
        assert torch.allclose(scores[..., causal], expected[..., causal], atol=ATOL)
        # the pattern is the softmax of the masked scores
        masked = expected.masked_fill(~causal, float("-inf"))
        assert torch.allclose(run.patterns()[layer], masked.softmax(-1), atol=ATOL)


def test_residual_stream_adds_up(gpt2_model, tokens):
    names = [f"blocks.{layer}.hook_{x}_out" for layer in range(2) for x in ("attn", "mlp")]
    run = run_cached(gpt2_model, tokens, resid=("pre", "mid", "post"), hooks=names)
    for layer in range(2):
        mid = run.resid("pre")[layer] + run[f"blocks.{layer}.hook_attn_out"]
        post = run.resid("mid")[layer] + run[f"blocks.{layer}.hook_mlp_out"]
        assert torch.allclose(mid, run.resid("mid")[layer], atol=ATOL)
        assert torch.allclose(post, run.resid("post")[layer], atol=ATOL)


def test_ln_scale_is_the_norm_of_the_centred_residual(gpt2_model, tokens):
    run = run_cached(gpt2_model, tokens, resid=("pre",), ln_scales=True)
    x = run.resid("pre")[0]
    centred = x - x.mean(-1, keepdim=True)
    expected = (centred.pow(2).mean(-1, keepdim=True) + gpt2_model.cfg.eps).sqrt()
    assert torch.allclose(run.ln_scales("ln1")[0], expected, atol=ATOL)
    assert "ln_final.hook_scale" in run.activations


def test_logits_equal_a_plain_forward_pass(gpt2_model, tokens):
    run = run_cached(gpt2_model, tokens, patterns=True)
    # run_cached passes use_cache=False (no KV cache); Hugging Face's cached path builds its
    # attention mask another way, which may differ in the last bit on some CPUs
    assert torch.equal(run.logits, gpt2_model(tokens, use_cache=False))
    torch.testing.assert_close(run.logits, gpt2_model(tokens), atol=1e-6, rtol=0)


def test_only_what_was_asked_is_kept(gpt2_model, tokens):
    run = run_cached(gpt2_model, tokens, patterns=True, layers=[1], keep_logits=False)
    assert set(run.activations) == {"blocks.1.attn.hook_pattern"}
    assert run.logits is None


def test_rotary_model_caches_too(neox_model):
    run = run_cached(
        neox_model,
        "The cat sat",
        patterns=True,
        head_outputs=True,
        hooks=["blocks.0.hook_attn_out"],
    )
    summed = run.head_outputs()[0].sum(2) + neox_model.b_O[0]
    assert torch.allclose(summed, run["blocks.0.hook_attn_out"], atol=ATOL)


@pytest.mark.parametrize(
    "name, match",
    [
        ("blocks.0.attn.hook_patern", "unknown hook name.*hook_pattern"),
        ("blocks.0.attn.hook_result", "does not fire.*head_outputs=True"),
    ],
)
def test_bad_hook_names_are_errors(gpt2_model, name, match):
    with pytest.raises(KeyError, match=match):
        run_cached(gpt2_model, "hi", hooks=[name])


def test_bad_layers_and_kinds(gpt2_model):
    with pytest.raises(ValueError, match="out of range"):
        run_cached(gpt2_model, "hi", patterns=True, layers=[5])
    with pytest.raises(ValueError, match="resid kinds"):
        run_cached(gpt2_model, "hi", resid=("middle",))


@pytest.mark.parametrize(
    "prompt, match",
    [
        ("", "empty"),
        ([], "empty"),
        (torch.zeros(1, 0, dtype=torch.long), "empty"),
        (torch.tensor([[1, 2, 100_000]]), r"\[0, \d+\].*100000"),
        (torch.tensor([[-1, 2]]), "from -1"),
        (torch.tensor([[1.0, 2.0]]), "integers"),
        (["one two", "one two three four five six"], "different lengths"),
        (3.5, "not float"),
    ],
)
def test_bad_prompts(gpt2_model, prompt, match):
    with pytest.raises(PromptError, match=match):
        run_cached(gpt2_model, prompt)


def test_prompt_longer_than_context(gpt2_model):
    n_ctx = gpt2_model.cfg.n_ctx
    with pytest.raises(PromptError, match=f"{n_ctx + 1} tokens.*context is {n_ctx}"):
        run_cached(gpt2_model, torch.ones(1, n_ctx + 1, dtype=torch.long))
    with pytest.raises(PromptError, match="context"):
        run_cached(gpt2_model, "the cat " * n_ctx)


def test_hooks_are_removed_when_a_hook_raises(gpt2_model, tokens):
    clean = gpt2_model(tokens)

    def boom(act, hook):
        raise RuntimeError("hook failed")

    def scramble(act, hook):
        return act * 0  # would change the logits if it leaked into the next run

    with pytest.raises(RuntimeError, match="hook failed"):
        run_cached(
            gpt2_model,
            tokens,
            patterns=True,
            interventions=[
                ("blocks.0.hook_resid_pre", scramble),
                ("blocks.1.attn.hook_pattern", boom),
            ],
        )
    assert all(not hp.fwd_hooks for hp in gpt2_model.hook_dict.values())
    assert torch.equal(gpt2_model(tokens), clean)
    assert torch.equal(run_cached(gpt2_model, tokens).logits, gpt2_model(tokens, use_cache=False))


def test_interventions_apply_only_during_the_run(gpt2_model, tokens):
    clean = gpt2_model(tokens)
    ablated = run_cached(
        gpt2_model, tokens, interventions=[("blocks.1.attn.hook_z", lambda z, hook: z * 0)]
    )
    assert not torch.allclose(ablated.logits, clean)
    assert torch.equal(gpt2_model(tokens), clean)
