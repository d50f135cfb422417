"""The bundled transcoder set (interp/bundled/tiny-induction-transcoders): listed by ``interp
models``, loads by name and fits the bundled model, small, and its training figures
(TRAINING.json, docs/graphs.md) equal a recomputation from its weight files on the bundled
model's held-out tokens."""

from __future__ import annotations

import json

import pytest
import torch

from interp.cli import main
from interp.dictionaries.data import TokenRows
from interp.models.sources import BUNDLED_DIR
from interp.transcoders.loading import check_transcoders_fit, load_transcoders
from interp.transcoders.train import EVAL_SEED, EVAL_TOKENS

NAME = "tiny-induction-transcoders"
FOLDER = BUNDLED_DIR / NAME
MAX_BYTES = 1_000_000  # "a few MB at most"; two 512-feature layers of a 64-wide model
ROUNDING = 1e-4  # TRAINING.json keeps 4 decimals of FVU, 3 of L0


def test_the_set_is_listed_loads_by_name_and_is_small(capsys, bundled_model):
    assert main(["models"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(NAME + "\t"))
    assert line.split("\t")[2] == (
        "transcoders: per-layer, topk (k=16), reads mlp.hook_in, writes mlp.hook_out"
    )
    tc = load_transcoders(NAME)
    check_transcoders_fit(bundled_model, tc)
    assert (tc.n_layers, tc.d_tc, tc.activation, tc.k) == (2, 512, "topk", 16)
    assert sum(p.stat().st_size for p in FOLDER.iterdir()) <= MAX_BYTES


@pytest.mark.slow
def test_the_recorded_figures_equal_a_recomputation(bundled_model):
    model = bundled_model
    tc = load_transcoders(NAME)
    meta = json.loads((FOLDER / "TRAINING.json").read_text())
    assert meta["eval_tokens"] == EVAL_TOKENS
    gen = torch.Generator().manual_seed(meta["config"]["seed"])
    rows = TokenRows(model, None, gen).held_out(EVAL_TOKENS, EVAL_SEED)
    layers = range(len(meta["figures"]))
    names = [f"blocks.{layer}.mlp.{hook}" for layer in layers for hook in ("hook_in", "hook_out")]
    read = {name: [] for name in names}
    for tokens in rows:  # run_with_cache, not the engine; BOS at position 0 left out
        _, cache = model.run_with_cache(tokens, names_filter=names)  # every layer in one pass
        keep = torch.ones(tokens.shape, dtype=torch.bool)
        keep[:, 0] = tokens[:, 0] != model.tokenizer.bos_token_id
        for name in names:
            read[name].append(cache[name][keep])
    for layer, recorded in enumerate(meta["figures"]):
        x = torch.cat(read[f"blocks.{layer}.mlp.hook_in"]).double()
        y = torch.cat(read[f"blocks.{layer}.mlp.hook_out"]).double()
        pre = x @ tc.W_enc(layer).double().T + tc.b_enc(layer).double()
        top = pre.topk(tc.k, dim=-1).indices
        acts = torch.zeros_like(pre).scatter(-1, top, pre.gather(-1, top))
        y_hat = acts @ tc.W_dec(layer).double() + tc.b_dec(layer).double()
        fvu = (y - y_hat).pow(2).sum() / (y - y.mean(0)).pow(2).sum()
        assert recorded["fvu"] == pytest.approx(fvu.item(), abs=ROUNDING)
        assert recorded["l0"] == pytest.approx((acts != 0).sum(1).double().mean().item(), abs=1e-3)
        assert recorded["dead"] == int(((acts != 0).sum(0) == 0).sum())
