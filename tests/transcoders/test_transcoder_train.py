"""interp.train_transcoder: trained transcoders recover a planted sparse map (per-layer and
cross-layer), the reported figures equal an independent computation, the saved folder loads
back as the same set, and the same seed gives the same weights."""

from __future__ import annotations

import pytest
import torch

from interp.dictionaries.data import TokenRows
from interp.transcoders import fit as fitting
from interp.transcoders.loading import load_transcoders
from interp.transcoders.train import EVAL_SEED, EVAL_TOKENS, train_transcoder

N_PLANTED, D_MODEL, N_LAYERS = 12, 32, 2
COS_MIN = 0.9  # a recovered direction (the SAE trainer's bar)
# float32 encode/decode summed over 16k tokens x 64 dims, against float64 here
ATOL_FIGURES = 1e-4


def _unit(n: int, d: int, gen) -> torch.Tensor:
    v = torch.randn(n, d, generator=gen)
    return v / v.norm(dim=1, keepdim=True)


def _planted(cross: bool, seed: int = 0):
    """Per layer l: inputs x_l = s_l D_in[l], outputs y_l = s_l D_out[l] (+ s_0 D_cross for
    layer 1 when ``cross``: layer 0's features also write layer 1), with each token's codes
    s_l on 1 or 2 of N_PLANTED features, coefficients in [1, 2]."""
    gen = torch.Generator().manual_seed(seed)
    D_in = torch.stack([_unit(N_PLANTED, D_MODEL, gen) for _ in range(N_LAYERS)])
    D_out = torch.stack([_unit(N_PLANTED, D_MODEL, gen) for _ in range(N_LAYERS)])
    D_cross = _unit(N_PLANTED, D_MODEL, gen)

    def draw(n: int = 8192):
        s = torch.zeros(n, N_LAYERS, N_PLANTED)
        for layer in range(N_LAYERS):
            for row in range(n):
                chosen = torch.randperm(N_PLANTED, generator=gen)[: 1 + (row % 2)]
                s[row, layer, chosen] = 1 + torch.rand(len(chosen), generator=gen)
        x = torch.einsum("nlf,lfd->nld", s, D_in)
        y = torch.einsum("nlf,lfd->nld", s, D_out)
        if cross:
            y[:, 1] += s[:, 0] @ D_cross
        return x, y

    return draw, D_out, D_cross


def _fit(draw, *, cross: bool, activation: str, k=None, sparsity=0.05, steps=800):
    gen = torch.Generator().manual_seed(0)
    p = fitting.init_params(
        N_LAYERS, D_MODEL, 32, cross=cross, skip=False, activation=activation, gen=gen
    )
    p = {name: t.requires_grad_() for name, t in p.items()}
    mask = torch.ones(N_LAYERS, N_LAYERS).triu() if cross else torch.eye(N_LAYERS)
    data = draw()
    fitting.fit(
        lambda: data, p, mask, activation=activation, k=k, sparsity=sparsity, steps=steps,
        batch_tokens=256, lr=3e-3, progress=False,
    )  # fmt: skip
    ones = torch.ones(N_LAYERS)
    return fitting.fold(p, mask, ones, ones, activation), data


@pytest.mark.slow
@pytest.mark.parametrize("activation, k", [("relu", None), ("topk", 2), ("jumprelu", None)])
def test_per_layer_transcoders_recover_every_planted_output_direction(activation, k):
    draw, D_out, _ = _planted(cross=False)
    sparsity, steps = {"relu": (0.05, 800), "topk": (0.0, 1500), "jumprelu": (0.1, 1200)}[
        activation
    ]
    w, _ = _fit(draw, cross=False, activation=activation, k=k, sparsity=sparsity, steps=steps)
    for layer in range(N_LAYERS):
        dec = w["W_dec"][layer, :, 0]
        dec = dec / dec.norm(dim=1, keepdim=True).clamp_min(1e-12)
        cosines = (D_out[layer] @ dec.T).max(dim=1).values
        assert cosines.min() >= COS_MIN, (layer, cosines)


@pytest.mark.slow
def test_a_cross_layer_transcoder_recovers_the_planted_path_into_the_next_layer():
    """Layer 0's feature i writes D_out[0, i] into layer 0 and D_cross[i] into layer 1: its
    decoder row over both layers points along [D_out[0, i], D_cross[i]]."""
    draw, D_out, D_cross = _planted(cross=True)
    w, _ = _fit(draw, cross=True, activation="relu", steps=1200)
    planted = torch.cat([D_out[0], D_cross], dim=1) / 2**0.5  # [N_PLANTED 2*d_model]
    rows = w["W_dec"][0].reshape(w["W_dec"].shape[1], -1)  # layer 0's rows over both layers
    rows = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-12)
    cosines = (planted @ rows.T).max(dim=1).values
    assert cosines.min() >= COS_MIN, cosines
    assert w["W_dec"][1, :, 0].abs().max() == 0  # layer 1 cannot write layer 0 (the mask)


@pytest.fixture(scope="module")
def texts(neox_model):
    gen = torch.Generator().manual_seed(1)
    return [
        neox_model.tokenizer.decode(torch.randint(1, 400, (200,), generator=gen).tolist())
        for _ in range(40)
    ]


def _train(model, texts, **kwargs):
    args = dict(d_tc=32, steps=40, batch_tokens=128, progress=False)
    return train_transcoder(model, None, texts, **{**args, **kwargs})


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, activation, extra",
    [("per-layer", "relu", {}), ("skip", "topk", {"k": 4}), ("cross-layer", "jumprelu", {})],
)
def test_figures_equal_an_independent_computation_and_the_folder_loads_back(
    neox_model, texts, tmp_path, kind, activation, extra
):
    model = neox_model
    tc, report = _train(
        model, texts, kind=kind, activation=activation, out=tmp_path / "tc", **extra
    )
    rows = TokenRows(model, texts, torch.Generator()).held_out(EVAL_TOKENS, EVAL_SEED)
    n = model.cfg.n_layers
    names = [f"blocks.{layer}.mlp.hook_{io}" for io in ("in", "out") for layer in range(n)]
    xs, ys = [], []
    for tokens in rows:  # run_with_cache, not the engine; BOS at position 0 left out
        _, cache = model.run_with_cache(tokens, names_filter=names)
        keep = torch.ones(tokens.shape, dtype=torch.bool)
        keep[:, 0] = tokens[:, 0] != model.tokenizer.bos_token_id
        xs.append(torch.stack([cache[f"blocks.{i}.mlp.hook_in"][keep] for i in range(n)], 1))
        ys.append(torch.stack([cache[f"blocks.{i}.mlp.hook_out"][keep] for i in range(n)], 1))
    x, y = torch.cat(xs).double(), torch.cat(ys).double()
    loaded = load_transcoders(tmp_path / "tc")
    acts = []
    for layer in range(n):  # the formulas of circuit-tracer's encode, in float64
        pre = x[:, layer] @ loaded.W_enc(layer).double().T + loaded.b_enc(layer).double()
        if activation == "relu":
            acts.append(torch.relu(pre))
        elif activation == "jumprelu":
            acts.append(pre * (pre > loaded.threshold(layer).double()))
        else:
            top = pre.topk(extra["k"], dim=-1).indices
            acts.append(torch.zeros_like(pre).scatter(-1, top, pre.gather(-1, top)))
    for layer in range(n):
        if kind == "cross-layer":
            y_hat = loaded.b_dec(layer).double() + sum(
                acts[s] @ loaded.W_dec(s)[:, layer - s].double() for s in range(layer + 1)
            )
        else:
            y_hat = acts[layer] @ loaded.W_dec(layer).double() + loaded.b_dec(layer).double()
        if kind == "skip":
            y_hat = y_hat + x[:, layer] @ loaded.W_skip(layer).double().T
        fvu = (y[:, layer] - y_hat).pow(2).sum() / (y[:, layer] - y[:, layer].mean(0)).pow(2).sum()
        row = report.figures.iloc[layer]
        assert row["fvu"] == pytest.approx(fvu.item(), abs=ATOL_FIGURES)
        assert row["l0"] == pytest.approx((acts[layer] != 0).sum(1).double().mean().item())
        assert row["dead"] == int(((acts[layer] != 0).sum(0) == 0).sum())
    for layer in range(n):  # what was saved is what was returned
        assert torch.equal(loaded.W_enc(layer), tc.W_enc(layer))
        assert torch.equal(loaded.W_dec(layer), tc.W_dec(layer))
    assert loaded.kind == ("cross-layer" if kind == "cross-layer" else "per-layer")
    assert loaded.activation == activation and loaded.has_skip == (kind == "skip")
    assert report.history["step"].iloc[-1] == 39
    assert f"{report.figures['fvu'].mean():.4f}" in report._repr_html_()


@pytest.mark.slow
def test_the_same_seed_gives_the_same_weights(neox_model, texts):
    a, _ = _train(neox_model, texts, steps=10, seed=3)
    b, _ = _train(neox_model, texts, steps=10, seed=3)
    c, _ = _train(neox_model, texts, steps=10, seed=4)
    for layer in range(a.n_layers):
        assert torch.equal(a.W_enc(layer), b.W_enc(layer))
        assert torch.equal(a.W_dec(layer), b.W_dec(layer))
    assert not torch.equal(a.W_dec(0), c.W_dec(0))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(kind="transcoder"), "cannot be trained"),
        (dict(activation="gelu"), "is not one of"),
        (dict(activation="topk"), "topk needs k"),
        (dict(k=4), "topk needs k"),
        (dict(d_tc=0), "must be positive"),
        (dict(layers=[0]), "covers every layer"),
    ],
)
def test_bad_settings_are_refused_in_one_line(neox_model, kwargs, match):
    args = {"d_tc": 8, **kwargs}
    with pytest.raises(ValueError, match=match) as info:
        train_transcoder(neox_model, **args)
    assert "\n" not in str(info.value)
