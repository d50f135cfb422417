"""``to_grid``: a patching table as TransformerLens's tensor, checked against TransformerLens.

Every grid of one prompt pair equals the tensor of its ``transformer_lens.patching`` function
as returned (no permuting: the same axes in the same order); a task's ``resid_pre`` grid equals
``get_act_patch_resid_pre`` on the same batch with the task's metric averaged over rows;
``recovered`` is TransformerLens's tensor normalised; a per-row table stacks each row's grid.
"""

from __future__ import annotations

import pytest
import torch
from transformer_lens import patching as tl_patching

from interp.interventions import logit_diff, patch_activations, to_grid
from tests.task_models import random_id_task

ATOL = 1e-5  # float32 logits of differently shaped batches

TL = {  # grid -> TransformerLens's function
    "resid_pre": tl_patching.get_act_patch_resid_pre,
    "resid_mid": tl_patching.get_act_patch_resid_mid,
    "attn_out": tl_patching.get_act_patch_attn_out,
    "mlp_out": tl_patching.get_act_patch_mlp_out,
    "heads": tl_patching.get_act_patch_attn_head_out_all_pos,
    "heads_pos": tl_patching.get_act_patch_attn_head_out_by_pos,
    "q": tl_patching.get_act_patch_attn_head_q_all_pos,
    "k": tl_patching.get_act_patch_attn_head_k_all_pos,
    "v": tl_patching.get_act_patch_attn_head_v_all_pos,
    "pattern": tl_patching.get_act_patch_attn_head_pattern_all_pos,
    "q_pos": tl_patching.get_act_patch_attn_head_q_by_pos,
    "k_pos": tl_patching.get_act_patch_attn_head_k_by_pos,
    "v_pos": tl_patching.get_act_patch_attn_head_v_by_pos,
    "pattern_pos": tl_patching.get_act_patch_attn_head_pattern_by_pos,
}


def _pair(model):
    clean = model.to_tokens("The cat sat on the mat.")
    corrupted = clean.clone()
    corrupted[0, 1:4] = torch.tensor([40, 41, 42])
    return clean, corrupted, logit_diff(int(clean[0, 4]), 7)


def test_every_grid_is_transformer_lens_tensor(gpt2_model):
    clean, corrupted, metric = _pair(gpt2_model)
    frame = patch_activations(gpt2_model, clean, corrupted, metric, sites=list(TL))
    _, cache = gpt2_model.run_with_cache(clean)
    c, k = frame.attrs["clean_metric"], frame.attrs["corrupted_metric"]
    for grid, fn in TL.items():
        with torch.no_grad():
            theirs = fn(gpt2_model, corrupted, cache, lambda logits: metric(logits)[0])
        ours = to_grid(frame, site=grid)
        assert ours.shape == theirs.shape, (grid, ours.shape, theirs.shape)
        torch.testing.assert_close(ours, theirs.float(), atol=ATOL, rtol=0, msg=grid)
        recovered = to_grid(frame, "recovered", site=grid)
        torch.testing.assert_close(
            recovered, ((theirs - k) / (c - k)).float(), atol=ATOL / abs(c - k), rtol=0
        )


def _task(n_rows, n_tokens, seed=0, vocab=300):
    return random_id_task([n_tokens] * n_rows, seed=seed, vocab=vocab, corrupt=3)


@pytest.mark.parametrize("name", ["gpt2_model", "neox_model"])
def test_a_tasks_grid_is_transformer_lens_on_the_batch(name, request):
    model = request.getfixturevalue(name)
    batch = _task(5, 7).tokens(model)
    metric = batch.metric("logit_diff")
    frame = patch_activations(model, batch, sites=["resid_pre", "heads"])
    _, cache = model.run_with_cache(batch.clean)
    for grid in ("resid_pre", "heads"):
        with torch.no_grad():
            theirs = TL[grid](model, batch.corrupted, cache, lambda logits: metric(logits).mean())
        torch.testing.assert_close(to_grid(frame, site=grid), theirs, atol=ATOL, rtol=0)
    rows = patch_activations(model, batch, sites=["resid_pre"], per_row=True)
    stacked = to_grid(rows)  # [row layer pos]
    assert stacked.shape == (5, model.cfg.n_layers, 7)
    torch.testing.assert_close(stacked.mean(0), to_grid(frame, site="resid_pre"), atol=ATOL, rtol=0)


def test_layers_left_out_are_nan_and_refusals_are_one_line(gpt2_model):
    clean, corrupted, metric = _pair(gpt2_model)
    frame = patch_activations(
        gpt2_model, clean, corrupted, metric, sites=["resid_pre", "heads"], layers=[1]
    )
    grid = to_grid(frame, site="heads")
    assert grid.shape == (2, gpt2_model.cfg.n_heads)
    assert grid[0].isnan().all() and not grid[1].isnan().any()
    both = patch_activations(gpt2_model, clean, corrupted, metric, sites=["heads"], method="both")
    exact = to_grid(both, method="exact")
    torch.testing.assert_close(exact, to_grid(both[both["method"] == "exact"]))
    cases = [
        (lambda: to_grid(frame), r"grids resid_pre, heads .* to_grid\(frame, site='resid_pre'\)"),
        (lambda: to_grid(both), r"methods exact, attribution .* method='exact'"),
        (lambda: to_grid(frame, site="mlp_out"), "site='mlp_out' is not in this table"),
        (lambda: to_grid(frame, site="nope"), "site must be a grid name"),
        (lambda: to_grid(frame, "loss", site="heads"), "column must be one of"),
        (lambda: to_grid(frame[["layer"]]), "takes a patch_activations table"),
        (lambda: to_grid(frame.iloc[:0], site="heads"), "empty table"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            call()
        assert "\n" not in str(info.value)
