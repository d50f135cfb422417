"""A training from a store within ``max_bytes`` (interp.stores.budget): the held-out figures
computed pass by pass equal those computed at once (to rounding), and a budget too small for
the training itself is refused before any forward pass, naming a least budget that works.
The whole call's peak, measured: test_stores_streaming.py (slow)."""

from __future__ import annotations

import re

import pytest
import torch

import interp.engine.cache
import interp.saes.train as sae_train
import interp.transcoders.train as tc_train
from interp import train_sae, train_transcoder
from interp.dictionaries.data import TokenRows, activations_at
from interp.saes.held_out import figures as sae_figures
from interp.saes.held_out import streamed_figures as sae_streamed
from interp.stores import fill_store
from interp.stores.budget import MARGIN, split_rows
from interp.stores.evaluation import CentredSquares
from interp.transcoders.held_out import figures as tc_figures
from interp.transcoders.held_out import streamed_figures as tc_streamed

HOOK = "blocks.1.hook_resid_pre"
MLP = [f"blocks.{n}.mlp.{side}" for n in (0, 1) for side in ("hook_in", "hook_out")]
# float32 activations: the per-pass sums add in another order than one sum over all tokens
RTOL = 1e-5  # relative, for a few thousand float32 terms summed in two orders


def test_centred_squares_combined_pass_by_pass_equal_one_sum():
    x = torch.randn(1000, 3, 5, generator=torch.Generator().manual_seed(0)) * 7 + 40
    squares = CentredSquares()
    for part in x.split(37):
        squares.add(part)
    direct = (x.double() - x.double().mean(0)).pow(2).sum(0)
    assert len(squares) == 1000
    torch.testing.assert_close(squares.total, direct, rtol=1e-12, atol=0)  # float64 both ways
    with pytest.raises(ValueError, match="no values"):
        _ = CentredSquares().total


@pytest.fixture(scope="module")
def trained(bundled_model):
    sae, _ = train_sae(bundled_model, HOOK, d_sae=32, architecture="topk", k=4, steps=20,
                       batch_tokens=64, progress=False)  # fmt: skip
    tc, _ = train_transcoder(bundled_model, d_tc=16, steps=20, batch_tokens=64, progress=False)
    rows = TokenRows(bundled_model, None, torch.Generator().manual_seed(0))
    return sae, tc, rows.held_out(2048, 12345)


def test_sae_figures_pass_by_pass_equal_those_at_once(bundled_model, trained):
    sae, _, held_out = trained
    at_once = sae_figures(sae, activations_at(bundled_model, HOOK, held_out), sae_train.EVAL_CHUNK)
    passes = (activations_at(bundled_model, HOOK, [r]) for r in split_rows(held_out, 3))
    streamed = sae_streamed(sae, passes, 100)
    assert streamed["l0"] == pytest.approx(at_once["l0"], rel=RTOL)
    assert streamed["dead_features"] == at_once["dead_features"]
    for key in ("explained_variance", "mse"):
        assert streamed[key] == pytest.approx(at_once[key], rel=RTOL), key


def test_transcoder_figures_pass_by_pass_equal_those_at_once(bundled_model, trained):
    _, tc, held_out = trained
    layers = [0, 1]
    at_once = tc_figures(tc, *tc_train._pairs(bundled_model, held_out, layers), tc_train.EVAL_CHUNK)
    passes = (tc_train._pairs(bundled_model, [r], layers) for r in split_rows(held_out, 5))
    streamed = tc_streamed(tc, passes, 100)
    assert streamed["dead"].tolist() == at_once["dead"].tolist()
    for key in ("fvu", "l0"):
        torch.testing.assert_close(
            torch.tensor(streamed[key].values), torch.tensor(at_once[key].values), rtol=RTOL,
            atol=0,
        )  # fmt: skip


def test_a_budget_too_small_for_the_training_is_refused_naming_one_that_works(
    tmp_path, bundled_model, monkeypatch
):
    rows = torch.randint(1, 500, (16, 32), generator=torch.Generator().manual_seed(0))
    store = fill_store(tmp_path / "s", bundled_model, [HOOK, *MLP], rows, progress=False)
    calls = [0]
    real = interp.engine.cache.forward

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(interp.engine.cache, "forward", counted)
    sae = dict(d_sae=32, architecture="topk", k=4, steps=3, batch_tokens=64, progress=False)
    tc = dict(d_tc=16, steps=3, batch_tokens=64, progress=False)
    for train, args in ((train_sae, (HOOK,)), (train_transcoder, ())):
        kwargs = sae if train is train_sae else tc
        calls[0] = 0
        with pytest.raises(ValueError, match="Adam's moments") as refused:
            train(bundled_model, *args, store=store, max_bytes=2**20, **kwargs)
        assert calls[0] == 0  # refused before the model ran
        least = int(re.search(r"at least ([\d,]+) bytes", str(refused.value))[1].replace(",", ""))
        assert least > MARGIN  # the margin alone is more than 1 MiB
        with pytest.raises(ValueError, match="too small"):
            train(bundled_model, *args, store=store, max_bytes=least - 1, **kwargs)
        train(bundled_model, *args, store=store, max_bytes=least, **kwargs)  # taken
