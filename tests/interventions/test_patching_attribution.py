"""Attribution patching: exact where the metric is linear in the patch; its error is shown."""

from __future__ import annotations

import pytest
import torch

from interp import run_cached
from interp.interventions import logit_diff, method_errors, patch_activations

LINEAR_ATOL = 1e-4  # float32 logits of a d_model 64 model; the estimate is exact in theory


@pytest.fixture(scope="module")
def prompts(neox_model):
    clean = neox_model.to_tokens("The cat sat on the mat. The dog sat on the")
    corrupted = clean.clone()
    corrupted[0, 2:5] = torch.tensor([30, 31, 32])
    corrupted[0, -1] = 33
    return clean, corrupted, logit_diff(int(clean[0, 3]), 9)


def _frozen_final_scale(model, tokens):
    """A fixed hook holding ln_final's scale at its value on ``tokens``: the logits become an
    affine function of the final residual stream."""
    scale = run_cached(model, tokens, hooks=["ln_final.hook_scale"])["ln_final.hook_scale"]
    return ("ln_final.hook_scale", lambda act, hook: scale.expand_as(act).clone())


@pytest.mark.filterwarnings("ignore:A forward hook edited hook_scale")
@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_exact_where_the_metric_is_linear(neox_model, prompts, direction):
    clean, corrupted, metric = prompts
    last = int(neox_model.cfg.n_layers) - 1
    frame = patch_activations(
        neox_model,
        clean,
        corrupted,
        metric,
        sites=["resid_post"],
        layers=[last],
        method="both",
        direction=direction,
        interventions=[_frozen_final_scale(neox_model, corrupted)],
    )
    table = method_errors(frame)
    assert table["error"].abs().max() <= LINEAR_ATOL
    assert (
        table["exact"]
        .sub(frame.attrs["corrupted_metric" if direction == "denoising" else "clean_metric"])
        .abs()
        .max()
        > 100 * LINEAR_ATOL
    )


def test_the_error_is_reported_where_the_approximation_fails(neox_model, prompts):
    clean, corrupted, metric = prompts
    frame = patch_activations(
        neox_model, clean, corrupted, metric, sites=["resid_pre", "heads"], method="both"
    )
    assert set(frame["method"]) == {"exact", "attribution"}
    table = method_errors(frame)
    assert len(table) == len(frame) // 2
    torch.testing.assert_close(
        torch.tensor(table["error"].to_numpy()),
        torch.tensor((table["attribution"] - table["exact"]).to_numpy()),
    )
    # the unfrozen LayerNorms make it nonlinear: some cells are visibly off
    assert table["error"].abs().max() > 10 * LINEAR_ATOL
    with pytest.raises(ValueError, match="method='both'"):
        method_errors(frame[frame["method"] == "exact"])


def test_positions_after_the_metric_get_zero_from_both(neox_model, prompts):
    clean, corrupted, _ = prompts
    metric = logit_diff(int(clean[0, 3]), 9, pos=4)
    frame = patch_activations(
        neox_model, clean, corrupted, metric, sites=["resid_pre"], method="both"
    )
    later = frame[frame["pos"] > 4]
    base = frame.attrs["corrupted_metric"]
    assert (later["metric"] - base).abs().max() <= 1e-6


def test_weights_get_no_gradient(neox_model, prompts):
    clean, corrupted, metric = prompts
    patch_activations(neox_model, clean, corrupted, metric, sites=["heads"], method="attribution")
    assert all(p.grad is None for p in neox_model.parameters())
