"""SAELens 6 folders: every architecture and flag against SAELens 6.54's formulas written out
here in float64 (from its saes/*.py: process_sae_in, encode, decode, the run-time
normalizations, TopK and BatchTopK, transcoders), for encode, decode, the reconstruction and
the spliced logits; missing keys read as SAELens's config dataclasses default them."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from interp import load_sae
from tests.sae_folders import check_splice, pre6_folder, saelens_folder

ATOL = 1e-5  # float32 dot products of width 64-128 with O(1) terms, against float64
RESID = "blocks.1.hook_resid_pre"
Z = "blocks.1.attn.hook_z"  # [batch pos head d_head], 4 heads of 16 in the bundled model


def saelens_reference(w: dict, x: torch.Tensor, cfg: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """SAELens 6's encode and decode of ``x`` [n d_in] in float64: ``(features, output)``."""
    w = {k: v.double() for k, v in w.items()}
    x, arch = x.double(), cfg["architecture"]
    if cfg.get("scale") is not None:  # fold_activation_norm_scaling_factor
        s = cfg["scale"]
        w["W_enc"], w["W_dec"], w["b_dec"] = w["W_enc"] * s, w["W_dec"] / s, w["b_dec"] / s
    norm = cfg.get("normalize", "none")
    if norm == "constant_norm_rescale":
        coeff = x.shape[-1] ** 0.5 / x.norm(dim=-1, keepdim=True)
        sae_in = x * coeff
    elif norm == "layer_norm":
        mu = x.mean(dim=-1, keepdim=True)
        std = (x - mu).std(dim=-1, keepdim=True)  # torch's unbiased std, as SAELens calls it
        sae_in = (x - mu) / (std + 1e-5)
    else:
        sae_in = x
    if cfg.get("apply_b_dec", True):
        sae_in = sae_in - w["b_dec"]
    norms = w["W_dec"].norm(dim=-1)
    if arch == "gated":
        gate = (sae_in @ w["W_enc"] + w["b_gate"] > 0).double()
        f = gate * torch.relu(sae_in @ (w["W_enc"] * w["r_mag"].exp()) + w["b_mag"])
    else:
        h = sae_in @ w["W_enc"] + w["b_enc"]
        if arch in ("standard", "transcoder", "skip_transcoder"):
            f = torch.relu(h)
        elif "jumprelu" in arch:
            f = torch.where(h > w["threshold"], torch.relu(h), torch.zeros_like(h))
        else:
            h = h * norms if cfg.get("rescale") else h
            f = torch.zeros_like(h)
            if arch == "topk":  # per row: the k largest, through ReLU
                for n in range(h.shape[0]):
                    top = h[n].argsort(descending=True)[: cfg["k"]]
                    f[n, top] = torch.relu(h[n, top])
            else:  # batchtopk: int(k * rows) largest of ReLU(h) over every row at once
                a = torch.relu(h).flatten()
                top = a.argsort(descending=True)[: int(cfg["k"] * h.shape[0])]
                f.view(-1)[top] = a[top]
    out = (f / norms if cfg.get("rescale") else f) @ w["W_dec"] + w["b_dec"]
    if "transcoder" not in arch and norm == "constant_norm_rescale":
        out = out / coeff
    elif "transcoder" not in arch and norm == "layer_norm":
        out = out * std + mu
    if "skip" in arch:
        out = out + x @ w["W_skip"].T
    return f, out


CASES = {  # name: (architecture, config keys set, config keys left out, reference settings)
    "standard, apply_b_dec_to_input missing": ("standard", {}, ("apply_b_dec_to_input",), {}),
    "standard, no b_dec on input": ("standard", {"apply_b_dec_to_input": False}, (),
                                    {"apply_b_dec": False}),
    "gated": ("gated", {}, (), {}),
    "jumprelu": ("jumprelu", {}, (), {}),
    "topk": ("topk", {}, (), {"k": 8}),
    "topk, k and flags missing": ("topk", {}, ("k", "rescale_acts_by_decoder_norm",
                                  "normalize_activations", "reshape_activations"), {"k": 100}),
    "topk, rescale_acts_by_decoder_norm": ("topk", {"rescale_acts_by_decoder_norm": True}, (),
                                           {"k": 8, "rescale": True}),
    "batchtopk": ("batchtopk", {"k": 6.5}, (), {"k": 6.5}),
    "batchtopk, rescaled": ("batchtopk", {"rescale_acts_by_decoder_norm": True}, (),
                            {"k": 8, "rescale": True}),
    "constant_norm_rescale": ("standard", {"normalize_activations": "constant_norm_rescale"}, (),
                              {"normalize": "constant_norm_rescale"}),
    "layer_norm": ("jumprelu", {"normalize_activations": "layer_norm"}, (),
                   {"normalize": "layer_norm"}),
    "layer_norm, topk": ("topk", {"normalize_activations": "layer_norm"}, (),
                         {"normalize": "layer_norm", "k": 8}),
    "expected_average_only_in": ("standard", {"normalize_activations":
                                 "expected_average_only_in"}, (), {"scale": 0.37}),
}  # fmt: skip


def _x(n: int = 12, d: int = 64, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed)) * 1.5 + 0.4


@pytest.mark.parametrize("case", list(CASES))
def test_every_architecture_and_flag_is_saelens(tmp_path, bundled_model, case):
    arch, flags, leave_out, ref = CASES[case]
    d_sae = 128 if ref.get("k") == 100 else 96
    w = saelens_folder(tmp_path / "s", arch, d_sae=d_sae, flags=flags, leave_out=leave_out,
                       scaling_factor=ref.get("scale"))  # fmt: skip
    sae = load_sae(tmp_path / "s")
    x = _x()
    f_ref, out_ref = saelens_reference(w, x, {"architecture": arch, **ref})
    f = sae.encode(x)
    assert torch.allclose(f.double(), f_ref, atol=ATOL), case
    assert (f_ref > 0).any() and (f_ref == 0).any(), "a trivial case"
    assert torch.allclose(sae.decode(f, x).double(), out_ref, atol=ATOL), case
    assert torch.allclose(sae(x).double(), out_ref, atol=ATOL), case
    if arch != "batchtopk":  # features of a batch top-k depend on the whole batch
        check_splice(
            bundled_model,
            sae,
            lambda x: saelens_reference(w, x, {"architecture": arch, **ref})[1],
            RESID,
        )


def test_hook_z_sae_flattens_the_heads(tmp_path, bundled_model):
    w = saelens_folder(tmp_path / "z", "standard", hook=Z, flags={"reshape_activations": "hook_z"})
    sae = load_sae(tmp_path / "z")
    z = _x(6, 64).reshape(6, 4, 16)
    f_ref, out_ref = saelens_reference(w, z.flatten(-2), {"architecture": "standard"})
    assert torch.allclose(sae.encode(z).double(), f_ref, atol=ATOL)
    assert sae(z).shape == (6, 4, 16)
    assert torch.allclose(sae(z).double(), out_ref.reshape(6, 4, 16), atol=ATOL)
    check_splice(
        bundled_model, sae, lambda x: saelens_reference(w, x, {"architecture": "standard"})[1], Z
    )


def test_hook_head_index_reads_and_writes_one_head(tmp_path, bundled_model):
    w = saelens_folder(tmp_path / "h", "jumprelu", d_in=16, hook=Z,
                       metadata={"hook_head_index": 2})  # fmt: skip
    sae = load_sae(tmp_path / "h")
    assert sae.hook_head_index == 2
    check_splice(
        bundled_model,
        sae,
        lambda x: saelens_reference(w, x, {"architecture": "jumprelu"})[1],
        Z,
        head=2,
    )


@pytest.mark.parametrize(
    "arch", ["transcoder", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder"]
)
def test_transcoders_load_with_their_output_hook(tmp_path, arch):
    w = saelens_folder(tmp_path / "t", arch, d_out=48, hook="blocks.1.ln2.hook_normalized")
    sae = load_sae(tmp_path / "t")
    assert (sae.hook_name, sae.output_hook_name, sae.d_out) == (
        "blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out", 48,
    )  # fmt: skip
    x = _x()
    f_ref, out_ref = saelens_reference(w, x, {"architecture": arch, "apply_b_dec": False})
    assert torch.allclose(sae.encode(x).double(), f_ref, atol=ATOL)
    assert torch.allclose(sae(x).double(), out_ref, atol=ATOL)
    with pytest.raises(ValueError, match="transcoder reads .* writes"):
        sae.splice(x)


def test_saelens5_configs_convert_as_saelens_does(tmp_path):
    cfg = {"hook_point": RESID, "activation_fn_str": "topk",
           "activation_fn_kwargs": {"k": 5}, "normalize_activations": False}  # fmt: skip
    w = pre6_folder(tmp_path / "old", cfg)
    sae = load_sae(tmp_path / "old")
    assert (sae.architecture, sae.k, sae.hook_name, sae.apply_b_dec_to_input) == (
        "topk", 5, RESID, True,
    )  # fmt: skip
    x = _x()
    f_ref, _ = saelens_reference(w, x, {"architecture": "topk", "k": 5})
    assert torch.allclose(sae.encode(x).double(), f_ref, atol=ATOL)


def test_weights_are_cast_to_the_configs_dtype(tmp_path):
    saelens_folder(tmp_path / "b", "standard", dtype=torch.bfloat16, flags={"dtype": "float32"})
    assert load_sae(tmp_path / "b").W_enc.dtype == torch.float32


def test_topk_ties_keep_exactly_k_of_the_largest():
    from interp.saes.sae import SAE

    d, n = 8, 12
    W_enc = torch.zeros(d, n)
    W_enc[0] = torch.tensor([3.0, 2.0, 2.0, 2.0, 2.0, 1.0, 0.5, -1, 0, 0, 0, 0])
    sae = SAE(W_enc, torch.zeros(n), torch.eye(n, d), torch.zeros(d), architecture="topk", k=3,
              hook_name=RESID)  # fmt: skip
    f = sae.encode(torch.eye(d)[:1])[0]
    assert int((f > 0).sum()) == 3 and f[0] == 3.0
    assert set(f[f > 0].tolist()) == {3.0, 2.0} and ((f == 2.0).sum() == 2)
    values, indices = torch.topk(W_enc[0], 3, sorted=False)  # SAELens's own call
    assert torch.equal(f, torch.zeros(n).scatter(0, indices, values.relu()))


def test_save_writes_the_weights_and_every_flag_and_interp_reads_back_the_same(tmp_path):
    """What ``SAE.save`` writes, and interp's reading of it. SAELens's own reading of saved
    folders (``load_from_disk``, every architecture and flag) is checked where SAELens runs,
    in its environment: experiments/parity.py (docs/testing.md)."""
    w = saelens_folder(tmp_path / "a", "topk", flags={"rescale_acts_by_decoder_norm": True},
                       leave_out=("apply_b_dec_to_input",))  # fmt: skip
    sae = load_sae(tmp_path / "a")
    sae.save(tmp_path / "b")
    cfg = json.loads((tmp_path / "b" / "cfg.json").read_text())
    written = {k: cfg.get(k) for k in ("architecture", "d_in", "d_sae", "k",
                                       "apply_b_dec_to_input", "rescale_acts_by_decoder_norm",
                                       "normalize_activations", "reshape_activations")}  # fmt: skip
    assert written == {"architecture": "topk", "d_in": 64, "d_sae": 96, "k": 8,
                       "apply_b_dec_to_input": True, "rescale_acts_by_decoder_norm": True,
                       "normalize_activations": "none", "reshape_activations": "none"}  # fmt: skip
    assert cfg["metadata"]["hook_name"] == RESID
    saved = load_file(str(tmp_path / "b" / "sae_weights.safetensors"))
    assert sorted(saved) == sorted(w) and all(torch.equal(saved[k], w[k]) for k in w)
    back = load_sae(tmp_path / "b")
    x = _x()
    assert torch.equal(back.encode(x), sae.encode(x))
    assert (back.apply_b_dec_to_input, back.rescale_acts_by_decoder_norm) == (True, True)


def test_a_scaling_factor_not_saved_can_be_given(tmp_path):
    flags = {"normalize_activations": "expected_average_only_in"}
    w = saelens_folder(tmp_path / "s", "standard", flags=flags)
    sae = load_sae(tmp_path / "s", norm_scaling_factor=0.37)
    f_ref, out_ref = saelens_reference(w, _x(), {"architecture": "standard", "scale": 0.37})
    assert torch.allclose(sae.encode(_x()).double(), f_ref, atol=ATOL)
    assert torch.allclose(sae(_x()).double(), out_ref, atol=ATOL)


def test_a_batchtopk_checkpoint_saves_its_topk_threshold_and_one_without_is_refused(tmp_path):
    """SAELens's ``BatchTopKTrainingSAE`` refuses a folder without ``topk_threshold`` (found by
    experiments/parity.py): ``save`` writes the one read, in its dtype, folded as SAELens
    folds it with a scaling factor; a batchtopk SAE without one is refused before writing."""
    from interp.saes.sae import SAE

    saelens_folder(tmp_path / "a", "batchtopk", flags={"k": 6.5})
    load_sae(tmp_path / "a").save(tmp_path / "b")
    saved = load_file(str(tmp_path / "b" / "sae_weights.safetensors"))
    assert saved["topk_threshold"].dtype == torch.float64 and saved["topk_threshold"] == 0.1
    flags = {"k": 6.5, "normalize_activations": "expected_average_only_in"}
    saelens_folder(tmp_path / "s", "batchtopk", flags=flags, scaling_factor=0.5)
    assert load_sae(tmp_path / "s").topk_threshold == 0.1 / 0.5  # fold_activation_norm_...
    bare = SAE(torch.eye(4, 8), torch.zeros(8), torch.eye(8, 4), torch.zeros(4),
               architecture="batchtopk", k=2.0, hook_name=RESID)  # fmt: skip
    with pytest.raises(ValueError, match="cannot load without its topk_threshold"):
        bare.save(tmp_path / "never")
    assert not (tmp_path / "never").exists()
