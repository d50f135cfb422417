"""On the bundled model, the heads the induction scan names are the ones that restore the
induction prediction when patched from ``[BOS] a + a`` into a copy whose first half differs."""

from __future__ import annotations

import pytest
import torch

from interp import detect_induction_heads, run_cached
from interp.induction import ordinary_token_ids
from interp.interventions import Intervention, Site, answer_loss, patch_activations, run_patched

RESTORES = 0.1  # a head "restores" the prediction when patching it recovers 10% of the gap


@pytest.fixture(scope="module")
def setup(bundled_model):
    model = bundled_model
    vocab = ordinary_token_ids(model.tokenizer, 2000)
    gen = torch.Generator().manual_seed(0)
    a, b = (vocab[torch.randint(len(vocab), (12,), generator=gen)] for _ in range(2))
    bos = torch.tensor([model.tokenizer.bos_token_id])
    # the model should predict a[-1] after a[:-1]: the second half repeats the first
    clean = torch.cat([bos, a, a[:-1]])[None]
    corrupted = torch.cat([bos, b, a[:-1]])[None]
    table = detect_induction_heads(model)
    induction = {(int(r.layer), int(r.head)) for r in table.itertuples() if r.is_induction}
    return model, clean, corrupted, answer_loss(int(a[-1])), induction


def test_single_heads_that_restore_are_induction_heads(setup):
    model, clean, corrupted, metric, induction = setup
    frame = patch_activations(model, clean, corrupted, metric, sites=["heads", "heads_pos"])
    assert frame.attrs["corrupted_metric"] - frame.attrs["clean_metric"] > 3  # nats
    heads = frame[frame["pos"].isna()]
    restoring = {(int(r.layer), int(r.head)) for r in heads.itertuples() if r.recovered > RESTORES}
    assert restoring and restoring <= induction
    # and they do it at the position that makes the prediction
    per_pos = frame[frame["pos"].notna() & (frame["recovered"] > RESTORES)]
    assert set(per_pos["pos"]) == {clean.shape[1] - 1}


def test_induction_heads_together_restore_the_prediction_and_no_others_do(setup):
    model, clean, corrupted, metric, induction = setup
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    others = {(layer, head) for layer in range(n_layers) for head in range(n_heads)} - induction
    cache = run_cached(
        model, clean, hooks=[f"blocks.{layer}.attn.hook_z" for layer in range(n_layers)]
    )

    def row(heads):
        return [
            Intervention(
                Site("head", layer, head=head), "patch", source=cache[f"blocks.{layer}.attn.hook_z"]
            )
            for layer, head in sorted(heads)
        ]

    clean_m = float(metric(cache.logits)[0])
    corrupted_m = float(metric(run_cached(model, corrupted).logits)[0])
    values = run_patched(model, corrupted, [row(induction), row(others)], metric)
    recovered = (values - corrupted_m) / (clean_m - corrupted_m)
    assert recovered[0] > 0.9
    assert recovered[1] < RESTORES
