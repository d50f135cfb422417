"""Ablations: each kind checked against an independent computation; hooks, sites, errors."""

from __future__ import annotations

import pytest
import torch

from interp import run_cached
from interp.induction import ordinary_token_ids, repeated_tokens
from interp.induction.scores import ablated_repeated_loss, next_token_loss
from interp.interventions import SITE_KINDS, Intervention, Site, intervene

ATOL = 1e-5  # float32, two layers


@pytest.fixture(scope="module")
def tokens(gpt2_model):
    return gpt2_model.to_tokens(["The cat sat on the mat.", "The dog sat on the log."])


def _z(model, tokens, layer, interventions=()):
    name = f"blocks.{layer}.attn.hook_z"
    return run_cached(model, tokens, hooks=[name], interventions=interventions)[name]


def test_zero_ablating_a_head_removes_exactly_its_output(gpt2_model, tokens):
    plain = run_cached(gpt2_model, tokens, hooks=["blocks.1.hook_attn_out"], head_outputs=True)
    ablated = run_cached(
        gpt2_model,
        tokens,
        hooks=["blocks.1.hook_attn_out"],
        interventions=[Intervention(Site("head", 1, head=2), "zero")],
    )
    expected = plain["blocks.1.hook_attn_out"] - plain.head_outputs()[1, :, :, 2]
    torch.testing.assert_close(ablated["blocks.1.hook_attn_out"], expected, atol=ATOL, rtol=0)


def test_zero_at_one_position_leaves_the_others(gpt2_model, tokens):
    name = "blocks.1.hook_resid_pre"
    plain = run_cached(gpt2_model, tokens, hooks=[name])[name]
    ablated = run_cached(
        gpt2_model,
        tokens,
        hooks=[name],
        interventions=[Intervention(Site("resid_pre", 1, pos=3), "zero")],
    )[name]
    assert ablated[:, 3].abs().max() == 0
    keep = [p for p in range(tokens.shape[1]) if p != 3]
    assert torch.equal(ablated[:, keep], plain[:, keep])


def test_mean_over_a_reference_batch(gpt2_model, tokens):
    reference = gpt2_model.to_tokens(["A bird sat on a branch today", "def add(a, b): return"])
    ref_z = _z(gpt2_model, reference, 0)[:, :, 1]
    for per_position, dims in ((False, (0, 1)), (True, (0,))):
        if per_position:
            reference = reference[:, : tokens.shape[1]]
            ref_z = _z(gpt2_model, reference, 0)[:, :, 1]
        item = Intervention(
            Site("head", 0, head=1), "mean", source=reference, per_position=per_position
        )
        z = _z(gpt2_model, tokens, 0, [item])
        expected = ref_z.mean(dim=dims, keepdim=True).expand_as(z[:, :, 1])
        torch.testing.assert_close(z[:, :, 1], expected, atol=ATOL, rtol=0)
        torch.testing.assert_close(z[:, :, 0], _z(gpt2_model, tokens, 0)[:, :, 0])


def test_resample_takes_the_source_activation(gpt2_model, tokens):
    source = tokens.flip(0)
    z = _z(
        gpt2_model, tokens, 1, [Intervention(Site("head", 1, head=3), "resample", source=source)]
    )
    assert torch.equal(z[:, :, 3], _z(gpt2_model, source, 1)[:, :, 3])
    assert torch.equal(z[:, :, :3], _z(gpt2_model, tokens, 1)[:, :, :3])


def test_noise_is_seeded_and_the_same_on_every_row(gpt2_model, tokens):
    name = "blocks.0.hook_resid_pre"
    plain = run_cached(gpt2_model, tokens, hooks=[name])[name]

    def noisy(seed):
        item = Intervention(Site("resid_pre", 0), "noise", std=0.5, seed=seed)
        return run_cached(gpt2_model, tokens, hooks=[name], interventions=[item])[name] - plain

    first = noisy(1)
    assert torch.equal(first, noisy(1))
    assert not torch.allclose(first, noisy(2))
    torch.testing.assert_close(first[0], first[1], atol=ATOL, rtol=0)
    assert 0.4 < float(first.std()) < 0.6


def test_pattern_and_q_sites(gpt2_model, tokens):
    hooks = ["blocks.1.attn.hook_pattern", "blocks.1.attn.hook_q"]
    run = run_cached(
        gpt2_model,
        tokens,
        hooks=hooks,
        interventions=[
            Intervention(Site("pattern", 1, head=0, pos=4), "zero"),
            Intervention(Site("q", 1, head=1), "zero"),
        ],
    )
    assert run["blocks.1.attn.hook_pattern"][:, 0, 4].abs().max() == 0
    assert run["blocks.1.attn.hook_pattern"][:, 0, 5].sum() > 0
    assert run["blocks.1.attn.hook_q"][:, :, 1].abs().max() == 0


def test_rotary_q_is_taken_before_the_rotation(neox_model):
    """Documented in sites.py: on GPT-NeoX, hook_q is ln1(x) @ W_Q + b_Q, not rotated."""
    tokens = neox_model.to_tokens("rotary positions enter the queries and keys")
    run = run_cached(neox_model, tokens, hooks=["blocks.1.ln1.hook_out", "blocks.1.attn.hook_q"])
    q = torch.einsum("bpm,hmd->bphd", run["blocks.1.ln1.hook_out"], neox_model.W_Q[1].detach())
    torch.testing.assert_close(
        run["blocks.1.attn.hook_q"], q + neox_model.b_Q[1].detach(), atol=ATOL, rtol=0
    )


def test_context_manager_equals_run_cached_and_cleans_up(gpt2_model, tokens):
    item = Intervention(Site("attn_out", 0), "zero")
    with torch.inference_mode():
        plain = gpt2_model(tokens)
        with intervene(gpt2_model, [item]):
            inside = gpt2_model(tokens, use_cache=False)  # as run_cached runs it
        after = gpt2_model(tokens)
    assert torch.equal(inside, run_cached(gpt2_model, tokens, interventions=[item]).logits)
    assert not torch.allclose(inside, plain)
    assert torch.equal(after, plain)
    with pytest.raises(RuntimeError, match="inside"), intervene(gpt2_model, [item]):
        raise RuntimeError("raised inside the block")
    with torch.inference_mode():
        assert torch.equal(gpt2_model(tokens), plain)


def test_hooks_removed_when_an_intervention_fails(gpt2_model, tokens):
    short = tokens[:, :4]  # a resample source of another length fails inside the hook
    item = Intervention(Site("head", 1, head=0), "resample", source=short)
    with pytest.raises(ValueError, match="same token length"):
        run_cached(gpt2_model, tokens, interventions=[item])
    with torch.inference_mode():
        assert torch.equal(
            gpt2_model(tokens, use_cache=False), run_cached(gpt2_model, tokens).logits
        )


def test_tuples_and_objects_mix(gpt2_model, tokens):
    seen = []
    run = run_cached(
        gpt2_model,
        tokens,
        interventions=[
            ("blocks.0.hook_resid_pre", lambda act, hook: seen.append(act.shape)),
            Intervention(Site("mlp_out", 1), "zero"),
        ],
    )
    assert seen == [tokens.shape + (gpt2_model.cfg.d_model,)]
    assert not torch.allclose(run.logits, run_cached(gpt2_model, tokens).logits)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Site("head", 0), "needs head="),
        (lambda: Site("resid_pre", 0, head=1), "has no heads"),
        (lambda: Site("resid_wrong", 0), "site kind must be"),
        (lambda: Site("head", -1, head=0), "non-negative"),
        (lambda: Intervention(Site("attn_out", 0), "noise"), "positive std"),
        (lambda: Intervention(Site("attn_out", 0), "resample"), "needs source"),
        (lambda: Intervention(Site("attn_out", 0), "shuffle"), "ablation kind"),
    ],
)
def test_bad_sites_and_interventions(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_sites_are_checked_against_the_model(gpt2_model, tokens):
    with pytest.raises(ValueError, match="layer 5 out of range"):
        run_cached(gpt2_model, tokens, interventions=[Intervention(Site("attn_out", 5))])
    with pytest.raises(ValueError, match="head 9 out of range"):
        run_cached(gpt2_model, tokens, interventions=[Intervention(Site("head", 0, head=9))])
    with pytest.raises(TypeError, match="Intervention or a"):
        run_cached(gpt2_model, tokens, interventions=["blocks.0.hook_resid_pre"])


def _old_ablated_repeated_loss(model, batch, layer, head):
    """The induction verdict's mean ablation as written before it moved onto Intervention."""

    def ablate(z, hook):
        z = z.clone()
        z[:, :, head] = z[:, :, head].mean(dim=(0, 1), keepdim=True)
        return z

    run = run_cached(model, batch.tokens, interventions=[(f"blocks.{layer}.attn.hook_z", ablate)])
    loss = next_token_loss(run.logits, batch.tokens)
    return float(loss[batch.loss_positions("repeated")].mean())


def test_induction_mean_ablation_gives_the_same_numbers(bundled_model):
    model = bundled_model
    vocab = ordinary_token_ids(model.tokenizer, 500)
    batch = repeated_tokens(
        vocab, seq_lens=[8, 12], batch_size=2, bos_id=model.tokenizer.bos_token_id, seed=0
    )
    for layer, head in ((0, 1), (1, 0), (1, 3)):
        assert ablated_repeated_loss(model, batch, layer, head) == _old_ablated_repeated_loss(
            model, batch, layer, head
        )


def test_a_later_in_place_edit_does_not_change_what_was_cached(gpt2_model, tokens):
    """Patches write in place (the bridge needs it for resid_mid); caches are copies."""
    name = "blocks.0.hook_resid_post"
    plain = run_cached(gpt2_model, tokens, hooks=[name])[name]
    run = run_cached(
        gpt2_model, tokens, hooks=[name], interventions=[Intervention(Site("resid_pre", 1), "zero")]
    )
    assert torch.equal(run[name], plain)


def test_resid_mid_patch_reaches_the_residual_stream(gpt2_model, tokens):
    """Zeroing resid_mid must zero the stream the MLP adds to, not only the MLP's input."""
    hooks = ["blocks.1.hook_mlp_out", "blocks.1.hook_resid_post"]
    run = run_cached(
        gpt2_model, tokens, hooks=hooks, interventions=[Intervention(Site("resid_mid", 1), "zero")]
    )
    torch.testing.assert_close(
        run["blocks.1.hook_resid_post"], run["blocks.1.hook_mlp_out"], atol=ATOL, rtol=0
    )


@pytest.mark.parametrize("kind", list(SITE_KINDS))
def test_interventions_work_under_autograd(neox_model, kind):
    """Writes are in place, except a pattern that softmax saved for the backward pass."""
    tokens = neox_model.to_tokens("def f(a, b):\n    return f(a, b)")
    site = Site(kind, 1, head=0 if kind in ("head", "q", "k", "v", "pattern") else None, pos=2)
    item = Intervention(site, "noise", std=1.0)
    with intervene(neox_model, [item]):
        logits = neox_model(tokens)
        logits[0, -1, 5].backward()
    neox_model.zero_grad(set_to_none=True)
    expected = run_cached(neox_model, tokens, interventions=[item]).logits
    torch.testing.assert_close(logits.detach(), expected, atol=ATOL, rtol=0)
    assert not torch.allclose(expected, run_cached(neox_model, tokens).logits)
