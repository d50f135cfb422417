"""SAELens transcoders read by load_transcoders: folders written as SAELens 6 writes them
(tests/sae_folders.py), one per layer; the set encodes and decodes exactly as interp's SAE loader
(SAELens's formulas: tests/saes/test_sae_saelens.py; SAELens itself:
experiments/transcoders_vs_saelens.py) reads each folder, a graph builds from them, and every
misfit is refused in one line naming the folder and the key."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from interp import attribution_graph, load_sae, load_transcoders
from interp.transcoders.loading import TranscoderLoadError
from tests.sae_folders import saelens_folder

ARCHS = ["transcoder", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder"]
TOKENS = torch.tensor([0, 5, 17, 33, 99, 12, 7, 5, 17])


def write_set(root, arch="transcoder", *, layers=(0, 1), d_sae=40, site="mlp.hook_in",
              out_site="hook_mlp_out", per_layer=None, **kwargs):  # fmt: skip
    """One SAELens folder per layer under ``root`` (``layer_{l}``); ``per_layer[l]`` overrides
    the writer's arguments for one layer."""
    for layer in layers:
        given = {"arch": arch, "d_sae": d_sae, "site": site, "out_site": out_site} | kwargs
        given |= (per_layer or {}).get(layer, {})
        metadata = {"hook_name_out": f"blocks.{layer}.{given.pop('out_site')}"}
        metadata |= given.pop("metadata", {})
        saelens_folder(root / f"layer_{layer}", given.pop("arch"),
                       hook=f"blocks.{layer}.{given.pop('site')}", metadata=metadata,
                       seed=layer, **given)  # fmt: skip
    return root


def _lower_thresholds(folder) -> None:
    """Half the thresholds below 0 (SAELens: ReLU first, so they act as 0)."""
    weights = load_file(folder / "sae_weights.safetensors")
    weights["threshold"][::2] -= 0.5
    save_file(weights, str(folder / "sae_weights.safetensors"))


@pytest.mark.parametrize("arch", ARCHS)
def test_the_set_computes_what_the_sae_loader_computes(arch, tmp_path):
    root = write_set(tmp_path / "set", arch)
    if "jumprelu" in arch:
        _lower_thresholds(root / "layer_1")
    tc = load_transcoders(root)
    assert (tc.n_layers, tc.d_tc, tc.d_model, tc.kind) == (2, 40, 64, "per-layer")
    assert tc.activation == ("jumprelu" if "jumprelu" in arch else "relu")
    assert tc.has_skip == ("skip" in arch)
    assert (tc.input_hook(1), tc.output_hook(1)) == (
        "blocks.1.mlp.hook_in",
        "blocks.1.hook_mlp_out",
    )
    x = torch.randn(50, 64, generator=torch.Generator().manual_seed(0)) * 2
    for layer in range(2):
        sae = load_sae(root / f"layer_{layer}")
        acts = tc.encode(x, layer)
        torch.testing.assert_close(acts, sae.encode(x), rtol=0, atol=1e-6)
        assert 0 < (acts > 0).float().mean() < 1
        out = tc.decode(acts, layer) + tc.skip(x, layer)
        torch.testing.assert_close(out, sae.forward(x), rtol=0, atol=1e-6)
    if "jumprelu" in arch:  # negative thresholds taken as 0: ReLU(h) * (h > t) = h * (h > 0)
        h = tc.pre_activations(x, 1)
        low = load_file(root / "layer_1" / "sae_weights.safetensors")["threshold"] < 0
        assert low.any() and ((h[:, low] < 0) & (h[:, low] > -0.5)).any()
        assert (tc.encode(x, 1)[:, low] >= 0).all()


def test_a_list_of_folders_in_any_order_is_the_same_set(tmp_path):
    root = write_set(tmp_path / "set", "skip_transcoder")
    a = load_transcoders(root)
    b = load_transcoders([root / "layer_1", str(root / "layer_0")])
    for layer in range(2):
        assert torch.equal(a.W_enc(layer), b.W_enc(layer))
        assert torch.equal(a.W_skip(layer), b.W_skip(layer))
    assert b.name == "saelens-transcoders" and a.name == "set"


def test_missing_keys_mean_what_saelens_defaults_them_to(tmp_path):
    root = write_set(tmp_path / "set", leave_out=("normalize_activations", "dtype"))
    assert load_transcoders(root).activation == "relu"  # "none", float32: SAELens's defaults
    write_set(tmp_path / "b", leave_out=("apply_b_dec_to_input",))  # SAELens: True
    with pytest.raises(TranscoderLoadError, match="apply_b_dec_to_input=True"):
        load_transcoders(tmp_path / "b")


@pytest.mark.slow
def test_a_graph_builds_from_saelens_transcoders(gpt2_model, tmp_path):
    tc = load_transcoders(write_set(tmp_path / "set", "jumprelu_skip_transcoder"))
    g = attribution_graph(gpt2_model, TOKENS, tc)
    assert (g.nodes.kind == "feature").sum() > 10
    again = attribution_graph(gpt2_model, TOKENS, load_transcoders(tc.save(tmp_path / "ct")))
    torch.testing.assert_close(g.adjacency, again.adjacency, rtol=0, atol=0)


REFUSED = [
    (dict(layers=(1, 2)), "no layer 0"),
    (dict(per_layer={1: {"site": "hook_resid_mid"}}), "hook_name's site is hook_resid_mid"),
    (dict(per_layer={1: {"d_sae": 48}}), "d_sae is 48"),
    (dict(per_layer={1: {"arch": "jumprelu_transcoder"}}), "activation is jumprelu"),
    (dict(per_layer={1: {"arch": "skip_transcoder"}}), "W_skip is present"),
    (dict(arch="standard"), "architecture='standard' is an SAE, not a transcoder"),
    (dict(flags={"normalize_activations": "layer_norm"}), "normalize_activations='layer_norm'"),
    (dict(metadata={"hook_head_index": 1}), "hook_head_index=1"),
    (dict(site="ln2.hook_scale"), "'blocks.0.ln2.hook_scale' is not one of interp's"),
    (dict(out_site="mlp.hook_post"), "hook_name_out='blocks.0.mlp.hook_post'"),
    (
        dict(
            per_layer={
                1: {
                    "out_site": "hook_mlp_out",
                    "metadata": {"hook_name_out": "blocks.0.hook_mlp_out"},
                }
            }
        ),
        "writes layer 0",
    ),  # fmt: skip
    (dict(d_out=32), "d_in=64 but d_out=32"),
    (dict(leave_out=("d_out",)), "d_out=768"),  # TranscoderConfig's default
]


@pytest.mark.parametrize(("given", "message"), REFUSED)
def test_misfits_are_refused_in_one_line_naming_the_folder(given, message, tmp_path):
    root = write_set(tmp_path / "set", **given)
    with pytest.raises(TranscoderLoadError) as info:
        load_transcoders(root)
    text = str(info.value)
    assert message in text and str(root) in text and "\n" not in text


def test_a_folder_with_neither_format_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(TranscoderLoadError, match="no config.yaml .* and no SAELens"):
        load_transcoders(tmp_path / "empty")
    with pytest.raises(TranscoderLoadError, match="is not a folder"):
        load_transcoders([tmp_path / "nowhere"])
