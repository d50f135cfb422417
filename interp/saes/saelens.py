"""SAELens 6 folders (``cfg.json`` + ``sae_weights.safetensors``), read as SAELens 6.54 reads them.

A config without ``sae_lens_version`` (top level or under ``metadata``), or older than 6.0,
goes through SAELens's pre-6 conversion first (``hook_point`` -> ``hook_name``,
``activation_fn: topk`` -> the ``topk`` architecture, a boolean ``normalize_activations``).
Every key missing then means what SAELens's config dataclasses default it to:
``apply_b_dec_to_input`` True, ``normalize_activations`` and ``reshape_activations``
``"none"``, ``dtype`` float32, TopK's ``k`` 100 and ``rescale_acts_by_decoder_norm`` False,
a transcoder's ``d_out`` 768. Weights are cast to ``dtype`` as SAELens casts them.
``expected_average_only_in`` folds the scaling factor saved beside the weights
(``activation_scaler.json``) into them, as SAELens's ``fold_activation_norm_scaling_factor``
does. Whatever interp does not compute is refused in one line naming the key.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from interp.dictionaries.files import check_names
from interp.saes.sae import SAE
from interp.saes.saelens_config import SAELENS_ARCHITECTURES

__all__ = ["SAELensConfigError", "read_saelens"]

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16}  # fmt: skip
PRE6_RENAMES = {"hook_point": "hook_name", "hook_point_head_index": "hook_head_index",
                "activation_fn_str": "activation_fn"}  # fmt: skip
METADATA_KEYS = ("hook_name", "hook_head_index", "hook_name_out", "hook_head_index_out",
                 "model_name", "sae_lens_version")  # fmt: skip
SCALER_FILE = "activation_scaler.json"  # where SAELens's trainer saves the scaling factor


class SAELensConfigError(ValueError):
    """A saved SAELens config that interp refuses, in one line naming the key."""


def _version(cfg: dict) -> tuple[int, ...] | None:
    text = cfg.get("sae_lens_version") or (cfg.get("metadata") or {}).get("sae_lens_version")
    if not text:
        return None
    digits = [int("".join(c for c in part if c.isdigit()) or 0) for part in str(text).split(".")]
    return tuple(digits[:3])


def _pre6(cfg: dict) -> dict:
    """SAELens's ``handle_pre_6_0_config``: old keys renamed, old defaults, hooks as metadata."""
    new = {PRE6_RENAMES.get(k, k): v for k, v in cfg.items()}
    new.setdefault("apply_b_dec_to_input", True)
    new.setdefault("architecture", "standard")
    z = "hook_z" in (new.get("hook_name") or "")
    new.setdefault("reshape_activations", "hook_z" if z else "none")
    fn, kwargs = new.get("activation_fn", "relu"), new.get("activation_fn_kwargs") or {}
    if fn == "topk" and kwargs.get("k") is not None:
        new["architecture"], new["k"] = "topk", kwargs["k"]
    elif new["architecture"] == "topk" and "activation_fn_kwargs" in new:
        new["k"] = kwargs.get("k")
    elif fn not in ("relu", "topk", None):
        raise SAELensConfigError(
            f"activation_fn={fn!r}: SAELens 6 runs ReLU in its place and interp refuses to; "
            "only relu and topk are computed"
        )
    if isinstance(new.get("normalize_activations"), bool):
        new["normalize_activations"] = (
            "expected_average_only_in" if new["normalize_activations"] else "none"
        )
    if new.get("normalize_activations") is None:
        new["normalize_activations"] = "none"
    kept = new.get("metadata") or {}  # SAELens drops it; interp keeps only its hook names
    new["metadata"] = {k: kept[k] for k in METADATA_KEYS if k in kept}
    new["metadata"] |= {k: new[k] for k in METADATA_KEYS if k in new}
    return new


def _refuse(key: str, value, why: str):
    raise SAELensConfigError(f"{key}={value!r}: {why}")


def read_saelens(
    folder: Path,
    cfg: dict,
    tensors: dict[str, torch.Tensor],
    *,
    norm_scaling_factor: float | None = None,
) -> SAE:
    """An :class:`SAE` from a SAELens folder's config and tensors (the module docstring)."""
    version = _version(cfg)
    cfg6 = _pre6(cfg) if version is None or version < (6, 0, 0) else dict(cfg)
    meta = cfg6.get("metadata") or {}
    arch = cfg6.get("architecture", "standard")
    if arch not in SAELENS_ARCHITECTURES:
        _refuse("architecture", arch, f"interp computes {', '.join(SAELENS_ARCHITECTURES)}")
    kind, transcoder, skip = SAELENS_ARCHITECTURES[arch]
    dtype_name = str(cfg6.get("dtype", "float32")).removeprefix("torch.")
    if dtype_name not in DTYPES:
        _refuse("dtype", cfg6.get("dtype"), f"SAELens reads {', '.join(DTYPES)}")
    tensors = {n: t if n == "topk_threshold" else t.to(DTYPES[dtype_name])  # SAELens: float64
               for n, t in tensors.items()}  # fmt: skip
    _scaling_factor_tensor(tensors, cfg6)
    normalize = cfg6.get("normalize_activations", "none")
    reshape = cfg6.get("reshape_activations", "none")
    apply_b_dec = bool(cfg6.get("apply_b_dec_to_input", True))
    rescale = bool(cfg6.get("rescale_acts_by_decoder_norm", False))
    if rescale and kind not in ("topk", "batchtopk"):
        _refuse("rescale_acts_by_decoder_norm", True, f"SAELens's {arch} SAE has no such flag")
    hook = meta.get("hook_name") or cfg6.get("hook_name")
    if not hook:
        raise SAELensConfigError("cfg.json names no hook_name (under metadata or top level)")
    head = meta.get("hook_head_index", cfg6.get("hook_head_index"))
    if head is not None and reshape != "none":
        _refuse("hook_head_index", head, "one head's slice and reshape_activations='hook_z' "
                "do not go together")  # fmt: skip
    out_hook = None
    if transcoder:
        out_hook = meta.get("hook_name_out") or cfg6.get("hook_name_out")
        if not out_hook:
            raise SAELensConfigError(f"a {arch} names no hook_name_out (under metadata)")
        if meta.get("hook_head_index_out") is not None:
            _refuse("hook_head_index_out", meta["hook_head_index_out"], "not computed by interp")
        if apply_b_dec:
            _refuse("apply_b_dec_to_input", True, "SAELens refuses it for transcoders (and it "
                    "is the default when the key is missing)")  # fmt: skip
        if reshape != "none":
            _refuse("reshape_activations", reshape, "SAELens's transcoders never reshape")
    if normalize == "expected_average_only_in":
        _fold_scaling_factor(folder, tensors, norm_scaling_factor)
        normalize = "none"
    _check_tensors(arch, kind, skip, tensors)
    d_in, d_sae = (int(d) for d in tensors["W_enc"].shape)
    d_out = int(tensors["W_dec"].shape[-1])
    widths = {"d_in": d_in, "d_sae": d_sae} | ({"d_out": d_out} if transcoder else {})
    for key, value in widths.items():
        saved = cfg6.get(key, 768 if key == "d_out" else value)  # TranscoderConfig's default
        if int(saved) != value:
            raise SAELensConfigError(
                f"cfg.json says {key}={saved} but the weights are {d_in}x{d_sae}x{d_out}"
            )
    k = cfg6.get("k", 100) if kind in ("topk", "batchtopk") else None
    if kind in ("topk", "batchtopk") and k is None:
        _refuse("k", None, f"a {arch} SAE needs k")
    sae = SAE(
        tensors["W_enc"], tensors.get("b_enc"), tensors["W_dec"], tensors["b_dec"],
        architecture=kind, hook_name=hook, threshold=tensors.get("threshold"),
        k=None if k is None else (int(k) if kind == "topk" else float(k)),
        apply_b_dec_to_input=apply_b_dec, rescale_acts_by_decoder_norm=rescale,
        normalize_activations=normalize, hook_head_index=None if head is None else int(head),
        gate={n: tensors[n] for n in ("b_gate", "r_mag", "b_mag")} if kind == "gated" else None,
        reshape_activations=reshape, output_hook_name=out_hook,
        W_skip=tensors.get("W_skip"), cfg=cfg, source="saelens",
    )  # fmt: skip
    if kind == "batchtopk":
        sae.topk_threshold = tensors.get("topk_threshold")  # save writes it: SAELens needs it
    return sae


def _scaling_factor_tensor(tensors: dict, cfg6: dict) -> None:
    """SAELens drops a ``scaling_factor`` of ones; any other it cannot load in 6.x either."""
    factor = tensors.pop("scaling_factor", None)
    if factor is not None and not torch.allclose(factor, torch.ones_like(factor)):
        _refuse("finetuning_scaling_factor", cfg6.get("finetuning_scaling_factor"),
                "a scaling_factor other than 1 is a pre-6 fine-tuned scale that SAELens 6 "
                "does not load; interp refuses it too")  # fmt: skip


def _fold_scaling_factor(folder: Path, tensors: dict, factor: float | None) -> None:
    """``fold_activation_norm_scaling_factor(s)``: ``W_enc * s``, ``W_dec / s``, ``b_dec / s``,
    with ``s`` given, or saved beside the weights."""
    path = folder / SCALER_FILE
    if factor is None and path.is_file():
        factor = json.loads(path.read_text(encoding="utf-8")).get("scaling_factor")
    if factor is None:
        why = (
            f"its scaling factor is not saved beside the weights ({SCALER_FILE}); pass "
            "load_sae(..., norm_scaling_factor=) (SAELens's pretrained_saes.yaml has it)"
        )
        _refuse("normalize_activations", "expected_average_only_in", why)
    tensors["W_enc"] = tensors["W_enc"] * factor
    tensors["W_dec"] = tensors["W_dec"] / factor
    tensors["b_dec"] = tensors["b_dec"] / factor
    if "topk_threshold" in tensors:  # SAELens's BatchTopKTrainingSAE folds it too
        tensors["topk_threshold"] = tensors["topk_threshold"] / factor


def _check_tensors(arch: str, kind: str, skip: bool, tensors: dict) -> None:
    needed = {"W_enc", "W_dec", "b_dec"}
    needed |= {"b_gate", "r_mag", "b_mag"} if kind == "gated" else {"b_enc"}
    needed |= {"threshold"} if kind == "jumprelu" else set()
    needed |= {"W_skip"} if skip else set()
    check_names(tensors, needed, "sae_weights.safetensors",
                known={"topk_threshold"} if arch == "batchtopk" else (),
                unknown=f", which a SAELens {arch} SAE does not have; interp does not know what "
                "it computes")  # fmt: skip
