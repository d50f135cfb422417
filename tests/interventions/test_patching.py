"""Activation patching: identities, the batched grid against a loop and TransformerLens."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from transformer_lens import patching as tl_patching

from interp import run_cached
from interp.engine import PromptError
from interp.interventions import (
    COLUMNS,
    GRIDS,
    Intervention,
    Site,
    logit_diff,
    patch_activations,
    run_patched,
)

SAME = 1e-6  # a patch that changes nothing: float32 rounding only
LOOP_ATOL = 1e-5  # batched rows against one run per patch: float32 summation order


@pytest.fixture(scope="module")
def prompts(gpt2_model):
    clean = gpt2_model.to_tokens("When Mary and John went to the store, John gave a drink to")
    corrupted = clean.clone()
    corrupted[0, 2:6] = torch.tensor([20, 31, 42, 53])
    answer, wrong = gpt2_model.to_tokens(" Mary", prepend_bos=False)[0, 0], 17
    return clean, corrupted, logit_diff(int(answer), wrong)


def _loop(model, base, source, sites, metric):
    """One run per patch, no batching: the reference for the fast grid."""
    cache = run_cached(model, source, hooks=sorted({s.hook_name for s in sites}))
    values = []
    for site in sites:
        run = run_cached(
            model, base, interventions=[Intervention(site, "patch", source=cache[site.hook_name])]
        )
        values.append(float(metric(run.logits)[0]))
    return torch.tensor(values, dtype=torch.float64)


def test_columns_and_attrs(gpt2_model, prompts):
    clean, corrupted, metric = prompts
    frame = patch_activations(gpt2_model, clean, corrupted, metric, sites=["resid_pre", "heads"])
    assert list(frame.columns) == COLUMNS
    assert str(frame["head"].dtype) == "Int64" and str(frame["pos"].dtype) == "Int64"
    resid = frame[frame["site"] == "resid_pre"]
    assert resid["head"].isna().all() and resid["pos"].notna().all()
    heads = frame[frame["site"] == "head"]
    assert heads["pos"].isna().all() and heads["head"].notna().all()
    c, r = frame.attrs["clean_metric"], frame.attrs["corrupted_metric"]
    assert c == pytest.approx(float(metric(run_cached(gpt2_model, clean).logits)[0]))
    assert r == pytest.approx(float(metric(run_cached(gpt2_model, corrupted).logits)[0]))
    torch.testing.assert_close(
        torch.tensor(frame["recovered"].to_numpy()),
        torch.tensor(((frame["metric"] - r) / (c - r)).to_numpy()),
    )


@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_patching_a_run_into_itself_changes_nothing(gpt2_model, prompts, direction):
    clean, _, metric = prompts
    frame = patch_activations(
        gpt2_model, clean, clean, metric, sites=list(GRIDS), direction=direction
    )
    assert (frame["metric"] - frame.attrs["clean_metric"]).abs().max() <= SAME
    assert frame["recovered"].isna().all() and frame.attrs["recovered_undefined"]


@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_the_whole_residual_stream_at_layer_0_gives_the_source_run(gpt2_model, prompts, direction):
    clean, corrupted, metric = prompts
    base, source = (corrupted, clean) if direction == "denoising" else (clean, corrupted)
    cache = run_cached(gpt2_model, source, hooks=["blocks.0.hook_resid_pre"])
    every_pos = [
        Intervention(Site("resid_pre", 0), "patch", source=cache["blocks.0.hook_resid_pre"])
    ]
    value = run_patched(gpt2_model, base, [every_pos], metric)
    expected = float(metric(cache.logits)[0])
    assert abs(float(value[0]) - expected) <= SAME
    assert abs(expected - float(metric(run_cached(gpt2_model, base).logits)[0])) > 1e3 * SAME


@pytest.mark.parametrize(("direction", "max_rows"), [("denoising", 3), ("noising", None)])
def test_fast_grid_equals_a_loop(gpt2_model, prompts, max_rows, direction):
    clean, corrupted, metric = prompts
    # the first 8 of the 16 tokens (the 4 corrupted ones among them): every grid, chunked and
    # not, with half the one-run-per-patch loop (440 patches, not 840)
    clean, corrupted = clean[:, :8], corrupted[:, :8]
    frame = patch_activations(
        gpt2_model,
        clean,
        corrupted,
        metric,
        sites=list(GRIDS),
        direction=direction,
        max_rows=max_rows,
    )
    sites = [
        Site(
            kind,
            int(layer),
            head=None if pd.isna(head) else int(head),
            pos=None if pd.isna(pos) else int(pos),
        )
        for kind, layer, head, pos in frame[["site", "layer", "head", "pos"]].itertuples(
            index=False
        )
    ]
    base, source = (corrupted, clean) if direction == "denoising" else (clean, corrupted)
    expected = _loop(gpt2_model, base, source, sites, metric)
    torch.testing.assert_close(
        torch.tensor(frame["metric"].to_numpy()), expected, atol=LOOP_ATOL, rtol=0
    )
    assert (frame["recovered"].abs() > 0.05).sum() > 5  # the patches do something


# our grid name -> TransformerLens function and how its result is laid out
TL_GRIDS = {
    "resid_pre": (tl_patching.get_act_patch_resid_pre, "layer pos"),
    "resid_mid": (tl_patching.get_act_patch_resid_mid, "layer pos"),
    "attn_out": (tl_patching.get_act_patch_attn_out, "layer pos"),
    "mlp_out": (tl_patching.get_act_patch_mlp_out, "layer pos"),
    "heads": (tl_patching.get_act_patch_attn_head_out_all_pos, "layer head"),
    "heads_pos": (tl_patching.get_act_patch_attn_head_out_by_pos, "layer pos head"),
    "q": (tl_patching.get_act_patch_attn_head_q_all_pos, "layer head"),
    "k": (tl_patching.get_act_patch_attn_head_k_all_pos, "layer head"),
    "v": (tl_patching.get_act_patch_attn_head_v_all_pos, "layer head"),
    "pattern": (tl_patching.get_act_patch_attn_head_pattern_all_pos, "layer head"),
    "q_pos": (tl_patching.get_act_patch_attn_head_q_by_pos, "layer pos head"),
    "k_pos": (tl_patching.get_act_patch_attn_head_k_by_pos, "layer pos head"),
    "v_pos": (tl_patching.get_act_patch_attn_head_v_by_pos, "layer pos head"),
    "pattern_pos": (tl_patching.get_act_patch_attn_head_pattern_by_pos, "layer head pos"),
}


@pytest.mark.parametrize("model_name", ["gpt2_model", "neox_model"])
def test_equals_transformer_lens_patching(model_name, request):
    model = request.getfixturevalue(model_name)
    # 7-8 tokens: TransformerLens patches one position at a time, in a Python loop
    clean = model.to_tokens("The cat sat on the mat.")
    corrupted = clean.clone()
    corrupted[0, 1:4] = torch.tensor([40, 41, 42])
    metric = logit_diff(int(clean[0, 4]), 7)
    frame = patch_activations(model, clean, corrupted, metric, sites=list(TL_GRIDS))
    _, cache = model.run_with_cache(clean)
    for grid, (fn, layout) in TL_GRIDS.items():
        with torch.no_grad():
            theirs = fn(model, corrupted, cache, lambda logits: metric(logits)[0])
        if layout == "layer pos head":
            theirs = theirs.permute(0, 2, 1)
        ours = frame[frame["site"] == GRIDS[grid][0]]
        ours = ours[ours["pos"].notna() if GRIDS[grid][2] else ours["pos"].isna()]
        torch.testing.assert_close(
            torch.tensor(ours["metric"].to_numpy(), dtype=torch.float32),
            theirs.flatten().float(),
            atol=LOOP_ATOL,
            rtol=0,
            msg=lambda m, grid=grid: f"{grid}: {m}",
        )


def test_different_lengths_are_refused_with_both_tokenisations(gpt2_model, prompts):
    with pytest.raises(PromptError, match=r"clean has \d+ \[.*'The'.*corrupted has \d+ \[.*"):
        patch_activations(gpt2_model, "The cat sat on the mat", "The dog", prompts[2])


def test_bad_arguments(gpt2_model, prompts):
    clean, corrupted, metric = prompts
    with pytest.raises(ValueError, match="unknown sites"):
        patch_activations(gpt2_model, clean, corrupted, metric, sites=["resid"])
    with pytest.raises(ValueError, match="direction"):
        patch_activations(gpt2_model, clean, corrupted, metric, direction="forwards")
    with pytest.raises(ValueError, match="method"):
        patch_activations(gpt2_model, clean, corrupted, metric, method="fast")
    with pytest.raises(ValueError, match="one value per batch row"):
        patch_activations(gpt2_model, clean, corrupted, lambda logits: logits[:, -1, :3])
    with pytest.raises(ValueError, match="max_rows"):
        run_patched(gpt2_model, clean, [[]], metric, max_rows=0)


def test_a_callable_metric_and_an_unpatched_row(gpt2_model, prompts):
    clean, corrupted, _ = prompts

    def metric(logits):
        return logits[:, -1].logsumexp(-1)

    values = run_patched(gpt2_model, corrupted, [[], []], metric, max_rows=1)
    expected = float(metric(run_cached(gpt2_model, corrupted).logits)[0])
    assert torch.allclose(values, torch.full((2,), expected), atol=SAME, rtol=0)
    assert not math.isnan(expected)


def test_causal_tracing_with_noise_on_the_corrupted_run_only(gpt2_model, prompts):
    """corrupted = clean + noise at position 2: restoring position 2 anywhere before the noise
    spreads, or the whole stream later, restores the clean run exactly; other positions at
    layer 0 were never corrupted, so patching them changes nothing."""
    clean, _, metric = prompts
    noise = [Intervention(Site("resid_pre", 0, pos=2), "noise", std=3.0, seed=0)]
    frame = patch_activations(
        gpt2_model, clean, clean, metric, sites=["resid_pre"], corruption=noise, method="both"
    )
    assert not frame.attrs["recovered_undefined"]
    exact = frame[frame["method"] == "exact"].set_index(["layer", "pos"])["metric"]
    clean_m, corrupted_m = frame.attrs["clean_metric"], frame.attrs["corrupted_metric"]
    assert abs(clean_m - corrupted_m) > 1e3 * SAME
    assert abs(exact.loc[(0, 2)] - clean_m) <= LOOP_ATOL
    others = [(0, p) for p in range(clean.shape[1]) if p != 2]
    assert (exact.loc[others] - corrupted_m).abs().max() <= LOOP_ATOL
    noised = patch_activations(
        gpt2_model, clean, clean, metric, sites=["resid_pre"], corruption=noise, direction="noising"
    )
    assert noised.attrs["clean_metric"] == frame.attrs["clean_metric"]
    assert noised.attrs["corrupted_metric"] == pytest.approx(frame.attrs["corrupted_metric"])


@pytest.fixture(scope="module")
def attn_only_model(tmp_path_factory):
    """A TransformerLens-native attention-only model (no resid_mid, no MLP hooks)."""
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import PreTrainedTokenizerFast

    from tests.checkpoints import make_tokenizer

    directory = tmp_path_factory.mktemp("attn-only-tokenizer")
    make_tokenizer(200).save_pretrained(directory)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(directory)
    config = TransformerBridgeConfig(
        d_model=32,
        d_head=8,
        n_layers=2,
        n_ctx=32,
        n_heads=4,
        d_vocab=len(tokenizer),
        attn_only=True,
        act_fn="gelu",
        normalization_type="LN",
        seed=0,
    )
    return TransformerBridge.boot_native(config, tokenizer=tokenizer).eval()


def test_attention_only_model(attn_only_model):
    model = attn_only_model
    clean = model.to_tokens("The cat sat on the mat")
    corrupted = clean.clone()
    corrupted[0, 2] = 5
    metric = logit_diff(3, 4)
    frame = patch_activations(model, clean, corrupted, metric, sites=["resid_pre", "heads"])
    _, cache = model.run_with_cache(clean)
    for grid, fn in (
        ("resid_pre", tl_patching.get_act_patch_resid_pre),
        ("heads", tl_patching.get_act_patch_attn_head_out_all_pos),
    ):
        with torch.no_grad():
            theirs = fn(model, corrupted, cache, lambda logits: metric(logits)[0]).flatten()
        ours = frame[frame["site"] == GRIDS[grid][0]]["metric"].to_numpy()
        torch.testing.assert_close(
            torch.tensor(ours, dtype=torch.float32), theirs.float(), atol=LOOP_ATOL, rtol=0
        )
    with pytest.raises(ValueError, match="attention-only models have no resid_mid or mlp_out"):
        patch_activations(model, clean, corrupted, metric, sites=["mlp_out"])


def test_a_model_in_training_mode_is_refused(attn_only_model, prompts):
    attn_only_model.train()
    try:
        with pytest.raises(ValueError, match=r"training mode.*model.eval\(\)"):
            run_patched(attn_only_model, [0, 1, 2], [[]], logit_diff(1, 2))
        with pytest.raises(ValueError, match="training mode"):
            patch_activations(
                attn_only_model, [0, 1, 2], [0, 1, 3], logit_diff(1, 2), method="attribution"
            )
    finally:
        attn_only_model.eval()
