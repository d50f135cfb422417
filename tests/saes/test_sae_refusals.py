"""Every value interp does not compute is refused in one line naming the key, in each format;
folders of no format name the files each needs; hub names try each format's files in turn."""

from __future__ import annotations

import json

import pytest
import torch

from interp import load_sae
from interp.saes.interventions import ablate_feature
from interp.saes.loading import SAELoadError
from tests.sae_folders import (
    dictionary_learning_folder,
    gemmascope_folder,
    pre6_folder,
    saelens_folder,
    sparsify_folder,
)


def _refused(path, match: str, **kwargs) -> None:
    with pytest.raises(SAELoadError, match=match) as info:
        load_sae(path, **kwargs)
    assert "\n" not in str(info.value)


SAELENS = {  # name: (architecture, config keys, metadata keys, the message)
    "abstopk": ("standard", {"architecture": "abstopk"}, {}, "architecture='abstopk'"),
    "temporal": ("standard", {"architecture": "temporal"}, {}, "architecture='temporal'"),
    "matryoshka": ("standard", {"architecture": "matryoshka_batchtopk"}, {},
                   "architecture='matryoshka_batchtopk'"),
    "whitening": ("standard", {"normalize_activations": "covariance_whitening"}, {},
                  "normalize_activations='covariance_whitening' is not one interp computes"),
    "no scaling factor": ("standard", {"normalize_activations": "expected_average_only_in"}, {},
                          "normalize_activations='expected_average_only_in': its scaling "
                          "factor is not saved"),
    "rescale on standard": ("standard", {"rescale_acts_by_decoder_norm": True}, {},
                            "rescale_acts_by_decoder_norm=True"),
    "reshape": ("standard", {"reshape_activations": "per_head"}, {},
                "reshape_activations='per_head'"),
    "dtype": ("standard", {"dtype": "int8"}, {}, "dtype='int8'"),
    "k None": ("topk", {"k": None}, {}, "k=None"),
    "k too big": ("topk", {"k": 500}, {}, "k between 1 and d_sae=96"),
    "head and hook_z": ("standard", {"reshape_activations": "hook_z"}, {"hook_head_index": 1},
                        "hook_head_index=1"),
    "no hook": ("standard", {}, {"hook_name": None}, "names no hook_name"),
    "d_sae": ("standard", {"d_sae": 95}, {}, "d_sae=95 but the weights are 64x96x64"),
    "transcoder b_dec": ("transcoder", {"apply_b_dec_to_input": True}, {},
                         "apply_b_dec_to_input=True: SAELens refuses it for transcoders"),
    "transcoder b_dec missing": ("transcoder", {}, {}, "apply_b_dec_to_input=True"),
    "transcoder reshape": ("transcoder", {"reshape_activations": "hook_z"}, {},
                           "reshape_activations='hook_z': SAELens's transcoders never reshape"),
    "transcoder out head": ("transcoder", {}, {"hook_head_index_out": 0},
                            "hook_head_index_out=0"),
    "transcoder d_out missing": ("transcoder", {}, {}, "d_out=768"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(SAELENS))
def test_saelens_values_interp_does_not_compute(tmp_path, case):
    arch, flags, meta, match = SAELENS[case]
    leave_out = ()
    if case == "transcoder b_dec missing":
        leave_out = ("apply_b_dec_to_input",)
    elif case == "transcoder d_out missing":
        leave_out = ("d_out",)
    elif arch == "transcoder":
        flags = {"apply_b_dec_to_input": False, **flags}
    saelens_folder(tmp_path / "s", arch, flags=flags, metadata=meta, leave_out=leave_out)
    _refused(tmp_path / "s", match)


def test_saelens_tensors_that_do_not_belong_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    saelens_folder(tmp_path / "s", "jumprelu")
    path = tmp_path / "s" / "sae_weights.safetensors"
    tensors = load_file(str(path))
    save_file({**tensors, "scaling_factor": torch.full((96,), 2.0)}, str(path))
    _refused(tmp_path / "s", "finetuning_scaling_factor")
    save_file({**tensors, "W_extra": torch.zeros(3)}, str(path))
    _refused(tmp_path / "s", "has W_extra, which a SAELens jumprelu SAE does not have")
    del tensors["threshold"]
    save_file(tensors, str(path))
    _refused(tmp_path / "s", "lacks threshold")


def test_saelens5_activation_functions_other_than_relu_and_topk(tmp_path):
    pre6_folder(tmp_path / "s", {"hook_point": "blocks.0.hook_resid_pre",
                                 "activation_fn_str": "tanh-relu"})  # fmt: skip
    _refused(tmp_path / "s", "activation_fn='tanh-relu'")


@pytest.mark.parametrize(
    ("changes", "match"),
    [({"activation": "groupmax"}, "activation='groupmax'"), ({"signed": True}, "signed=True"),
     ({"bogus": 1}, "cfg.json has bogus"), ({"num_latents": 50}, "50 latents")],
)  # fmt: skip
def test_sparsify_values_interp_does_not_compute(tmp_path, changes, match):
    sparsify_folder(tmp_path, "layers.1", changes=changes)
    _refused(tmp_path / "layers.1", match)


def test_sparsify_hookpoints_interp_does_not_map(tmp_path):
    sparsify_folder(tmp_path, "encoder.blocks.3")
    _refused(tmp_path / "encoder.blocks.3", "hookpoint 'encoder.blocks.3'")
    assert load_sae(tmp_path / "encoder.blocks.3", hook_name="blocks.1.hook_resid_post").k == 8


def test_dictionary_learning_values_interp_does_not_compute(tmp_path):
    dictionary_learning_folder(tmp_path / "a", "AutoEncoder", trainer={"dict_class": "Crosscoder"})
    _refused(tmp_path / "a", "trainer.dict_class='Crosscoder'")
    dictionary_learning_folder(tmp_path / "b", "AutoEncoderTopK", trainer={"k": 9})
    _refused(tmp_path / "b", "config.json says k=9 but ae.pt holds k=8")
    sd = dictionary_learning_folder(tmp_path / "c", "AutoEncoder")
    torch.save({**sd, "extra": torch.zeros(2)}, tmp_path / "c" / "ae.pt")
    _refused(tmp_path / "c", "does not hold a AutoEncoder: has extra")


def test_gemmascope_embedding_and_unknown_arrays(tmp_path):
    import numpy as np

    folder, params = gemmascope_folder(tmp_path, "res")
    np.savez(folder / "params.npz", **params, scaling_factor=np.ones(96, np.float32))
    _refused(folder, "params.npz has scaling_factor")
    embedding = tmp_path / "gemma-scope-2b-pt-res" / "embedding" / "width_4k"
    embedding.mkdir(parents=True)
    np.savez(embedding / "params.npz", **params)
    _refused(embedding, "embedding SAE")


def test_a_folder_of_no_format_names_each_formats_files(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "cfg.json").write_text("{}")
    _refused(tmp_path / "x", "none of cfg.json . sae_weights.safetensors .saelens.; cfg.json . "
             "sae.safetensors .sparsify.; ae.pt . config.json")  # fmt: skip


def test_hub_names_try_each_formats_files(tmp_path, monkeypatch):
    import huggingface_hub

    folder, _ = gemmascope_folder(tmp_path, "res")
    calls = []

    class EntryNotFoundError(Exception):
        pass

    def fake(repo, filename):
        calls.append(filename)
        if not filename.endswith("params.npz"):
            raise EntryNotFoundError(filename)
        return str(folder / "params.npz")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake)
    sae = load_sae("google/gemma-scope-2b-pt-res/layer_1/width_16k/average_l0_71")
    assert sae.hook_name == "blocks.1.hook_resid_post" and sae.source == "gemmascope"
    assert [c.split("/")[-1] for c in calls] == ["cfg.json", "cfg.json", "ae.pt", "params.npz"]


def test_feature_edits_refuse_saes_that_do_not_write_f_w_dec(tmp_path):
    saelens_folder(tmp_path / "s", "standard", flags={"normalize_activations": "layer_norm"})
    with pytest.raises(ValueError, match="normalize_activations='layer_norm'"):
        ablate_feature(load_sae(tmp_path / "s"), 3)


def test_splicing_a_transcoder_is_refused(tmp_path, bundled_model):
    from interp import run_cached

    saelens_folder(tmp_path / "t", "transcoder", flags={"apply_b_dec_to_input": False})
    with pytest.raises(ValueError, match="a transcoder reads blocks.1.hook_resid_pre and writes"):
        run_cached(bundled_model, "x = 1", saes=[load_sae(tmp_path / "t")])
    assert json.loads((tmp_path / "t" / "cfg.json").read_text())["architecture"] == "transcoder"


def test_analyses_splitting_the_stream_into_features_refuse_nonlinear_decoders(
    tmp_path, bundled_model
):
    from interp import feature_attribution
    from interp.discovery.features import sae_layer

    flags = {"k": 8, "rescale_acts_by_decoder_norm": True}
    saelens_folder(tmp_path / "s", "topk", flags=flags)
    sae = load_sae(tmp_path / "s")
    with pytest.raises(ValueError, match="rescale_acts_by_decoder_norm=True"):
        feature_attribution(bundled_model, "x = 1", sae, "1")
    with pytest.raises(ValueError, match="rescale_acts_by_decoder_norm=True"):
        sae_layer(bundled_model, sae)


def test_decoding_a_normalizing_sae_needs_the_input(tmp_path):
    saelens_folder(tmp_path / "s", "standard", flags={"normalize_activations": "layer_norm"})
    sae = load_sae(tmp_path / "s")
    x = torch.randn(3, 64)
    with pytest.raises(ValueError, match=r"normalizes its input \(layer_norm\); pass decode"):
        sae.decode(sae.encode(x))
    assert torch.equal(sae.decode(sae.encode(x), x), sae(x))
