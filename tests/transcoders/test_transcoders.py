"""Transcoders: circuit-tracer folders read and written, features computed as circuit-tracer
does, fit refused in one line, and spliced into a run (the model's logits with error terms,
the transcoders' own without; feature edits move the output by exactly their decoder rows)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from interp import load_transcoders
from interp.engine import FeatureEdit, run_cached
from interp.transcoders.loading import (
    TranscoderFitError,
    TranscoderLoadError,
    check_transcoders_fit,
)
from tests.transcoder_folders import make_transcoder_folder, random_transcoders, write_raw_folder

TOKENS = torch.tensor([[0, 5, 17, 33, 99, 12, 7, 5, 17]])
# the error term adds and subtracts the reconstruction: float32 rounding of values of a few
# units over 2 layers stays far below 1e-5
ATOL = 1e-5

CASES = [
    ("per-layer", "relu", True),
    ("per-layer", "jumprelu", False),
    ("per-layer", "topk", True),
    ("cross-layer", "relu", False),
    ("cross-layer", "jumprelu", False),
]


def _weights(tc):
    out = []
    for layer in range(tc.n_layers):
        out += [tc.W_enc(layer), tc.b_enc(layer), tc.W_dec(layer), tc.b_dec(layer)]
        out += [t for t in (tc.threshold(layer), tc.W_skip(layer)) if t is not None]
    return out


@pytest.mark.parametrize("kind,activation,skip", CASES)
def test_folder_round_trip(zoo, tmp_path, kind, activation, skip):
    model = zoo.model("gpt2")
    tc = random_transcoders(model, kind=kind, activation=activation, skip=skip)
    loaded = load_transcoders(write_raw_folder(tmp_path / "raw", tc))
    assert (loaded.kind, loaded.activation, loaded.k, loaded.has_skip) == (
        kind,
        activation,
        tc.k,
        skip,
    )
    for a, b in zip(_weights(tc), _weights(loaded), strict=True):
        assert torch.equal(a, b)
    again = load_transcoders(loaded.save(tmp_path / "saved"))
    for a, b in zip(_weights(tc), _weights(again), strict=True):
        assert torch.equal(a, b)
    assert (tmp_path / "saved" / "config.yaml").is_file()


def test_features_are_circuit_tracers(zoo):
    model = zoo.model("gpt2")
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(1)) * 8
    for activation in ("relu", "jumprelu", "topk"):
        tc = random_transcoders(model, activation=activation)
        h = x @ tc.W_enc(1).T + tc.b_enc(1)
        if activation == "relu":
            want = torch.clamp(h, min=0)
        elif activation == "jumprelu":
            want = torch.where(h > tc.threshold(1), h, torch.zeros_like(h))
        else:  # the k largest kept as they are (negative ones too)
            want = torch.where(h >= h.topk(tc.k, dim=-1).values[..., -1:], h, 0 * h)
        assert torch.equal(tc.encode(x, 1), want)


def test_splice_with_and_without_error_terms(zoo):
    model = zoo.model("gpt2")
    plain = run_cached(model, TOKENS).logits
    for kind, activation, skip in CASES:
        tc = random_transcoders(model, kind=kind, activation=activation, skip=skip)
        hooks = [tc.input_hook(lay) for lay in range(2)] + [tc.output_hook(lay) for lay in range(2)]
        same = run_cached(model, TOKENS, transcoders=tc)
        assert (same.logits - plain).abs().max() <= ATOL
        own = run_cached(model, TOKENS, transcoders=tc, use_error_term=False, hooks=hooks)
        assert (own.logits - plain).abs().max() > 0.1  # random transcoders change the model
        feats = []
        for layer in range(2):
            x = own[tc.input_hook(layer)]
            f = own[f"blocks.{layer}.hook_transcoder_acts"]
            assert torch.equal(f, tc.encode(x, layer))
            feats.append(f)
            if kind == "per-layer":
                want = f @ tc.W_dec(layer) + tc.b_dec(layer)
            else:
                want = tc.b_dec(layer) + sum(
                    feats[s] @ tc.W_dec(s)[:, layer - s] for s in range(layer + 1)
                )
            if skip:
                want = want + x @ tc.W_skip(layer).T
            torch.testing.assert_close(own[tc.output_hook(layer)], want, atol=1e-5, rtol=1e-5)


def test_feature_edit_moves_the_output_by_its_decoder_row(zoo):
    model = zoo.model("gpt2")
    tc = random_transcoders(model)
    base = run_cached(model, TOKENS, transcoders=tc, hooks=[tc.output_hook(1)])
    acts = base["blocks.1.hook_transcoder_acts"][0]
    pos, feature = (int(i) for i in torch.nonzero(acts[1:])[0])
    pos += 1
    edited = run_cached(
        model,
        TOKENS,
        transcoders=tc,
        hooks=[tc.output_hook(1)],
        feature_edits=[FeatureEdit(layer=1, feature=feature, pos=pos, value=0.0)],
    )
    change = edited[tc.output_hook(1)][0] - base[tc.output_hook(1)][0]
    want = torch.zeros_like(change)
    want[pos] = -acts[pos, feature] * tc.W_dec(1)[feature]
    torch.testing.assert_close(change, want, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="exactly one of"):
        FeatureEdit(layer=0, feature=0, value=1.0, scale=2.0)
    assert FeatureEdit(layer=0, feature=0).value == 0.0  # neither: zero-ablation, as for SAEs


def _shape(n_layers: int, d_model: int):
    return SimpleNamespace(cfg=SimpleNamespace(n_layers=n_layers, d_model=d_model))


def test_misfits_refused_in_one_line(zoo, tmp_path):
    gpt2, gptj = zoo.model("gpt2"), zoo.model("gptj")
    tc = random_transcoders(gpt2)
    cases = [
        (random_transcoders(_shape(3, 64)), "cover 3 layers"),
        (random_transcoders(_shape(2, 48)), "width 48"),
        (random_transcoders(gptj, input_hook="hook_resid_mid"), "no hook for"),
        (random_transcoders(gpt2, input_hook="mlp.hook_post"), "interp splices"),
    ]
    check_transcoders_fit(gpt2, tc)
    for bad, message in cases:
        model = gptj if bad.feature_input_hook == "hook_resid_mid" else gpt2
        with pytest.raises(TranscoderFitError, match=message) as err:
            check_transcoders_fit(model, bad)
        assert "\n" not in str(err.value)


def test_bad_folders_refused(zoo, tmp_path):
    model = zoo.model("gpt2")
    folder = make_transcoder_folder(tmp_path / "tc", model)
    (folder / "layer_0.safetensors").unlink()  # layers 1.. without 0
    with pytest.raises(TranscoderLoadError, match="layer_0.safetensors"):
        load_transcoders(folder)
    with pytest.raises(TranscoderLoadError, match="no transcoder folder"):
        load_transcoders(tmp_path / "nothing")
    (folder / "config.yaml").write_text("model_kind: sae\n")
    with pytest.raises(TranscoderLoadError, match="model_kind"):
        load_transcoders(folder)
    (folder / "config.yaml").write_text("model_kind: transcoder_set\ntranscoders: [hf://a/b]\n")
    with pytest.raises(TranscoderLoadError, match="hub files"):
        load_transcoders(folder)
