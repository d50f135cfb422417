"""interp.saes.train: a trained SAE recovers planted feature directions, its reported figures
equal an independent computation, and the same seed gives the same weights."""

from __future__ import annotations

import pytest
import torch

from interp.dictionaries.data import TokenRows
from interp.models.loading import load_model
from interp.saes.train import EVAL_SEED, EVAL_TOKENS, train_sae
from tests.checkpoints import make_checkpoint

HOOK = "blocks.0.hook_resid_pre"  # = the token's embedding: no position embedding (rotary)
N_PLANTED = 12
COS_MIN = 0.9  # the bar for a recovered direction
ATOL_FIGURES = 1e-5  # float32 sums over 32k tokens x 64 dims against float64


def _planted(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(directions [N_PLANTED d_model] unit, embeddings [d_vocab d_model]): every token's
    embedding is 1 or 2 planted directions with coefficients in [1, 2]."""
    gen = torch.Generator().manual_seed(seed)
    d_vocab, d_model = 400, 64
    directions = torch.randn(N_PLANTED, d_model, generator=gen)
    directions /= directions.norm(dim=1, keepdim=True)
    coef = torch.zeros(d_vocab, N_PLANTED)
    for token in range(d_vocab):
        n = 1 + int(torch.rand(1, generator=gen) < 0.5)
        chosen = torch.randperm(N_PLANTED, generator=gen)[:n]
        coef[token, chosen] = 1 + torch.rand(n, generator=gen)
    return directions, coef @ directions


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A 1-layer rotary model whose embeddings are sparse sums of planted directions, and
    texts that cover its vocabulary."""
    model = load_model(make_checkpoint(tmp_path_factory.mktemp("planted"), arch="neox", n_layers=1))
    directions, embeddings = _planted()
    with torch.no_grad():
        model.original_model.gpt_neox.embed_in.weight.copy_(embeddings)
    gen = torch.Generator().manual_seed(1)
    texts = [
        model.tokenizer.decode(torch.randint(1, 400, (200,), generator=gen).tolist())
        for _ in range(40)
    ]
    return model, directions, texts


def _train(planted, **kwargs):
    model, _, texts = planted
    args = dict(d_sae=32, l1_coefficient=0.3, steps=600, batch_tokens=256, lr=3e-3, progress=False)
    return train_sae(model, HOOK, texts, **{**args, **kwargs})


def _max_cosines(sae, directions) -> torch.Tensor:
    dec = sae.W_dec.detach() / sae.W_dec.detach().norm(dim=1, keepdim=True)
    return (directions @ dec.T).max(dim=1).values


def test_the_hook_holds_the_planted_embeddings(planted):
    model, _, _ = planted
    tokens = torch.tensor([[5, 17, 230]])
    _, cache = model.run_with_cache(tokens, names_filter=HOOK)
    embed = model.original_model.gpt_neox.embed_in.weight
    torch.testing.assert_close(cache[HOOK][0], embed[tokens[0]], rtol=0, atol=0)


@pytest.mark.parametrize("architecture, extra", [("standard", {}), ("topk", {"k": 2})])
def test_a_trained_sae_recovers_every_planted_direction(planted, architecture, extra):
    sae, report = _train(planted, architecture=architecture, **extra)
    cosines = _max_cosines(sae, planted[1])
    assert cosines.min() >= COS_MIN, cosines
    assert report.explained_variance > 0.9
    assert report.steps == 600 and report.tokens == 600 * 256


def test_reported_figures_equal_an_independent_computation(planted):
    model, _, texts = planted
    sae, report = _train(planted, steps=200)
    rows = TokenRows(model, texts, torch.Generator()).held_out(EVAL_TOKENS, EVAL_SEED)
    xs = []
    for tokens in rows:  # run_with_cache, not the engine; BOS at position 0 left out
        _, cache = model.run_with_cache(tokens, names_filter=HOOK)
        keep = torch.ones(tokens.shape, dtype=torch.bool)
        keep[:, 0] = tokens[:, 0] != model.tokenizer.bos_token_id
        xs.append(cache[HOOK][keep])
    x = torch.cat(xs).double()
    with torch.no_grad():
        pre = (x - sae.b_dec.double()) @ sae.W_enc.double() + sae.b_enc.double()
        f = torch.relu(pre)
        x_hat = f @ sae.W_dec.double() + sae.b_dec.double()
    resid = ((x - x_hat) ** 2).sum()
    total = ((x - x.mean(0)) ** 2).sum()
    assert report.explained_variance == pytest.approx((1 - resid / total).item(), abs=ATOL_FIGURES)
    assert report.l0 == pytest.approx((f > 0).sum(1).double().mean().item(), abs=ATOL_FIGURES)
    assert report.mse == pytest.approx(((x - x_hat) ** 2).mean().item(), rel=1e-4)
    dead = tuple(torch.nonzero((f > 0).sum(0) == 0).flatten().tolist())
    assert report.dead_features == dead
    assert report.dead_fraction == len(dead) / sae.d_sae
    html = report._repr_html_()
    assert f"{report.explained_variance:.4f}" in html and "<script" not in html
    history = report.history
    assert list(history.columns[:5]) == ["step", "loss", "mse", "l0", "explained_variance"]
    assert history["step"].iloc[-1] == 199


def test_the_same_seed_gives_the_same_weights(planted):
    a, _ = _train(planted, steps=30, seed=3)
    b, _ = _train(planted, steps=30, seed=3)
    c, _ = _train(planted, steps=30, seed=4)
    for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert not torch.equal(a.W_dec, c.W_dec)


def test_decoder_rows_have_unit_norm(planted):
    sae, _ = _train(planted, steps=30)
    norms = sae.W_dec.detach().norm(dim=1)
    torch.testing.assert_close(norms, torch.ones_like(norms))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(architecture="jumprelu"), "cannot be trained"),
        (dict(architecture="topk"), "needs k"),
        (dict(k=4), "k is for topk"),
        (dict(d_sae=0), "must be positive"),
    ],
)
def test_bad_settings_are_refused_in_one_line(planted, kwargs, match):
    model, _, texts = planted
    args = {"d_sae": 8, **kwargs}
    with pytest.raises(ValueError, match=match) as info:
        train_sae(model, HOOK, texts, **args)
    assert "\n" not in str(info.value)


def test_an_unknown_hook_is_refused(planted):
    model, _, texts = planted
    with pytest.raises(KeyError, match="did you mean"):
        train_sae(model, "blocks.0.hook_resid_pree", texts, d_sae=8)


@pytest.mark.parametrize(
    "texts, match",
    [("one string", "list of strings"), (["", ""], "texts is empty"), (["a b"], "pass at least")],
)
def test_bad_texts_are_refused_in_one_line(planted, texts, match):
    with pytest.raises(ValueError, match=match) as info:
        train_sae(planted[0], HOOK, texts, d_sae=8)
    assert "\n" not in str(info.value)
