"""Load transcoders from circuit-tracer's folders or SAELens's, and check that they fit a model.

A folder is ``config.yaml`` and the files :mod:`interp.transcoders.files` writes; a per-layer
set may list its files instead (``transcoders:``, relative to the folder: ``.safetensors``, or
Gemma Scope's ``.npz`` with ``W_enc [d_model d_tc]`` and ``threshold``). The activation is
``config["activation"]`` (``relu``, ``topk`` with ``k``, ``jump_relu``) or, as circuit-tracer
does without one, JumpReLU where the files hold thresholds and ReLU otherwise. The hooks are
circuit-tracer's names inside a block, which the bridge has under the same names
(:data:`INPUT_HOOKS`, :data:`OUTPUT_HOOKS`).

SAELens transcoders (one ``cfg.json`` + ``sae_weights.safetensors`` folder per layer: a folder
of such folders, or a list of them) are read by :mod:`interp.transcoders.saelens`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import torch
import yaml

from interp.dictionaries.activations import ALIASES
from interp.dictionaries.files import check_names, read_tensors
from interp.engine.passes import hook_shape
from interp.models.sources import BUNDLED_DIR
from interp.transcoders.files import CONFIG
from interp.transcoders.saelens import saelens_folders, saelens_parts
from interp.transcoders.transcoder import ACTIVATIONS, INPUT_HOOKS, OUTPUT_HOOKS, TranscoderSet

__all__ = [
    "INPUT_HOOKS",
    "OUTPUT_HOOKS",
    "TranscoderFitError",
    "TranscoderLoadError",
    "check_transcoders_fit",
    "load_transcoders",
]

NORMALIZED = "ln2.hook_normalized"  # the MLP's norm before its weight and bias
NORMALIZED_0 = f"blocks.0.{NORMALIZED}"
# config.yaml's keys: what interp reads, and circuit-tracer's hub bookkeeping (read by no one);
# any other key is refused, naming it: a misspelt "activaton: topk" would silently run ReLU
CONFIG_KEYS = ("model_kind", "feature_input_hook", "feature_output_hook", "scan", "activation", "k",
               "transcoders")  # fmt: skip
METADATA_KEYS = ("model_name", "repo_id", "revision", "subfolder")


class TranscoderLoadError(ValueError):
    """What is wrong with a transcoder folder or name, in one line."""


class TranscoderFitError(ValueError):
    """Transcoders whose width, layer count or hooks do not fit the model, in one line."""


def _folder(path_or_name: str | Path) -> Path:
    path = Path(path_or_name)
    if path.is_dir():
        return path
    bundled = BUNDLED_DIR / str(path_or_name)
    if re.fullmatch(r"[\w.-]+", str(path_or_name)) and (bundled / CONFIG).is_file():
        return bundled
    raise TranscoderLoadError(
        f"no transcoder folder or bundled transcoder set called {str(path_or_name)!r}; pass a "
        f"folder with {CONFIG} (download a hub repository with huggingface_hub.snapshot_download)"
    )


def _per_layer_files(folder: Path, config: dict) -> list[Path]:
    listed = config.get("transcoders")
    if listed:
        remote = [p for p in listed if str(p).startswith("hf://")]
        if remote:
            raise TranscoderLoadError(
                f"{folder / CONFIG} lists hub files ({remote[0]}); download them and list the "
                "local files instead"
            )
        return [folder / str(p) for p in listed]
    numbers = sorted(
        int(m.group(1))
        for p in folder.glob("layer_*.safetensors")
        if (m := re.fullmatch(r"layer_(\d+)\.safetensors", p.name))
    )
    if numbers != list(range(len(numbers))) or not numbers:
        raise TranscoderLoadError(
            f"{folder} needs layer_0.safetensors ... layer_{{n-1}}.safetensors, found layers "
            f"{numbers}"
        )
    return [folder / f"layer_{n}.safetensors" for n in numbers]


def _read_config(path: Path) -> dict:
    """``config.yaml`` as a mapping of known keys; a TranscoderLoadError naming the file (and
    the key) otherwise."""
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise TranscoderLoadError(
            f"{path} is not readable YAML{where}; write it again (model_kind, "
            "feature_input_hook, feature_output_hook, ...)"
        ) from None
    config = {} if config is None else config
    if not isinstance(config, dict):
        raise TranscoderLoadError(f"{path} is not a mapping of keys (model_kind: ..., ...)")
    unknown = [str(key) for key in config if key not in CONFIG_KEYS + METADATA_KEYS]
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], CONFIG_KEYS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise TranscoderLoadError(
            f"{path}: unknown key {unknown[0]!r}; {hint}interp reads {', '.join(CONFIG_KEYS)}"
        )
    return config


def _read_layer(path: Path, needed: Sequence[str]) -> dict:
    try:
        raw = read_tensors(path)
        check_names(raw, needed, str(path), known=raw)  # other tensors may be there too
    except ValueError as err:
        raise TranscoderLoadError(f"transcoder file {err}") from None
    if path.suffix == ".npz":  # Gemma Scope: W_enc [d_model d_tc], threshold
        raw["W_enc"] = raw["W_enc"].T.contiguous()
        if "threshold" in raw:
            raw["activation_function.threshold"] = raw.pop("threshold")
    return raw


def _activation(config: dict, thresholds: list, folder: Path, saved_k=None) -> dict:
    """The set's activation (module docstring), with its thresholds or ``k``."""
    name = config.get("activation")
    name = ("jumprelu" if thresholds[0] is not None else "relu") if name is None else name
    activation = ALIASES.get(str(name), str(name))
    if activation not in ACTIVATIONS:
        raise TranscoderLoadError(
            f"{folder / CONFIG}: unknown activation {name!r}; interp reads relu, jump_relu, topk"
        )
    out = {"activation": activation, "threshold": thresholds if activation == "jumprelu" else None}
    if activation == "topk":
        if config.get("k", saved_k) is None:
            raise TranscoderLoadError(f"{folder / CONFIG}: a topk transcoder needs k")
        out["k"] = int(config.get("k", saved_k))
    return out


def _per_layer(folder: Path, config: dict) -> dict:
    keys = ("W_enc", "b_enc", "W_dec", "b_dec")
    layers = [_read_layer(p, keys) for p in _per_layer_files(folder, config)]
    out = {key: [t[key] for t in layers] for key in keys}
    skips = [t.get("W_skip") for t in layers]
    if any(s is None for s in skips) and any(s is not None for s in skips):
        raise TranscoderLoadError(f"{folder}: some layers have W_skip and others not")
    out["W_skip"] = None if skips[0] is None else skips
    thresholds = [t.get("activation_function.threshold") for t in layers]
    saved_k = layers[0].get("k")
    return out | _activation(config, thresholds, folder, saved_k) | {"kind": "per-layer"}


def _cross_layer(folder: Path, config: dict) -> dict:
    n = len(list(folder.glob("W_enc_*.safetensors")))
    if n == 0:
        raise TranscoderLoadError(f"{folder} has no W_enc_0.safetensors (a cross-layer set)")
    out = {key: [] for key in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold")}
    keys = ("W_enc", "b_enc", "b_dec")
    for layer in range(n):
        enc = _read_layer(folder / f"W_enc_{layer}.safetensors", [f"{k}_{layer}" for k in keys])
        dec = _read_layer(folder / f"W_dec_{layer}.safetensors", [f"W_dec_{layer}"])
        for key in keys:
            out[key].append(enc[f"{key}_{layer}"])
        out["W_dec"].append(dec[f"W_dec_{layer}"])
        out["threshold"].append(enc.get(f"threshold_{layer}"))
    thresholds = out.pop("threshold")
    return out | _activation(config, thresholds, folder) | {"kind": "cross-layer"}


def _from_saelens(paths: Sequence[Path], name: str) -> TranscoderSet:
    try:
        return TranscoderSet(**saelens_parts(paths), name=name)
    except ValueError as err:  # SAELensTranscoderError among them
        raise TranscoderLoadError(str(err)) from None


def load_transcoders(
    path_or_name: str | Path | Sequence[str | Path],
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> TranscoderSet:
    """A transcoder set from a circuit-tracer folder, a bundled name, or SAELens transcoders:
    a folder of per-layer SAELens folders (or one such folder), or a list of them.

    Raises:
        TranscoderLoadError: a missing folder, file or tensor, or an unknown kind or
            activation; for SAELens folders, also what :mod:`interp.transcoders.saelens`
            refuses, named in one line.
    """
    if not isinstance(path_or_name, str | os.PathLike):  # a list of SAELens folders
        paths = [Path(p) for p in path_or_name]
        if missing := [p for p in paths if not p.is_dir()]:
            raise TranscoderLoadError(f"{missing[0]} is not a folder (a SAELens transcoder)")
        return _from_saelens(paths, "saelens-transcoders").to(device=device, dtype=dtype)
    folder = _folder(path_or_name)
    config_path = folder / CONFIG
    if not config_path.is_file() and (folders := saelens_folders(folder)):
        return _from_saelens(folders, folder.name).to(device=device, dtype=dtype)
    if not config_path.is_file():
        raise TranscoderLoadError(
            f"{folder} has no {CONFIG} (circuit-tracer's) and no SAELens transcoder folders "
            "(cfg.json + sae_weights.safetensors)"
        )
    config = _read_config(config_path)
    kind, readers = config.get("model_kind"), {"transcoder_set": _per_layer,
                                               "cross_layer_transcoder": _cross_layer}  # fmt: skip
    if kind not in readers:
        raise TranscoderLoadError(
            f"{config_path}: model_kind must be {' or '.join(readers)}, got {kind!r}"
        )
    parts = readers[kind](folder, config)
    try:
        tc = TranscoderSet(
            **parts,
            input_hook=str(config.get("feature_input_hook", "mlp.hook_in")),
            output_hook=str(config.get("feature_output_hook", "mlp.hook_out")),
            name=str(config.get("scan") or folder.name),
        )
    except ValueError as err:
        raise TranscoderLoadError(f"{folder}: {err}") from None
    tc.source = str(path_or_name)  # the folder as given: errors name it beside the scan
    return tc.to(device=device, dtype=dtype)


def _named(tc: TranscoderSet) -> str:
    """The set's name, and the folder it was loaded from where that says more."""
    source = getattr(tc, "source", None)
    return f"{tc.name!r}" + (f" ({source})" if source and source != tc.name else "")


def check_transcoders_fit(model, tc: TranscoderSet) -> None:
    """Refuse, in one line and before any run, transcoders whose layer count, width or hooks
    do not fit ``model``."""
    n_layers, d_model = int(model.cfg.n_layers), int(model.cfg.d_model)
    if tc.n_layers != n_layers:
        raise TranscoderFitError(
            f"transcoders {_named(tc)} cover {tc.n_layers} layers but the model has {n_layers}; "
            "load transcoders trained on this model (one per layer"
            + ("; is a layer's file missing?)" if tc.n_layers < n_layers else ")")
        )
    if tc.d_model != d_model:
        raise TranscoderFitError(
            f"transcoders {_named(tc)} read width {tc.d_model} but the model's d_model is "
            f"{d_model}; load transcoders trained on this model"
        )
    for hook, allowed, what in (
        (tc.feature_input_hook, INPUT_HOOKS, "read"),
        (tc.feature_output_hook, OUTPUT_HOOKS, "write"),
    ):
        if hook not in allowed:
            raise TranscoderFitError(
                f"transcoders {_named(tc)} {what} {hook!r}; interp splices transcoders that "
                f"{what} one of {', '.join(allowed)}"
            )
    if tc.feature_input_hook == NORMALIZED and NORMALIZED_0 not in model.hook_dict:
        raise TranscoderFitError(
            f"transcoders {_named(tc)} read ln2.hook_normalized, but this model has no "
            "ln2.hook_normalized: its attention and MLP read one norm; use mlp.hook_in"
        )
    for layer in range(n_layers):
        for name in (tc.input_hook(layer), tc.output_hook(layer)):
            if name not in model.hook_dict:
                hint = (
                    "parallel attention/MLP blocks have no hook_resid_mid: use mlp.hook_in"
                    if name.endswith("hook_resid_mid")
                    else "transcoders replace MLPs: this model has none there"
                )
                raise TranscoderFitError(
                    f"transcoders {_named(tc)} use {name}, which this model has no hook for "
                    f"({hint})"
                )
    if tc.feature_input_hook == NORMALIZED and len(shape := hook_shape(model, NORMALIZED_0)) != 3:
        raise TranscoderFitError(
            f"transcoders {_named(tc)} read ln2.hook_normalized, which this model flattens over "
            f"batch and position (shape {list(shape)} for one row of 2 tokens; OPT's bridge does), "
            "so interp cannot splice them there"
        )
