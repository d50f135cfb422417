"""Gemma Scope, EleutherAI sparsify and dictionary_learning folders: each detected from its
files and computed as its own library computes it (the formulas written out here in float64
from the libraries' code: the Gemma Scope tutorial's JumpReLUSAE, sparsify's SparseCoder,
dictionary_learning's dictionaries and load_dictionary), encode, decode, reconstruction and
spliced logits; each refusal in one line."""

from __future__ import annotations

import pytest
import torch

from interp import load_sae
from interp.saes.loading import SAELoadError, sae_format
from tests.sae_folders import (
    check_splice,
    dictionary_learning_folder,
    gemmascope_folder,
    sparsify_folder,
)

ATOL = 1e-5  # float32 dot products of width 64-96 with O(1) terms, against float64


def _x(n: int = 12, d: int = 64) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(3)) * 1.5 + 0.4


def _close(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert torch.allclose(got.double(), expected, atol=ATOL), (got.double() - expected).abs().max()


# Gemma Scope ------------------------------------------------------------------------------


def gemmascope_reference(p: dict, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tutorial: pre = x W_enc + b_enc; f = (pre > threshold) * ReLU(pre); f W_dec + b_dec."""
    p = {k: torch.from_numpy(v).double() for k, v in p.items()}
    pre = x.double() @ p["W_enc"] + p["b_enc"]
    f = (pre > p["threshold"]).double() * torch.relu(pre)
    return f, f @ p["W_dec"] + p["b_dec"]


@pytest.mark.parametrize(
    ("site", "hook"),
    [("res", "blocks.1.hook_resid_post"), ("mlp", "blocks.1.hook_mlp_out"),
     ("att", "blocks.1.attn.hook_z")],
)  # fmt: skip
def test_gemmascope_is_the_tutorials_jumprelu(tmp_path, bundled_model, site, hook):
    folder, params = gemmascope_folder(tmp_path, site)
    assert sae_format(folder) == "gemmascope"
    sae = load_sae(folder)
    assert (sae.architecture, sae.hook_name, sae.apply_b_dec_to_input) == ("jumprelu", hook, False)
    x = _x()
    f_ref, out_ref = gemmascope_reference(params, x)
    assert (f_ref > 0).any() and (f_ref == 0).any()
    z = x.reshape(12, 4, 16) if site == "att" else x  # hook_z: [... head d_head], flattened
    _close(sae.encode(z), f_ref)
    _close(sae.decode(sae.encode(z), z).reshape(12, 64), out_ref)
    check_splice(bundled_model, sae, lambda x: gemmascope_reference(params, x)[1], hook)


def test_gemmascope_without_a_layer_in_its_path_needs_a_hook(tmp_path):
    folder, _ = gemmascope_folder(tmp_path, "res")
    moved = folder.rename(tmp_path / "elsewhere")
    with pytest.raises(SAELoadError, match="pass hook_name=") as info:
        load_sae(moved)
    assert "\n" not in str(info.value)
    assert load_sae(moved, hook_name="blocks.0.hook_resid_post").hook_name.startswith("blocks.0")


# sparsify ---------------------------------------------------------------------------------


def sparsify_reference(w: dict, x: torch.Tensor, k: int, transcode: bool = False):
    """SparseCoder: x - b_dec (not when transcoding), ReLU(x W^T + b), its k largest,
    sum of those rows of W_dec + b_dec, + x W_skip^T with a skip connection."""
    w = {n: t.double() for n, t in w.items()}
    x = x.double()
    xin = x if transcode else x - w["b_dec"]
    pre = torch.relu(xin @ w["encoder.weight"].T + w["encoder.bias"])
    f = torch.zeros_like(pre)
    for n in range(pre.shape[0]):
        top = pre[n].argsort(descending=True)[:k]
        f[n, top] = pre[n, top]
    out = sum(f[:, j, None] * w["W_dec"][j] for j in range(f.shape[1])) + w["b_dec"]
    return f, out + (x @ w["W_skip"].T if "W_skip" in w else 0)


@pytest.mark.parametrize(
    ("hookpoint", "hook"),
    [("layers.1", "blocks.1.hook_resid_post"), ("layers.0.mlp", "blocks.0.hook_mlp_out"),
     ("h.1.attn", "blocks.1.hook_attn_out")],
)  # fmt: skip
def test_sparsify_topk_at_its_hookpoint(tmp_path, bundled_model, hookpoint, hook):
    w = sparsify_folder(tmp_path, hookpoint)
    sae = load_sae(tmp_path / hookpoint)
    assert (sae.architecture, sae.k, sae.hook_name, sae.source) == ("topk", 8, hook, "sparsify")
    x = _x()
    f_ref, out_ref = sparsify_reference(w, x, 8)
    _close(sae.encode(x), f_ref)
    _close(sae(x), out_ref)
    check_splice(bundled_model, sae, lambda x: sparsify_reference(w, x, 8)[1], hook)


def test_sparsify_skip_connection_and_transcoder(tmp_path):
    w = sparsify_folder(tmp_path / "a", "layers.1", skip=True)
    _close(load_sae(tmp_path / "a" / "layers.1")(_x()), sparsify_reference(w, _x(), 8)[1])
    w = sparsify_folder(tmp_path / "b", "layers.1.mlp", transcode=True, skip=True)
    tc = load_sae(tmp_path / "b" / "layers.1.mlp")
    assert (tc.hook_name, tc.output_hook_name) == ("blocks.1.mlp.hook_in", "blocks.1.hook_mlp_out")
    f_ref, out_ref = sparsify_reference(w, _x(), 8, transcode=True)
    _close(tc.encode(_x()), f_ref)
    _close(tc(_x()), out_ref)


def test_sparsify_keeps_its_dtype_and_a_root_of_hookpoints_names_them(tmp_path):
    sparsify_folder(tmp_path, "layers.0", dtype=torch.bfloat16)
    sparsify_folder(tmp_path, "layers.1", seed=1)
    assert load_sae(tmp_path / "layers.0").W_enc.dtype == torch.bfloat16
    with pytest.raises(SAELoadError, match=r"holds 2 SAEs \(layers.0, layers.1\)"):
        load_sae(tmp_path)


# dictionary_learning ----------------------------------------------------------------------


def dictionary_learning_reference(cls: str, sd: dict, x: torch.Tensor):
    """The dictionary's encode and decode after ``load_dictionary`` (AutoEncoder's decoder
    normalized by ``from_pretrained``), in float64."""
    sd = {n: t.double() for n, t in sd.items() if t.is_floating_point()}
    x = x.double()
    if cls == "AutoEncoder":
        norms = sd["decoder.weight"].norm(dim=0)
        enc, dec = sd["encoder.weight"] * norms[:, None], sd["decoder.weight"] / norms
        f = torch.relu((x - sd["bias"]) @ enc.T + sd["encoder.bias"] * norms)
        return f, f @ dec.T + sd["bias"]
    if cls == "AutoEncoderNew":
        f = torch.relu(x @ sd["encoder.weight"].T + sd["encoder.bias"])
        return f, f @ sd["decoder.weight"].T + sd["decoder.bias"]
    if cls == "GatedAutoEncoder":
        e = (x - sd["decoder_bias"]) @ sd["encoder.weight"].T
        f = (e + sd["gate_bias"] > 0).double() * torch.relu(sd["r_mag"].exp() * e + sd["mag_bias"])
        return f, f @ sd["decoder.weight"].T + sd["decoder_bias"]
    if cls == "JumpReluAutoEncoder":
        pre = x @ sd["W_enc"] + sd["b_enc"]
        f = torch.relu(pre * (pre > sd["threshold"]))
        return f, f @ sd["W_dec"] + sd["b_dec"]
    if cls == "MatryoshkaBatchTopKSAE":
        a = torch.relu((x - sd["b_dec"]) @ sd["W_enc"] + sd["b_enc"])
        f = a * (a > sd["threshold"])
        return f, f @ sd["W_dec"] + sd["b_dec"]
    a = torch.relu((x - sd["b_dec"]) @ sd["encoder.weight"].T + sd["encoder.bias"])
    if cls == "BatchTopKSAE":
        f = a * (a > sd["threshold"])
    else:  # AutoEncoderTopK: the k largest per row
        f = torch.zeros_like(a)
        for n in range(a.shape[0]):
            top = a[n].argsort(descending=True)[:8]
            f[n, top] = a[n, top]
    return f, f @ sd["decoder.weight"].T + sd["b_dec"]


CLASSES = ["AutoEncoder", "AutoEncoderNew", "GatedAutoEncoder", "JumpReluAutoEncoder",
           "AutoEncoderTopK", "BatchTopKSAE", "MatryoshkaBatchTopKSAE"]  # fmt: skip


@pytest.mark.parametrize("cls", CLASSES)
def test_dictionary_learning_is_its_dictionary(tmp_path, bundled_model, cls):
    sd = dictionary_learning_folder(tmp_path / "d", cls)
    assert sae_format(tmp_path / "d") == "dictionary_learning"
    sae = load_sae(tmp_path / "d")
    assert (sae.hook_name, sae.source) == ("blocks.1.hook_resid_pre", "dictionary_learning")
    x = _x()
    f_ref, out_ref = dictionary_learning_reference(cls, sd, x)
    assert (f_ref > 0).any() and (f_ref == 0).any()
    _close(sae.encode(x), f_ref)
    _close(sae(x), out_ref)
    check_splice(
        bundled_model, sae, lambda x: dictionary_learning_reference(cls, sd, x)[1],
        "blocks.1.hook_resid_pre",
    )  # fmt: skip


def test_dictionary_learning_hooks_from_the_layer_or_hook_name(tmp_path):
    dictionary_learning_folder(tmp_path / "a", "AutoEncoder", trainer={"submodule_name": None})
    assert load_sae(tmp_path / "a").hook_name == "blocks.1.hook_resid_post"
    dictionary_learning_folder(tmp_path / "b", "AutoEncoder", trainer={"submodule_name": "x.y"})
    with pytest.raises(SAELoadError, match="pass hook_name="):
        load_sae(tmp_path / "b")
    assert load_sae(tmp_path / "b", hook_name="blocks.0.hook_mlp_out").hook_name.endswith("mlp_out")


def test_every_format_saves_as_a_saelens_folder_that_loads_back_the_same(tmp_path):
    folder, _ = gemmascope_folder(tmp_path / "g", "att")
    sparsify_folder(tmp_path / "s", "layers.1")
    dictionary_learning_folder(tmp_path / "d", "BatchTopKSAE")
    for i, path in enumerate([folder, tmp_path / "s" / "layers.1", tmp_path / "d"]):
        sae = load_sae(path)
        sae.save(tmp_path / f"saved{i}")
        back = load_sae(tmp_path / f"saved{i}")
        x = _x().reshape(12, 4, 16) if sae.reshape_activations == "hook_z" else _x()
        assert (back.source, back.hook_name) == ("saelens", sae.hook_name)
        assert torch.equal(back.encode(x), sae.encode(x)) and torch.equal(back(x), sae(x))
    sparsify_folder(tmp_path / "k", "layers.1", skip=True)
    with pytest.raises(ValueError, match="SAELens has no topk SAE with a skip connection"):
        load_sae(tmp_path / "k" / "layers.1").save(tmp_path / "never")
    assert not (tmp_path / "never").exists()
