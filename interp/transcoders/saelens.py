"""SAELens transcoders as a :class:`~interp.transcoders.transcoder.TranscoderSet`: one SAELens 6
folder (``cfg.json`` + ``sae_weights.safetensors``) per layer.

Each folder is read by interp's SAE loader (:func:`interp.saes.loading.load_sae`: what SAELens
computes), then taken apart into the set's per-layer weights:

- the architecture must be one of SAELens's transcoders (``transcoder``, ``skip_transcoder``,
  ``jumprelu_transcoder``, ``jumprelu_skip_transcoder``): ReLU, or JumpReLU, whose
  ``ReLU(h) * (h > t)`` is circuit-tracer's ``h * (h > max(t, 0))`` exactly, so a negative
  threshold is raised to 0; ``W_enc [d_in d_sae]`` becomes ``[d_tc d_model]``, ``W_dec`` and
  ``W_skip`` are already the set's;
- ``hook_name`` / ``hook_name_out`` are ``blocks.{l}.{site}``: the layer is ``l`` (the same
  for both), and the sites are the bridge's (:data:`~interp.transcoders.transcoder.INPUT_HOOKS`,
  :data:`~interp.transcoders.transcoder.OUTPUT_HOOKS`), the same in every folder;
- the folders cover layers ``0 .. n-1`` once each, with one width, one activation, skip
  matrices in all or none.

What SAELens would compute that a set cannot hold is refused in one line naming the folder and
the key: input normalisation (``normalize_activations``: ``constant_norm_rescale``,
``layer_norm``), one head's slice (``hook_head_index``) and ``d_in != d_out``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from interp.saes.loading import SAELoadError, load_sae, sae_format
from interp.transcoders.transcoder import INPUT_HOOKS, OUTPUT_HOOKS

__all__ = ["SAELensTranscoderError", "saelens_folders", "saelens_parts"]

_HOOK = re.compile(r"blocks\.(\d+)\.(.+)")


class SAELensTranscoderError(ValueError):
    """A SAELens folder that cannot be one layer of a transcoder set, in one line."""


def saelens_folders(path: Path) -> list[Path]:
    """The SAELens folders ``path`` is (itself) or holds (its subfolders), or []."""
    if sae_format(path) == "saelens":
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and sae_format(p) == "saelens")


def _site(folder: Path, key: str, hook: str, sites: tuple[str, ...]) -> tuple[int, str]:
    match = _HOOK.fullmatch(hook)
    if match is None or match.group(2) not in sites:
        raise SAELensTranscoderError(
            f"{folder}: {key}={hook!r} is not one of interp's transcoder sites; a transcoder set "
            f"reads blocks.L.{{{','.join(INPUT_HOOKS)}}} and writes blocks.L."
            f"{{{','.join(OUTPUT_HOOKS)}}}"
        )
    return int(match.group(1)), match.group(2)


def _layer(folder: Path) -> dict:
    """One folder's layer, sites and weights in the set's layout."""
    try:
        sae = load_sae(folder)
    except SAELoadError as err:
        raise SAELensTranscoderError(f"{folder}: {err}") from None
    arch = sae.cfg.get("architecture", "standard")
    if sae.output_hook_name is None:
        raise SAELensTranscoderError(
            f"{folder}: architecture={arch!r} is an SAE, not a transcoder (SAELens's transcoders: "
            "transcoder, skip_transcoder, jumprelu_transcoder, jumprelu_skip_transcoder)"
        )
    refused = {
        "normalize_activations": (sae.normalize_activations != "none", "input normalisation"),
        "hook_head_index": (sae.hook_head_index is not None, "one head's slice"),
    }
    for key, (bad, what) in refused.items():
        if bad:
            raise SAELensTranscoderError(
                f"{folder}: {key}={getattr(sae, key)!r}: SAELens computes {what}, which a "
                "transcoder set cannot hold"
            )
    if sae.d_in != sae.d_out:
        raise SAELensTranscoderError(
            f"{folder}: d_in={sae.d_in} but d_out={sae.d_out}; a transcoder set reads and "
            "writes the residual width"
        )
    layer, in_site = _site(folder, "hook_name", sae.hook_name, INPUT_HOOKS)
    out_layer, out_site = _site(folder, "hook_name_out", sae.output_hook_name, OUTPUT_HOOKS)
    if out_layer != layer:
        raise SAELensTranscoderError(
            f"{folder}: hook_name reads layer {layer} but hook_name_out writes layer "
            f"{out_layer}; a per-layer transcoder writes its own layer"
        )
    detach = {n: getattr(sae, n) for n in ("W_enc", "b_enc", "W_dec", "b_dec", "W_skip")}
    w = {n: None if t is None else t.detach() for n, t in detach.items()}
    jump = sae.architecture == "jumprelu"
    return {
        "layer": layer, "sites": (in_site, out_site), "folder": folder,
        "W_enc": w["W_enc"].T.contiguous(), "b_enc": w["b_enc"], "W_dec": w["W_dec"],
        "b_dec": w["b_dec"], "W_skip": w["W_skip"],
        "threshold": sae.threshold.detach().clamp(min=0) if jump else None,
    }  # fmt: skip


def _same(layers: list[dict], what: str, value) -> None:
    first = value(layers[0])
    for one in layers[1:]:
        if value(one) != first:
            raise SAELensTranscoderError(
                f"{one['folder']}: {what} is {value(one)}, but {layers[0]['folder']}'s is "
                f"{first}; a transcoder set has one {what} in every layer"
            )


def saelens_parts(paths: Sequence[str | Path]) -> dict:
    """:class:`TranscoderSet` keywords from one SAELens folder per layer (module docstring)."""
    if not paths:
        raise SAELensTranscoderError("no SAELens transcoder folders given")
    layers = sorted((_layer(Path(p)) for p in paths), key=lambda one: one["layer"])
    _same(layers, "hook_name's site", lambda one: one["sites"][0])
    _same(layers, "hook_name_out's site", lambda one: one["sites"][1])
    _same(layers, "d_sae", lambda one: one["W_enc"].shape[0])
    _same(layers, "d_in", lambda one: one["W_enc"].shape[1])
    _same(layers, "activation", lambda one: "jumprelu" if one["threshold"] is not None else "relu")
    _same(layers, "W_skip", lambda one: "present" if one["W_skip"] is not None else "absent")
    numbers = [one["layer"] for one in layers]
    if numbers != list(range(len(numbers))):
        missing = sorted(set(range(max(numbers) + 1)) - set(numbers))
        twice = sorted({n for n in numbers if numbers.count(n) > 1})
        what = f"layer {twice[0]} twice" if twice else f"no layer {missing[0]}"
        raise SAELensTranscoderError(
            f"{Path(paths[0]).parent}: the SAELens folders cover layers {numbers}: {what}; a "
            "transcoder set needs one folder per layer 0 .. n-1"
        )
    jump = layers[0]["threshold"] is not None
    parts = {key: [one[key] for one in layers] for key in ("W_enc", "b_enc", "W_dec", "b_dec")}
    return parts | {
        "W_skip": [one["W_skip"] for one in layers] if layers[0]["W_skip"] is not None else None,
        "threshold": [one["threshold"] for one in layers] if jump else None,
        "activation": "jumprelu" if jump else "relu",
        "kind": "per-layer",
        "input_hook": layers[0]["sites"][0],
        "output_hook": layers[0]["sites"][1],
    }
