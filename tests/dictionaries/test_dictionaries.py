"""The one dictionary core: each activation against its formula as SAELens and circuit-tracer
write it, the maps against the dense formulas, SAE and TranscoderSet built on it, one
FeatureEdit for both (its new settings against a plain decode), and the old import paths
working with a DeprecationWarning."""

from __future__ import annotations

import importlib

import pytest
import torch

import interp
from interp import load_sae, run_cached
from interp.dictionaries.activations import activate, activation_name
from interp.dictionaries.core import Dictionary
from interp.engine.feature_edit import FeatureEdit
from interp.saes.interventions import ablate_feature
from tests.transcoder_folders import random_transcoders

ATOL = 1e-5  # float32 logits of a 2-layer model
HOOK = "blocks.1.hook_resid_pre"
PROMPT = "x = len(self); y = len("


def _h(seed: int = 0) -> torch.Tensor:
    return torch.randn(4, 6, 32, generator=torch.Generator().manual_seed(seed))


def test_jumprelu_floor_is_saelens_and_no_floor_circuit_tracer():
    h = _h()
    theta = torch.linspace(-0.5, 0.5, 32)  # negative thresholds: where the two differ
    saelens = torch.relu(h) * (h > theta).to(h.dtype)
    circuit_tracer = h * (h > theta)
    assert torch.equal(activate("jumprelu", h, threshold=theta, floor=True), saelens)
    assert torch.equal(activate("jumprelu", h, threshold=theta, floor=False), circuit_tracer)
    assert (circuit_tracer < 0).any()  # the case the parameter is for happened


def test_topk_keeps_the_k_largest_through_relu_or_as_they_are():
    h = _h(1) - 1.5  # most entries negative, so some of the top k are too
    k = 5
    values, index = torch.topk(h, k, dim=-1)
    saelens = torch.zeros_like(h).scatter(-1, index, values.relu())
    circuit_tracer = torch.zeros_like(h).scatter(-1, index, values)
    assert torch.equal(activate("topk", h, k=k, floor=True), saelens)
    assert torch.equal(activate("topk", h, k=k, floor=False), circuit_tracer)
    assert (circuit_tracer < 0).any()


def test_relu_and_batchtopk():
    h = _h(2)
    assert torch.equal(activate("relu", h), h.clamp_min(0))
    f = activate("batchtopk", h, k=3.5)
    assert int((f != 0).sum()) == int(3.5 * 24)  # int(k n) over the 24 rows of the call
    kept = h.relu().flatten().topk(int(3.5 * 24)).values
    assert torch.equal(f.flatten().sort().values[-len(kept) :], kept.sort().values)
    assert activation_name("standard") == "relu" and activation_name("jump_relu") == "jumprelu"
    with pytest.raises(ValueError, match="unknown activation 'gelu'"):
        activation_name("gelu")


def test_the_maps_are_the_dense_formulas_and_shapes_are_checked():
    g = torch.Generator().manual_seed(3)
    W_enc, b_enc = torch.randn(16, 32, generator=g), torch.randn(32, generator=g)
    W_dec, b_dec = torch.randn(32, 8, generator=g), torch.randn(8, generator=g)
    W_skip = torch.randn(8, 16, generator=g)
    d = Dictionary(W_enc, b_enc, W_dec, b_dec, activation="topk", k=4, W_skip=W_skip)
    x = torch.randn(5, 16, generator=g)
    f = d.encode(x)
    assert torch.equal(f, activate("topk", x @ W_enc + b_enc, k=4))
    assert torch.allclose(d.decode(f) + d.skip(x), f @ W_dec + b_dec + x @ W_skip.T)
    with pytest.raises(ValueError, match=r"2: W_skip has shape \(16, 8\), expected \(8, 16\)"):
        Dictionary(W_enc, b_enc, W_dec, b_dec, W_skip=W_skip.T, what="layer 2")
    with pytest.raises(ValueError, match="a topk layer 2 needs k"):
        Dictionary(W_enc, b_enc, W_dec, b_dec, activation="topk", what="layer 2")


def test_saes_and_transcoder_sets_are_built_on_it(zoo):
    sae = load_sae("tiny-induction-sae")
    assert isinstance(sae, Dictionary) and sae.floor
    tc = random_transcoders(zoo.model("gpt2"), activation="jumprelu")
    x = torch.randn(3, tc.d_model)
    for layer in range(tc.n_layers):
        assert isinstance(tc.layers[layer], Dictionary) and not tc.layers[layer].floor
        assert torch.equal(tc.encode(x, layer), tc.layers[layer].encode(x))
    moved = tc.to(dtype=torch.float64)
    assert moved.layers[0].W_enc.dtype == torch.float64  # .to rebuilds the layers' views
    assert tc.layers[0].W_enc.dtype == torch.float32  # and leaves the set as it was


def test_one_feature_edit_and_the_old_paths_are_gone():
    """One FeatureEdit; 0.6's old names for it and the core's parts went in 0.7.0."""
    assert interp.FeatureEdit is interp.dictionaries.FeatureEdit is FeatureEdit
    old_names = {
        "interp.saes.interventions": "FeatureEdit",
        "interp.engine.transcoder_splice": "FeatureEdit",
        "interp.saes.sae": "decoder_flag",
    }
    for module, name in old_names.items():
        assert not hasattr(importlib.import_module(module), name), (module, name)
    for module in ("interp.saes.data", "interp.saes.safetensors_file"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(module)


def test_feature_edit_names_one_dictionary(bundled_model):
    sae = load_sae("tiny-induction-sae")
    assert FeatureEdit(layer=1, feature=2).layer == 1 and FeatureEdit(sae=sae, feature=2).sae is sae
    assert FeatureEdit(sae, 2).value == 0.0 and FeatureEdit(1, 2, 0, scale=3.0).value is None
    with pytest.raises(ValueError, match="names one dictionary"):
        FeatureEdit(1, 2, layer=1)
    with pytest.raises(ValueError, match="index >= 0"):
        FeatureEdit(layer=-1, feature=2)
    with pytest.raises(ValueError, match="0 .. 511"):
        FeatureEdit(sae, 512)
    with pytest.raises(ValueError, match="not as an intervention"):
        run_cached(bundled_model, PROMPT, interventions=[FeatureEdit(1, 2)])
    tc = interp.load_transcoders("tiny-induction-transcoders")
    with pytest.raises(ValueError, match="edits an SAE"):
        run_cached(bundled_model, PROMPT, transcoders=tc, feature_edits=[ablate_feature(sae, 2)])


def test_an_sae_edit_scales_as_a_plain_decode_says(bundled_model):
    sae = load_sae("tiny-induction-sae")
    acts = run_cached(bundled_model, PROMPT, saes=[sae])[f"{HOOK}.hook_sae_acts"]
    feature = int(acts[0, -1].argmax())
    tokens = run_cached(bundled_model, PROMPT).tokens

    def hook(x, hook):  # decode(f with f_j doubled at the last position) + the error
        f = sae.encode(x)
        edited = f.clone()
        edited[:, -1, feature] *= 2.0
        return sae.decode(edited) + (x - sae.decode(f))

    with torch.no_grad():
        expected = bundled_model.run_with_hooks(tokens, fwd_hooks=[(HOOK, hook)])
    edit = FeatureEdit(sae, feature, -1, scale=2.0)
    doubled = run_cached(bundled_model, PROMPT, interventions=[edit]).logits
    assert torch.allclose(doubled, expected, atol=ATOL)
    assert not torch.allclose(doubled, run_cached(bundled_model, PROMPT).logits, atol=1e-3)


def test_a_transcoder_edit_takes_a_tensor_of_values(bundled_model):
    tc = interp.load_transcoders("tiny-induction-transcoders")
    base = run_cached(bundled_model, PROMPT, transcoders=tc, hooks=[tc.output_hook(1)])
    acts = base["blocks.1.hook_transcoder_acts"]  # [1 pos d_tc]
    feature = int(acts[0, -1].argmax())
    values = torch.rand(acts.shape[:2], generator=torch.Generator().manual_seed(0))
    edit = FeatureEdit(1, feature, value=values)
    run = run_cached(bundled_model, PROMPT, transcoders=tc, hooks=[tc.output_hook(1)],
                     feature_edits=[edit])  # fmt: skip
    assert torch.equal(run["blocks.1.hook_transcoder_acts"][..., feature], values)
    change = run[tc.output_hook(1)] - base[tc.output_hook(1)]
    want = (values - acts[..., feature])[..., None] * tc.W_dec(1)[feature]
    torch.testing.assert_close(change, want, atol=ATOL, rtol=0)


def test_weight_files_are_read_or_named(tmp_path):
    import numpy as np
    from safetensors.torch import save_file

    from interp.dictionaries.files import read_tensors

    w = {"W_enc": torch.randn(4, 3), "b_enc": torch.randn(3)}
    save_file(w, str(tmp_path / "a.safetensors"))
    np.savez(tmp_path / "b.npz", **{k: v.numpy() for k, v in w.items()})
    for name in ("a.safetensors", "b.npz"):
        back = read_tensors(tmp_path / name)
        assert back.keys() == w.keys() and all(torch.equal(back[k], w[k]) for k in w)
    data = (tmp_path / "a.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-5])
    with pytest.raises(ValueError, match=r"cut\.safetensors is not a readable .* cut short"):
        read_tensors(tmp_path / "cut.safetensors")
    with pytest.raises(ValueError, match="is missing"):
        read_tensors(tmp_path / "nope.safetensors")


def test_a_transcoder_layer_writes_the_width_it_reads():
    from interp.transcoders.transcoder import TranscoderSet

    W_enc, b_enc = [torch.randn(4, 8)], [torch.randn(4)]
    with pytest.raises(ValueError, match=r"layer 0: W_dec has shape \(4, 7\), expected \(4, 8\)"):
        TranscoderSet(W_enc, b_enc, [torch.randn(4, 7)], [torch.randn(7)])
