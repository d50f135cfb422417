"""Path patching (interp/interventions/paths.py): identities, an independent IOI-style
re-implementation, errors, and the bundled model's K-composition path."""

from __future__ import annotations

import math

import pytest
import torch

from interp.engine import PromptError, run_cached
from interp.induction.batches import ordinary_token_ids, repeated_tokens
from interp.interventions.paths import (
    COLUMNS,
    complete_receivers,
    path_patch,
    path_patch_senders,
)

ATOL = 1e-5  # float32, 2 layers: a patched run against the same patch made another way
ZERO_ATOL = 1e-6  # a change that must vanish


def _answer_logprob(answers: torch.Tensor):
    """Summed log-prob of ``answers [batch pos]`` over positions: a metric for these tests
    (a sum, not a mean, so that the random tiny models' small effects stand well above 1e-6)."""

    def metric(logits):
        lp = logits.log_softmax(-1)
        return lp.gather(-1, answers[..., None].to(lp.device)).squeeze(-1).sum(-1)

    return metric


def _pair(model, seed: int = 0, batch: int = 3, n_pos: int = 10):
    g = torch.Generator().manual_seed(seed)
    vocab = int(model.cfg.d_vocab)
    clean = torch.randint(1, vocab, (batch, n_pos), generator=g)
    corrupted = clean.clone()
    corrupted[:, 1 : n_pos // 2] = torch.randint(1, vocab, (batch, n_pos // 2 - 1), generator=g)
    answers = torch.randint(1, vocab, (batch, n_pos), generator=g)
    return clean, corrupted, _answer_logprob(answers)


def _patch_output(model, base, source, sender):
    """Activation patching of the sender's whole output: the plain hook the identity is about."""
    kind, layer = sender[0], sender[1]
    name = f"blocks.{layer}.attn.hook_z" if kind == "head" else f"blocks.{layer}.hook_mlp_out"
    src = run_cached(model, source, hooks=[name])[name]

    def hook(act, hook):
        act = act.clone()
        if kind == "head":
            act[:, :, sender[2]] = src[:, :, sender[2]]
        else:
            act[:] = src
        return act

    return run_cached(model, base, interventions=[(name, hook)]).logits


@pytest.fixture(params=["gpt2_model", "neox_model"])
def model(request):
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize(
    "sender", [("head", 0, 1), ("head", 0, 3), ("mlp", 0), ("head", 1, 2), ("mlp", 1)]
)
@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_every_receiver_at_once_equals_patching_the_sender(model, sender, direction):
    clean, corrupted, metric = _pair(model)
    receivers = complete_receivers(model, sender, mlps="freeze")
    result = path_patch(
        model,
        clean,
        corrupted,
        sender=sender,
        receivers=receivers,
        metric=metric,
        direction=direction,
        mlps="freeze",
    )
    base, source = (corrupted, clean) if direction == "denoising" else (clean, corrupted)
    expected = float(metric(_patch_output(model, base, source, sender)).double().mean())
    assert result.table["metric"].item() == pytest.approx(expected, abs=ATOL)  # seen: 1e-6
    # and the patch did something, so the identity is not 0 == 0
    effect = abs(expected - float(metric(run_cached(model, base).logits).double().mean()))
    assert effect > 10 * ATOL


def test_complete_receivers_lists_every_later_reader(gpt2_model):
    names = {str(r) for r in complete_receivers(gpt2_model, (0, 1), mlps="freeze")}
    assert names == ({f"L1H{h}.{x}" for h in range(4) for x in "qkv"} | {"MLP0", "MLP1", "logits"})
    assert {str(r) for r in complete_receivers(gpt2_model, ("mlp", 1))} == {"logits"}
    assert "MLP0" not in {str(r) for r in complete_receivers(gpt2_model, (0, 1), mlps="recompute")}


@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_receivers_it_cannot_reach_change_nothing(model, direction):
    clean, corrupted, metric = _pair(model, seed=1)
    unreachable = [("head", lay, h, x) for lay in (0, 1) for h in range(4) for x in "qkv"]
    result = path_patch(
        model,
        clean,
        corrupted,
        sender=(1, 2),
        receivers=unreachable,
        metric=metric,
        direction=direction,
        check_order=False,
    )
    base = result.corrupted_metric if direction == "denoising" else result.clean_metric
    assert result.table["metric"].item() == pytest.approx(base, abs=ZERO_ATOL)
    with pytest.raises(ValueError, match="cannot reach receivers L0H0.q"):
        path_patch(model, clean, corrupted, sender=(1, 2), receivers=unreachable, metric=metric)
    with pytest.raises(ValueError, match=r"sender MLP1 \(layer 1\) cannot reach"):
        path_patch(
            model,
            clean,
            corrupted,
            sender=("mlp", 1),
            receivers=[("head", 1, 0, "k")],
            metric=metric,
        )


def test_clean_into_clean_changes_nothing(model):
    clean, _, metric = _pair(model, seed=2)
    receivers = [("head", 1, h, x) for h in range(4) for x in "qkv"] + ["logits"]
    result = path_patch(model, clean, clean, sender=(0, 2), receivers=receivers, metric=metric)
    assert result.table["metric"].item() == pytest.approx(result.clean_metric, abs=ZERO_ATOL)
    assert math.isnan(result.table["recovered"].item()) and not result.recovered_defined


def _ioi_literal(model, base, source, layer, head, receiver, freeze_mlps=False):
    """The IOI paper's three steps written out with plain hooks, for one receiver in layer 1:
    record the receiver's activation with the sender patched and every head frozen (MLPs
    recomputed, or frozen too), then run the base again with only that activation replaced."""
    n_layers = int(model.cfg.n_layers)
    names = [f"blocks.{lay}.attn.hook_z" for lay in range(n_layers)]
    mlp_names = [f"blocks.{lay}.hook_mlp_out" for lay in range(n_layers)] if freeze_mlps else []
    base_run = run_cached(model, base, hooks=names + mlp_names)
    source_run = run_cached(model, source, hooks=names)

    def freeze(name):  # hook.name is the alias target (attn.o.hook_in), so close over ours
        def hook(act, hook):
            out = base_run[name].clone()
            if name == names[layer]:
                out[:, :, head] = source_run[name][:, :, head]
            return out

        return hook

    read = "ln_final.hook_in" if receiver == "logits" else f"blocks.1.attn.hook_{receiver[3]}"
    recorded = run_cached(
        model, base, hooks=[read], interventions=[(n, freeze(n)) for n in names + mlp_names]
    )[read]

    def put(act, hook):
        if receiver == "logits":
            return recorded
        act = act.clone()
        act[:, :, receiver[2]] = recorded[:, :, receiver[2]]
        return act

    return run_cached(model, base, interventions=[(read, put)]).logits


def test_refuses_a_model_whose_hook_k_is_not_ln1_times_w_k(neox_model):
    clean, corrupted, metric = _pair(neox_model)

    def scale(k, hook):  # stands in for a model with a norm after the key projection
        return 2 * k

    with neox_model.hooks(fwd_hooks=[("blocks.1.attn.hook_k", scale)], reset_hooks_end=True):
        with pytest.raises(RuntimeError, match="blocks.1.attn.hook_k is not ln1.x. W_K"):
            path_patch(
                neox_model,
                clean,
                corrupted,
                sender=(0, 1),
                metric=metric,
                receivers=[("head", 1, 0, "k")],
            )
    path_patch(
        neox_model,
        clean,
        corrupted,
        sender=(0, 1),
        metric=metric,  # and hooks are gone
        receivers=[("head", 1, 0, "k")],
    )


def test_sender_sweep_equals_one_at_a_time(gpt2_model):
    clean, corrupted, metric = _pair(gpt2_model, seed=4)
    receivers = [("head", 1, 1, "k"), ("head", 1, 3, "q"), "logits"]
    sweep = path_patch_senders(
        gpt2_model,
        clean,
        corrupted,
        receivers=receivers,
        metric=metric,
        senders_per_pass=3,
        direction="noising",
    )
    assert list(sweep.table.columns[:7]) == COLUMNS and len(sweep.table) == 8
    assert sweep.grid().shape == (2, 4)
    for row in sweep.table.itertuples():
        one = path_patch(
            gpt2_model,
            clean,
            corrupted,
            sender=(row.layer, row.head),
            receivers=receivers,
            metric=metric,
            direction="noising",
            check_order=False,
        )
        assert row.metric == pytest.approx(one.table["metric"].item(), abs=ATOL)
        assert row.recovered == pytest.approx(one.table["recovered"].item(), abs=1e-9)


def test_bad_inputs_say_what_to_do(gpt2_model):
    clean, corrupted, metric = _pair(gpt2_model)
    with pytest.raises(PromptError, match="same .batch, pos. shape; clean is"):
        path_patch(
            gpt2_model, clean, corrupted[:, :-1], sender=(0, 1), receivers="logits", metric=metric
        )
    with pytest.raises(ValueError, match="with mlps='recompute' an MLP is part"):
        path_patch(
            gpt2_model, clean, corrupted, sender=(0, 1), receivers=[("mlp", 1)], metric=metric
        )
    with pytest.raises(ValueError, match="a receiver is"):
        path_patch(
            gpt2_model,
            clean,
            corrupted,
            sender=(0, 1),
            receivers=[("head", 1, 0, "z")],
            metric=metric,
        )
    with pytest.raises(ValueError, match="out of range: the model has 4 heads"):
        path_patch(gpt2_model, clean, corrupted, sender=(0, 7), receivers="logits", metric=metric)
    with pytest.raises(ValueError, match="direction must be one of"):
        path_patch(
            gpt2_model,
            clean,
            corrupted,
            sender=(0, 1),
            receivers="logits",
            metric=metric,
            direction="up",
        )
    with pytest.raises(ValueError, match="metric must return a scalar or a tensor"):
        path_patch(
            gpt2_model,
            clean,
            corrupted,
            sender=(0, 1),
            receivers="logits",
            metric=lambda logits: logits[:, 0, :2],
        )


# -- the bundled model: the previous-token head's path into the induction heads' keys ----------

L = 12


@pytest.fixture(scope="module")
def induction_pair(bundled_model):
    model = bundled_model
    vocab = ordinary_token_ids(model.tokenizer, int(model.cfg.d_vocab))
    rows = repeated_tokens(vocab, seq_lens=[2 * L], batch_size=8, bos_id=0, seed=0).tokens
    a, b = rows[:, 1 : L + 1], rows[:, L + 1 : 2 * L + 1]  # 2L distinct tokens per row
    bos = rows[:, :1]
    return model, a, b, bos


def _induction_metric(a, js):
    """Log-prob of ``a[j+1]`` at the second copy of ``a[j]`` (position L + 1 + j), for j in js."""
    js = torch.as_tensor(js)

    def metric(logits):
        lp = logits.log_softmax(-1)[:, L + 1 + js]
        return lp.gather(-1, a[:, js + 1, None]).squeeze(-1).mean(-1)

    return metric


def _by_input(model, clean, corrupted, metric, direction):
    return {
        x: path_patch(
            model,
            clean,
            corrupted,
            sender=(0, 1),
            metric=metric,
            receivers=[("head", 1, h, x) for h in (0, 1, 2, 3)],
            direction=direction,
        )
        .table["recovered"]
        .item()
        for x in "qkv"
    }


def test_bundled_key_path_restores_induction(induction_pair):
    model, a, b, bos = induction_pair
    # every other token of the first half replaced: the token an induction head should copy is
    # still there, only its previous-token information is wrong
    mixed = torch.where(torch.arange(L) % 2 == 1, b, a)
    clean, corrupted = torch.cat([bos, a, a], 1), torch.cat([bos, mixed, a], 1)
    metric = _induction_metric(a, range(1, L - 1, 2))
    got = _by_input(model, clean, corrupted, metric, "denoising")
    assert got["k"] > 0.6, got
    assert abs(got["q"]) < 0.1 and abs(got["v"]) < 0.1, got
    sweep = path_patch_senders(
        model, clean, corrupted, metric=metric, receivers=[("head", 1, h, "k") for h in range(4)]
    )
    grid = sweep.grid()
    assert grid.stack().idxmax() == (0, 1)


def test_bundled_key_path_carries_induction_when_noised(induction_pair):
    model, a, b, bos = induction_pair
    clean, corrupted = torch.cat([bos, a, a], 1), torch.cat([bos, b, a], 1)
    metric = _induction_metric(a, range(L - 1))
    got = _by_input(model, clean, corrupted, metric, "noising")
    assert got["k"] < 0.2, got  # noising the key path alone removes most of the prediction
    assert got["q"] > 0.9, got


@pytest.mark.parametrize(
    "receiver",
    [("head", 1, 0, "q"), ("head", 1, 0, "k"), ("head", 1, 2, "k"), ("head", 1, 3, "v"), "logits"],
)
@pytest.mark.parametrize("mlps", ["recompute", "freeze"])
def test_matches_the_ioi_three_steps_written_out(induction_pair, receiver, mlps):
    # on the trained model, where q and k paths move attention (random tiny models barely do)
    model, a, b, bos = induction_pair
    mixed = torch.where(torch.arange(L) % 2 == 0, b, a)
    clean, corrupted = torch.cat([bos, a, a], 1), torch.cat([bos, mixed, a], 1)
    metric = _induction_metric(a, range(L - 1))
    result = path_patch(
        model, clean, corrupted, sender=(0, 1), receivers=[receiver], metric=metric, mlps=mlps
    )
    literal = _ioi_literal(model, corrupted, clean, 0, 1, receiver, freeze_mlps=mlps == "freeze")
    expected = float(metric(literal).double().mean())
    assert result.table["metric"].item() == pytest.approx(expected, abs=ATOL)
    assert abs(expected - result.corrupted_metric) > 10 * ATOL  # the path does something
