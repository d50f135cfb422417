"""interp.saes: encode/decode against SAELens's formulas written out here, save/load round
trips, the bundled SAE by name, hub names (the hub faked), and every refusal in one line."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from interp.saes.loading import SAEFitError, SAELoadError, check_sae_fits, load_sae
from interp.saes.sae import SAE

D_IN, D_SAE = 6, 10


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "W_enc": torch.randn(D_IN, D_SAE, generator=g),
        "b_enc": torch.randn(D_SAE, generator=g) * 0.5,
        "W_dec": torch.randn(D_SAE, D_IN, generator=g),
        "b_dec": torch.randn(D_IN, generator=g),
        "threshold": torch.rand(D_SAE, generator=g),
    }


def _sae(architecture: str, apply_b_dec: bool, w: dict) -> SAE:
    return SAE(
        w["W_enc"], w["b_enc"], w["W_dec"], w["b_dec"],
        architecture=architecture, hook_name="blocks.0.hook_resid_pre",
        threshold=w["threshold"] if architecture == "jumprelu" else None,
        k=3 if architecture == "topk" else None, apply_b_dec_to_input=apply_b_dec,
    )  # fmt: skip


def _saelens_encode(x, w, architecture, apply_b_dec):
    """SAELens 6's encode, element by element in float64 (no torch.relu, no topk)."""
    x, out = x.double(), torch.zeros(x.shape[0], D_SAE, dtype=torch.float64)
    for n in range(x.shape[0]):
        xin = x[n] - w["b_dec"].double() if apply_b_dec else x[n]
        h = [float(xin @ w["W_enc"][:, j].double() + w["b_enc"][j]) for j in range(D_SAE)]
        if architecture == "standard":
            acts = [max(v, 0.0) for v in h]
        elif architecture == "jumprelu":  # ReLU(h) * (h > threshold): at the threshold, 0
            acts = [max(v, 0.0) if v > float(w["threshold"][j]) else 0.0 for j, v in enumerate(h)]
        else:  # topk: the 3 largest pre-activations through ReLU, every other 0
            top = sorted(range(D_SAE), key=lambda j: -h[j])[:3]
            acts = [max(h[j], 0.0) if j in top else 0.0 for j in range(D_SAE)]
        out[n] = torch.tensor(acts, dtype=torch.float64)
    return out


@pytest.mark.parametrize("apply_b_dec", [False, True])
@pytest.mark.parametrize("architecture", ["standard", "jumprelu", "topk"])
def test_encode_and_decode_are_saelens_formulas(architecture, apply_b_dec):
    w = _weights()
    sae = _sae(architecture, apply_b_dec, w)
    x = torch.randn(7, D_IN, generator=torch.Generator().manual_seed(1)) * 2
    f = sae.encode(x)
    expected = _saelens_encode(x, w, architecture, apply_b_dec)
    assert torch.allclose(f.double(), expected, atol=1e-5)
    assert (f >= 0).all() and (f.double() > 0).sum() > 0
    if architecture == "topk":
        assert ((f > 0).sum(-1) <= 3).all()
    recon = expected @ w["W_dec"].double() + w["b_dec"].double()
    assert torch.allclose(sae.decode(f).double(), recon, atol=1e-5)
    assert torch.equal(sae(x), sae.decode(sae.encode(x)))


def test_jumprelu_exactly_at_its_threshold_is_zero():
    w = _weights()
    w["b_enc"] = w["b_enc"].abs() + 0.1
    w["threshold"][2] = w["b_enc"][2]  # x = 0: the pre-activation is b_enc, exactly
    f = _sae("jumprelu", False, w).encode(torch.zeros(1, D_IN))
    assert f[0, 2] == 0
    above = w["b_enc"] > w["threshold"]
    assert torch.equal(f[0], torch.where(above, w["b_enc"], torch.zeros(D_SAE)))


def test_topk_with_every_pre_activation_negative_gives_zeros():
    w = _weights()
    w["b_enc"] = torch.full((D_SAE,), -1e3)
    assert torch.equal(_sae("topk", False, w).encode(torch.randn(4, D_IN)), torch.zeros(4, D_SAE))


@pytest.mark.parametrize("architecture", ["standard", "jumprelu", "topk"])
def test_save_and_load_round_trip(tmp_path, architecture):
    sae = _sae(architecture, True, _weights(2))
    sae.save(tmp_path / "sae")
    back = load_sae(tmp_path / "sae")
    for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
        assert torch.equal(getattr(back, name), getattr(sae, name))
    assert (back.architecture, back.hook_name, back.k, back.apply_b_dec_to_input) == (
        architecture, "blocks.0.hook_resid_pre", sae.k, True,
    )  # fmt: skip
    if architecture == "jumprelu":
        assert torch.equal(back.threshold, sae.threshold)


def _saelens6_folder(path, architecture="standard", changes=None):
    """A folder as SAELens 6 saves one: the hook under metadata."""
    path.mkdir()
    w = _weights(3)
    tensors = {k: v for k, v in w.items() if k != "threshold" or architecture == "jumprelu"}
    save_file(tensors, str(path / "sae_weights.safetensors"))
    cfg = {
        "architecture": architecture, "d_in": D_IN, "d_sae": D_SAE, "dtype": "float32",
        "device": "cpu", "apply_b_dec_to_input": True, "normalize_activations": "none",
        "reshape_activations": "none",
        "metadata": {"hook_name": "blocks.1.hook_resid_pre", "model_name": "m"},
    } | ({"k": 4} if architecture == "topk" else {}) | (changes or {})  # fmt: skip
    (path / "cfg.json").write_text(json.dumps(cfg))
    return path


def test_saelens6_and_older_configs_load(tmp_path):
    sae = load_sae(_saelens6_folder(tmp_path / "a", "topk"))
    assert (sae.hook_name, sae.k, sae.cfg["metadata"]["model_name"]) == (
        "blocks.1.hook_resid_pre", 4, "m",
    )  # fmt: skip
    older = {"k": None, "hook_name": "blocks.0.hook_resid_pre", "metadata": None,
             "activation_fn_kwargs": {"k": 2}}  # fmt: skip
    older = _saelens6_folder(tmp_path / "b", "topk", older)
    assert (load_sae(older).hook_name, load_sae(older).k) == ("blocks.0.hook_resid_pre", 2)


def test_the_bundled_sae_loads_by_name(bundled_model):
    sae = load_sae("tiny-induction-sae")
    assert (sae.architecture, sae.d_sae, sae.k, sae.hook_name) == (
        "topk", 512, 16, "blocks.1.hook_resid_pre",
    )  # fmt: skip
    check_sae_fits(bundled_model, sae)
    norms = sae.W_dec.norm(dim=1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5)


def _refused(tmp_path, match, changes):
    folder = _saelens6_folder(tmp_path / "s", changes=changes)
    with pytest.raises(SAELoadError, match=match) as info:
        load_sae(folder)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"architecture": "abstopk"}, "architecture='abstopk': interp computes"),
        ({"normalize_activations": "expected_average_only_in"}, "normalize_activations"),
        ({"metadata": {}}, "names no hook_name"),
        ({"d_sae": 11}, "d_sae=11 but the weights are 6x10"),
        ({"architecture": "jumprelu"}, "lacks threshold"),
        ({"architecture": "topk", "k": None}, "k=None: a topk SAE needs k"),
    ],
)
def test_bad_configs_are_refused_in_one_line(tmp_path, changes, match):
    _refused(tmp_path, match, changes)


def test_not_an_sae_is_refused_naming_what_is_missing(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "cfg.json").write_text("{}")
    with pytest.raises(SAELoadError, match="has none of cfg.json . sae_weights.safetensors"):
        load_sae(tmp_path / "x")
    (tmp_path / "f.txt").write_text("")
    with pytest.raises(SAELoadError, match="is a file"):
        load_sae(tmp_path / "f.txt")
    with pytest.raises(SAELoadError, match="not a bundled SAE"):
        load_sae("no-such-sae")


def test_hub_names_download_or_say_what_to_download(tmp_path, monkeypatch):
    import huggingface_hub

    folder = _saelens6_folder(tmp_path / "hub")
    calls = []

    def fake(repo, filename):
        calls.append((repo, filename))
        return str(folder / filename.split("/")[-1])

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake)
    assert load_sae("owner/repo/layer_1").hook_name == "blocks.1.hook_resid_pre"
    assert calls == [
        ("owner/repo", "layer_1/cfg.json"),
        ("owner/repo", "layer_1/sae_weights.safetensors"),
    ]

    def offline(repo, filename):
        raise OSError("no connection")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(SAELoadError, match="huggingface-cli download owner/repo cfg.json") as info:
        load_sae("owner/repo")
    assert "\n" not in str(info.value)


def test_an_sae_that_does_not_fit_the_model_is_refused(bundled_model):
    w = _weights()
    wrong_width = _sae("standard", False, w)
    with pytest.raises(SAEFitError, match="d_in=6 .* width 64"):
        check_sae_fits(bundled_model, wrong_width)
    wrong_hook = SAE(*(w[k] for k in ("W_enc", "b_enc", "W_dec", "b_dec")), hook_name="blocks.9.x")
    with pytest.raises(SAEFitError, match="no hook for"):
        check_sae_fits(bundled_model, wrong_hook)
