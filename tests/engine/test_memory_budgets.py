"""Budgets for activation patching grids and batched logit attribution; the logit lens on an
offloaded model. Budgeted runs are checked against one unbudgeted pass (same numbers)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from interp import load_model, logit_attribution, logit_attribution_batch, logit_lens, run_cached
from interp.engine import (
    MemoryBudgetError,
    estimate_cache_bytes,
    estimate_forward_bytes,
    estimate_loss_bytes,
    rows_per_chunk,
)
from interp.engine.plan import _GLIBC_SLACK, _PLAN_SHARE
from interp.interventions import Intervention, Site, logit_diff, patch_activations, run_patched
from interp.interventions.attribution_patching import estimate_attribution_bytes
from interp.models.offload import is_offloaded

CHUNK_ATOL = 1e-6  # chunked vs one pass: the same arithmetic per row
OFFLOAD_ATOL = 1e-5  # offloaded vs in memory: the same weights read back from the checkpoint


@pytest.fixture(scope="module")
def prompts(gpt2_model):
    clean = gpt2_model.to_tokens("When Mary and John went to the store, John gave a drink to")
    corrupted = clean.clone()
    corrupted[0, 2:6] = torch.tensor([20, 31, 42, 53])
    answer = int(gpt2_model.to_tokens(" Mary", prepend_bos=False)[0, 0])
    return clean, corrupted, logit_diff(answer, 17)


def _rows_budget(model, n_pos: int, rows: int) -> int:
    """A budget for the patched runs that fits exactly ``rows`` runs per pass."""
    per_row = max(estimate_forward_bytes(model, (1, n_pos)), estimate_loss_bytes(model, (1, n_pos)))
    return int(rows * per_row / 0.9) + 1  # passes are planned to 90% of a budget


def test_budgeted_patching_grid_equals_one_pass(gpt2_model, prompts):
    clean, corrupted, metric = prompts
    n_pos = clean.shape[1]
    names = sorted(
        {f"blocks.{layer}.hook_resid_pre" for layer in range(2)}
        | {f"blocks.{layer}.attn.hook_z" for layer in range(2)}
    )
    held = estimate_cache_bytes(gpt2_model, (1, n_pos), hooks=names)
    budget = held + _rows_budget(gpt2_model, n_pos, rows=3)
    kwargs = dict(sites=["resid_pre", "heads"], direction="denoising")
    one = patch_activations(gpt2_model, clean, corrupted, metric, **kwargs)
    passes = []
    gpt2_model.add_hook("blocks.0.hook_resid_pre", lambda act, hook: passes.append(1))
    try:
        chunked = patch_activations(
            gpt2_model, clean, corrupted, metric, max_bytes=budget, **kwargs
        )
    finally:
        gpt2_model.reset_hooks()
    n_rows = 2 * n_pos + 2 * 4  # resid_pre: layer x pos; heads: layer x head
    assert len(passes) >= n_rows // 3  # really split: 3 runs per pass at most
    pd.testing.assert_frame_equal(chunked, one, atol=CHUNK_ATOL, rtol=0, check_exact=False)
    assert (one["recovered"].max() - one["recovered"].min()) > 0.1  # the grid is not flat


def test_run_patched_budget_and_max_rows(gpt2_model, prompts):
    clean, corrupted, metric = prompts
    source = run_cached(gpt2_model, clean, hooks=["blocks.1.hook_resid_pre"])
    rows = [
        [
            Intervention(
                Site("resid_pre", 1, pos=p), "patch", source=source["blocks.1.hook_resid_pre"]
            )
        ]
        for p in range(clean.shape[1])
    ]
    one = run_patched(gpt2_model, corrupted, rows, metric)
    budget = _rows_budget(gpt2_model, clean.shape[1], rows=2)
    torch.testing.assert_close(
        run_patched(gpt2_model, corrupted, rows, metric, max_bytes=budget),
        one,
        atol=CHUNK_ATOL,
        rtol=0,
    )
    with pytest.raises(ValueError, match="not both"):
        run_patched(gpt2_model, corrupted, rows, metric, max_rows=2, max_bytes=budget)


def test_patching_budget_too_small_says_the_minimum(gpt2_model, prompts):
    clean, corrupted, metric = prompts
    with pytest.raises(MemoryBudgetError, match=r"source run's cache .* more than max_bytes"):
        patch_activations(gpt2_model, clean, corrupted, metric, max_bytes="1KB")
    names = [f"blocks.{layer}.hook_resid_pre" for layer in range(2)]
    held = estimate_cache_bytes(gpt2_model, (1, clean.shape[1]), hooks=names)
    with pytest.raises(MemoryBudgetError, match="raise max_bytes to at least") as info:
        patch_activations(gpt2_model, clean, corrupted, metric, max_bytes=held + 1000)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="not both"):
        patch_activations(gpt2_model, clean, corrupted, metric, max_rows=2, max_bytes="1GB")


def test_attribution_patching_refuses_a_budget_it_cannot_split(gpt2_model, prompts):
    clean, corrupted, metric = prompts
    n_pos = clean.shape[1]
    need = estimate_attribution_bytes(gpt2_model, n_pos)
    with pytest.raises(MemoryBudgetError, match="cannot be split.*method='exact'"):
        patch_activations(
            gpt2_model, clean, corrupted, metric, method="attribution", max_bytes=need // 2
        )
    one = patch_activations(gpt2_model, clean, corrupted, metric, method="both")
    held = patch_activations(
        gpt2_model, clean, corrupted, metric, method="both", max_bytes=4 * need
    )
    pd.testing.assert_frame_equal(held, one, atol=CHUNK_ATOL, rtol=0, check_exact=False)


def test_budgeted_path_patching_equals_one_pass(gpt2_model):
    from interp.interventions import path_patch_senders
    from interp.interventions.paths import _senders_fitting

    g = torch.Generator().manual_seed(4)
    clean = torch.randint(1, 300, (2, 10), generator=g)
    corrupted = clean.clone()
    corrupted[:, 1:5] = torch.randint(1, 300, (2, 4), generator=g)
    metric = logit_diff(5, 6)
    receivers = [("head", 1, 1, "k"), "logits"]
    one = path_patch_senders(
        gpt2_model, clean, corrupted, receivers=receivers, metric=metric, senders_per_pass=8
    )
    names = [f"blocks.{layer}.attn.hook_z" for layer in range(2)]
    names += [f"blocks.{layer}.hook_mlp_out" for layer in range(2)]
    names += ["blocks.1.ln1.hook_in", "ln_final.hook_in"]
    held = 2 * estimate_cache_bytes(gpt2_model, (2, 10), hooks=names)
    per_row = (
        max(estimate_forward_bytes(gpt2_model, (1, 10)), estimate_loss_bytes(gpt2_model, (1, 10)))
        + 2 * 10 * 64 * 4
    )
    # 2 senders (of 2 rows) per pass, with room for 2.5x their estimate (what glibc keeps)
    budget = held + math.ceil(2 * 2 * _GLIBC_SLACK * per_row / _PLAN_SHARE) + 1
    assert _senders_fitting(gpt2_model, clean, [_r(r) for r in receivers], 8, budget) == 2
    held_run = path_patch_senders(
        gpt2_model, clean, corrupted, receivers=receivers, metric=metric, max_bytes=budget
    )
    pd.testing.assert_frame_equal(
        held_run.table, one.table, atol=CHUNK_ATOL, rtol=0, check_exact=False
    )
    with pytest.raises(MemoryBudgetError, match="max_bytes"):
        path_patch_senders(
            gpt2_model,
            clean,
            corrupted,
            receivers=receivers,
            metric=metric,
            max_bytes=held + per_row,
        )  # one row of the two
    with pytest.raises(ValueError, match="not both"):
        path_patch_senders(
            gpt2_model,
            clean,
            corrupted,
            receivers=receivers,
            metric=metric,
            max_bytes=budget,
            senders_per_pass=2,
        )


def _r(receiver):
    from interp.interventions.paths import as_receiver

    return as_receiver(receiver)


# ---- logit attribution over a batch ----


def _batch_prompts(model):
    texts = [
        "When Mary and John went to the store, John gave a drink to",
        "The Eiffel Tower is in the city of",
        "Then, Anne and Bob had a long talk with",
        "When Tom and Sue went to the park, Sue gave a ball to",
    ]
    lengths = [model.to_tokens(t).shape[1] for t in texts]
    assert len(set(lengths)) > 1 and len(lengths) > len(set(lengths))  # some share a length
    return texts


@pytest.mark.parametrize(
    "arch, wrong, neurons", [("gpt2", 17, False), ("gpt2", None, True), ("neox", None, False)]
)
def test_batched_attribution_equals_one_prompt_at_a_time(
    arch, wrong, neurons, gpt2_model, neox_model
):
    model = gpt2_model if arch == "gpt2" else neox_model
    texts = _batch_prompts(model)
    answers = [40, 41, 52, 7]
    folded = __import__("interp").fold_layernorm(model)
    n_pos = max(model.to_tokens(t).shape[1] for t in texts)
    from interp.attribution.rows import _bytes_per_row

    per_row = estimate_forward_bytes(folded, (1, n_pos))
    per_row += _bytes_per_row(model, folded, n_pos, neurons)
    budget = int(per_row / _PLAN_SHARE) + 1  # one prompt per pass
    assert (
        rows_per_chunk(
            folded,
            n_pos,
            budget,
            n_rows=4,
            kept_per_row=_bytes_per_row(model, folded, n_pos, neurons),
        )
        == 1
    )
    batch = logit_attribution_batch(
        model, texts, answers, wrong=wrong, neurons=neurons, max_bytes=budget
    )
    whole = logit_attribution_batch(model, texts, answers, wrong=wrong, neurons=neurons)
    assert list(batch.columns[:2]) == ["prompt", "component"]
    assert sorted(set(batch["prompt"])) == list(range(len(texts)))
    pd.testing.assert_frame_equal(batch, whole, atol=CHUNK_ATOL, rtol=0, check_exact=False)
    for i, (text, answer) in enumerate(zip(texts, answers, strict=True)):
        alone = logit_attribution(model, text, answer, wrong=wrong, neurons=neurons)
        rows = batch[batch["prompt"] == i].drop(columns="prompt").reset_index(drop=True)
        pd.testing.assert_frame_equal(rows, alone, atol=CHUNK_ATOL, rtol=0, check_exact=False)
        # each prompt's rows add up to that prompt's own logit (difference)
        total = rows.loc[rows["component"] == "total", "contribution"].item()
        parts = rows.loc[rows["component"] != "total", "contribution"].sum()
        assert parts == pytest.approx(total, abs=1e-9)
        assert total == pytest.approx(batch.attrs["prompts"][i]["reference"], abs=1e-4)
        assert batch.attrs["prompts"][i]["reference"] == pytest.approx(
            alone.attrs["reference"], abs=CHUNK_ATOL
        )


def test_batched_attribution_refuses_clearly(gpt2_model):
    texts = _batch_prompts(gpt2_model)
    with pytest.raises(MemoryBudgetError, match="logit attribution needs about .* raise max_bytes"):
        logit_attribution_batch(gpt2_model, texts, 40, max_bytes="10KB")
    with pytest.raises(ValueError, match="one per prompt"):
        logit_attribution_batch(gpt2_model, texts, [40, 41])
    with pytest.raises(ValueError, match="list of prompts"):
        logit_attribution_batch(gpt2_model, texts[0], 40)


# ---- the logit lens on an offloaded model ----


def test_logit_lens_on_an_offloaded_model_matches(bundled_model):
    in_memory = bundled_model
    offloaded = load_model("tiny-induction", device_map="auto", max_memory={"cpu": "1.3MB"})
    assert is_offloaded(offloaded)
    device_map = offloaded.original_model.hf_device_map
    assert device_map["gpt_neox.final_layer_norm"] == device_map["lm_head"] == "disk"
    prompt = [0] + list(range(5, 20)) + list(range(5, 12))
    a = logit_lens(in_memory, prompt, answer=12, wrong=30)
    b = logit_lens(offloaded, prompt, answer=12, wrong=30)
    pd.testing.assert_frame_equal(
        b.select_dtypes("number"),
        a.select_dtypes("number"),
        atol=OFFLOAD_ATOL,
        rtol=0,
        check_exact=False,
    )
    assert list(b["top1_id"]) == list(a["top1_id"])


# ---- a patching grid's peak memory, measured from outside (a child process) ----


@pytest.mark.slow
@pytest.mark.skipif(
    not __import__("os").path.exists("/proc/self/clear_refs"),
    reason="needs Linux's /proc peak-RSS counter",
)
def test_measured_grid_peak_stays_within_its_budget(gpt2_small_width_dir):
    """At GPT-2 small's width in 2 layers: the grid's peak is one pass's working memory (115 MB
    measured with 12 layers, 117 MB with 4 and 118 MB with 2; estimate / peak 1.05 to 1.09),
    while its time grows with the layers squared (one pass per layer, each through every layer:
    110 s of CPU for the two runs with 12 layers, 25 s with 4). Two layers still make two
    passes, and the budgeted run several chunks per layer."""
    from tests.engine.test_memory import _child_peak

    free = _child_peak(gpt2_small_width_dir, "grid", 4, None)  # 41 tokens, memory returned
    assert free["chunks"] == 1 and 0.9 <= free["estimate"] / free["peak"] <= 1.1
    budget = int(free["peak"] // 2)
    held = _child_peak(gpt2_small_width_dir, "grid", 4, str(budget))
    assert held["chunks"] >= 2 and held["peak"] <= 1.1 * budget
    assert held["induction"] == pytest.approx(free["induction"], abs=CHUNK_ATOL)
