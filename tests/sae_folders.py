"""SAE folders written the way each library writes them, for the tests of interp.saes.

Each writer saves random weights under the library's own names, shapes and dtypes, with the
config keys the library writes (``leave_out`` drops keys, as older versions or hand-written
configs leave them out), and returns the tensors it saved under those names, so a test can
compute the library's formula from exactly what is on disk:

- :func:`saelens_folder`: ``SAE.save_model`` / ``save_inference_model`` of SAELens 6
  (``cfg.json``: the config dataclass's fields, ``metadata``, ``architecture``);
- :func:`pre6_folder`: a SAELens 5 ``cfg.json`` (``hook_point``, ``activation_fn_str``, ...);
- :func:`sparsify_folder`: ``SparseCoder.save_to_disk`` (``cfg.json`` = ``SparseCoderConfig``
  + ``d_in``, ``sae.safetensors`` = its state dict), in a per-hookpoint subfolder;
- :func:`dictionary_learning_folder`: ``trainSAE``'s ``config.json`` and ``ae.pt`` (a
  ``torch.save`` of the dictionary's state dict);
- :func:`gemmascope_folder`: ``params.npz`` (float32 numpy arrays) under the published
  repositories' path ``gemma-scope-2b-pt-{res|mlp|att}/layer_L/width_16k/average_l0_N``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

SAELENS_VERSION = "6.54.12"
ATOL_LOGITS = 1e-4  # float32 reconstructions (to ~1e-5) through the bundled model's last layers
PROMPT = "def f(x):\n    return x + x"


def check_splice(model, sae, reference, hook: str, head: int | None = None) -> None:
    """Spliced logits: the model's own with the error term; without it, those of a plain
    TransformerLens hook writing ``reference(x)`` (the library's reconstruction of the rows
    ``x [n d_in]``, computed by the test) in place of the activation (of one head's slice when
    ``head`` is set; the heads flattened when the SAE reads ``hook_z`` whole)."""
    from interp import run_cached

    plain = run_cached(model, PROMPT)
    spliced = run_cached(model, PROMPT, saes=[sae])
    assert torch.allclose(spliced.logits, plain.logits, atol=1e-5)

    def replace(x, hook):
        part = x[..., head, :] if head is not None else x
        out = reference(part.reshape(-1, sae.d_in)).to(x.dtype).reshape(part.shape)
        if head is None:
            return out
        x = x.clone()
        x[..., head, :] = out
        return x

    with torch.no_grad():
        expected = model.run_with_hooks(plain.tokens, fwd_hooks=[(hook, replace)])
    alone = run_cached(model, PROMPT, saes=[sae], use_error_term=False)
    assert torch.allclose(alone.logits, expected, atol=ATOL_LOGITS)
    assert (alone.logits - plain.logits).abs().max() > 1e-3, "the splice changed nothing"


def randn(g: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * scale


def _saelens_tensors(arch: str, d_in: int, d_sae: int, d_out: int, g) -> dict:
    w = {"W_enc": randn(g, d_in, d_sae, scale=d_in**-0.5),
         "W_dec": randn(g, d_sae, d_out, scale=d_sae**-0.5),
         "b_dec": randn(g, d_out, scale=0.3)}  # fmt: skip
    if arch == "gated":
        w |= {"b_gate": randn(g, d_sae, scale=0.3), "r_mag": randn(g, d_sae, scale=0.2),
              "b_mag": randn(g, d_sae, scale=0.3)}  # fmt: skip
    else:
        w["b_enc"] = randn(g, d_sae, scale=0.3)
    if "jumprelu" in arch:
        w["threshold"] = torch.rand(d_sae, generator=g) * 0.3
    if "skip" in arch:
        w["W_skip"] = randn(g, d_out, d_in, scale=d_in**-0.5)
    if arch == "batchtopk":
        w["topk_threshold"] = torch.tensor(0.1, dtype=torch.float64)
    return w


def saelens_folder(
    path: Path,
    arch: str = "standard",
    *,
    d_in: int = 64,
    d_sae: int = 96,
    d_out: int | None = None,
    hook: str = "blocks.1.hook_resid_pre",
    flags: dict | None = None,
    metadata: dict | None = None,
    leave_out: tuple[str, ...] = (),
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    scaling_factor: float | None = None,
) -> dict[str, torch.Tensor]:
    """A SAELens 6 folder; ``flags`` set config keys (``k``, ``normalize_activations``, ...)."""
    path.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    transcoder = "transcoder" in arch
    d_out = d_out or d_in
    tensors = _saelens_tensors(arch, d_in, d_sae, d_out, g)
    save_file({k: v.to(dtype) if v.ndim else v for k, v in tensors.items()},
              str(path / "sae_weights.safetensors"))  # fmt: skip
    meta = {"sae_lens_version": SAELENS_VERSION, "sae_lens_training_version": SAELENS_VERSION,
            "hook_name": hook, "model_name": "tiny-induction"} | (metadata or {})  # fmt: skip
    cfg = {"d_in": d_in, "d_sae": d_sae, "dtype": str(dtype).removeprefix("torch."),
           "device": "cpu", "apply_b_dec_to_input": not transcoder,
           "normalize_activations": "none", "reshape_activations": "none",
           "metadata": meta, "architecture": arch}  # fmt: skip
    if arch in ("topk", "batchtopk"):
        cfg |= {"k": 8, "rescale_acts_by_decoder_norm": False}
    if transcoder:
        cfg["d_out"] = d_out
        meta.setdefault("hook_name_out", "blocks.1.hook_mlp_out")
    cfg |= flags or {}
    for key in leave_out:
        cfg.pop(key, None)
    (path / "cfg.json").write_text(json.dumps(cfg))
    if scaling_factor is not None:  # the trainer's checkpoint: activation_scaler.json beside
        (path / "activation_scaler.json").write_text(json.dumps({"scaling_factor": scaling_factor}))
    return {k: v.to(dtype) for k, v in tensors.items() if k != "topk_threshold"}


def pre6_folder(path: Path, cfg: dict, *, d_in: int = 64, d_sae: int = 96, seed: int = 0):
    """A SAELens 5 folder: no ``sae_lens_version``, the old key names in ``cfg``."""
    path.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    tensors = _saelens_tensors("standard", d_in, d_sae, d_in, g)
    save_file(tensors, str(path / "sae_weights.safetensors"))
    (path / "cfg.json").write_text(json.dumps({"d_in": d_in, "d_sae": d_sae, **cfg}))
    return tensors


def sparsify_folder(
    root: Path,
    hookpoint: str = "layers.1",
    *,
    d_in: int = 64,
    num_latents: int = 96,
    k: int = 8,
    transcode: bool = False,
    skip: bool = False,
    dtype=torch.float32,
    changes: dict | None = None,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """``SparseCoder.save_to_disk(root / hookpoint)``, as sparsify's trainer saves each one."""
    path = root / hookpoint
    path.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {"encoder.weight": randn(g, num_latents, d_in, scale=d_in**-0.5),
               "encoder.bias": randn(g, num_latents, scale=0.3),
               "W_dec": randn(g, num_latents, d_in, scale=num_latents**-0.5),
               "b_dec": randn(g, d_in, scale=0.3)}  # fmt: skip
    if skip:
        tensors["W_skip"] = randn(g, d_in, d_in, scale=d_in**-0.5)
    tensors = {n: t.to(dtype) for n, t in tensors.items()}
    save_file(tensors, str(path / "sae.safetensors"))
    cfg = {"activation": "topk", "expansion_factor": 32, "normalize_decoder": True,
           "num_latents": num_latents, "k": k, "multi_topk": False, "skip_connection": skip,
           "transcode": transcode, "d_in": d_in} | (changes or {})  # fmt: skip
    (path / "cfg.json").write_text(json.dumps(cfg))
    return tensors


DICT_KEYS = {  # dict_class -> {state dict name: shape, from (d_in, d_sae)}
    "AutoEncoder": {"bias": "i", "encoder.weight": "si", "encoder.bias": "s",
                    "decoder.weight": "is"},
    "AutoEncoderNew": {"encoder.weight": "si", "encoder.bias": "s", "decoder.weight": "is",
                       "decoder.bias": "i"},
    "GatedAutoEncoder": {"decoder_bias": "i", "encoder.weight": "si", "r_mag": "s",
                         "gate_bias": "s", "mag_bias": "s", "decoder.weight": "is"},
    "JumpReluAutoEncoder": {"W_enc": "is", "b_enc": "s", "W_dec": "si", "b_dec": "i",
                            "threshold": "s"},
    "AutoEncoderTopK": {"decoder.weight": "is", "encoder.weight": "si", "encoder.bias": "s",
                        "b_dec": "i"},
    "BatchTopKSAE": {"decoder.weight": "is", "encoder.weight": "si", "encoder.bias": "s",
                     "b_dec": "i"},
    "MatryoshkaBatchTopKSAE": {"W_enc": "is", "b_enc": "s", "W_dec": "si", "b_dec": "i"},
}  # fmt: skip


def dictionary_learning_folder(
    path: Path,
    dict_class: str,
    *,
    d_in: int = 64,
    d_sae: int = 96,
    k: int = 8,
    threshold: float = 0.05,
    trainer: dict | None = None,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """``trainSAE``'s output folder: ``config.json`` (``{"trainer": ..., "buffer": ...}``)
    and ``ae.pt`` (``torch.save`` of the state dict, tensors on the CPU)."""
    path.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    dims = {"i": d_in, "s": d_sae}
    sd = {n: randn(g, *(dims[c] for c in shape), scale=0.3 if len(shape) == 1 else 0.15)
          for n, shape in DICT_KEYS[dict_class].items()}  # fmt: skip
    if "threshold" in sd:
        sd["threshold"] = sd["threshold"].abs()
    if dict_class in ("AutoEncoderTopK", "BatchTopKSAE", "MatryoshkaBatchTopKSAE"):
        sd["k"] = torch.tensor(k, dtype=torch.int)  # register_buffer("k", ...) as saved
        sd["threshold"] = torch.tensor(threshold, dtype=torch.float32)
    if dict_class == "MatryoshkaBatchTopKSAE":
        sd["group_sizes"] = torch.tensor([d_sae // 3, d_sae - d_sae // 3])
    torch.save(sd, path / "ae.pt")
    config = {"trainer": {"trainer_class": "Trainer", "dict_class": dict_class,
                          "activation_dim": d_in, "dict_size": d_sae, "layer": 1,
                          "lm_name": "tiny-induction", "submodule_name": "resid_pre_layer_1",
                          "device": "cpu", "seed": seed, "lr": 1e-4},
              "buffer": {"d_submodule": d_in, "io": "out", "n_ctxs": 8, "ctx_len": 16}}  # fmt: skip
    if "k" in sd:
        config["trainer"]["k"] = k
    config["trainer"] |= trainer or {}
    (path / "config.json").write_text(json.dumps(config, indent=4))
    return sd


def gemmascope_folder(
    root: Path,
    site: str = "res",
    layer: int = 1,
    *,
    d_in: int = 64,
    d_sae: int = 96,
    seed: int = 0,
) -> tuple[Path, dict[str, np.ndarray]]:
    """``params.npz`` where the published repositories keep it; returns its folder."""
    path = root / f"gemma-scope-2b-pt-{site}" / f"layer_{layer}" / "width_16k" / "average_l0_71"
    path.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    params = {"W_enc": rng.standard_normal((d_in, d_sae)) * d_in**-0.5,
              "W_dec": rng.standard_normal((d_sae, d_in)) * d_sae**-0.5,
              "b_enc": rng.standard_normal(d_sae) * 0.3,
              "b_dec": rng.standard_normal(d_in) * 0.3,
              "threshold": rng.random(d_sae) * 0.3}  # fmt: skip
    params = {k: v.astype(np.float32) for k, v in params.items()}
    np.savez(path / "params.npz", **params)
    return path, params
