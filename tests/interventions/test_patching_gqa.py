"""Key and value grids on grouped-query models: one site per shared key/value head, each equal
to patching that head's slice of ``hook_k``/``hook_v`` by hand."""

import pytest
import torch

from interp.interventions import logit_diff, patch_activations
from tests.zoo import GQA_ARCHS

CLEAN, CORRUPTED = "hello world foo", "hello wxrld foo"


def _by_hand(model, kind: str, layer: int, head: int, pos: int | None, answer: int) -> float:
    clean = model.to_tokens(CLEAN)
    corrupted = model.to_tokens(CORRUPTED)
    name = f"blocks.{layer}.attn.hook_{kind}"
    _, cache = model.run_with_cache(clean, names_filter=name)

    def patch(act, hook):
        where = slice(None) if pos is None else pos
        act[:, where, head] = cache[name][:, where, head]
        return act

    with torch.no_grad():
        logits = model.run_with_hooks(corrupted, fwd_hooks=[(name, patch)])
    return float(logits[0, -1, answer])


@pytest.mark.parametrize("arch", GQA_ARCHS)
def test_kv_grids_have_one_site_per_shared_head(zoo, arch):
    model = zoo.model(arch)
    n_kv = int(model.cfg.n_key_value_heads)
    assert n_kv < model.cfg.n_heads  # the zoo's GQA models do group their queries
    answer = 3
    frame = patch_activations(
        model, CLEAN, CORRUPTED, logit_diff(answer), sites=["k", "v", "k_pos", "q"]
    )
    heads = frame[frame["pos"].isna()].groupby("site")["head"].agg(["min", "max", "nunique"])
    assert heads.loc["k"].tolist() == [0, n_kv - 1, n_kv]
    assert heads.loc["v"].tolist() == [0, n_kv - 1, n_kv]
    assert heads.loc["q"].tolist() == [0, model.cfg.n_heads - 1, model.cfg.n_heads]
    layer = int(model.cfg.n_layers) - 1
    for kind, pos in [("k", None), ("v", None), ("k", 2)]:
        rows = frame[(frame["site"] == kind) & (frame["layer"] == layer)]
        rows = rows[rows["pos"].isna()] if pos is None else rows[rows["pos"] == pos]
        for head in range(n_kv):
            got = float(rows[rows["head"] == head]["metric"].iloc[0])
            expected = _by_hand(model, kind, layer, head, pos, answer)
            assert got == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("arch", GQA_ARCHS[:1])
def test_kv_attribution_grid_on_gqa(zoo, arch):
    model = zoo.model(arch)
    frame = patch_activations(
        model, CLEAN, CORRUPTED, logit_diff(3), sites=["k", "v"], method="both"
    )
    exact = frame[frame["method"] == "exact"]
    estimate = frame[frame["method"] == "attribution"]
    assert len(exact) == len(estimate) == 2 * model.cfg.n_layers * model.cfg.n_key_value_heads
    assert torch.isfinite(torch.tensor(estimate["metric"].to_numpy())).all()
