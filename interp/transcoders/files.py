"""circuit-tracer's transcoder folders, written: ``config.yaml`` and the safetensors files.

Per-layer (``model_kind: transcoder_set``): ``layer_{l}.safetensors`` with ``W_enc``
``[d_tc d_model]``, ``W_dec`` ``[d_tc d_model]``, ``b_enc``, ``b_dec``, and
``activation_function.threshold`` (JumpReLU), ``k`` (TopK), ``W_skip`` where there are.
Cross-layer (``model_kind: cross_layer_transcoder``): ``W_enc_{l}.safetensors`` with
``W_enc_{l}``, ``b_enc_{l}``, ``b_dec_{l}`` and ``threshold_{l}`` (JumpReLU), and
``W_dec_{l}.safetensors`` with ``W_dec_{l}`` ``[d_tc n_layers-l d_model]``. ``config.yaml``
names the kind, the hooks (``feature_input_hook``, ``feature_output_hook``), ``scan`` and, where
circuit-tracer needs it, ``activation`` and ``k``. The folder is written beside its final place
and renamed into it: a failed save leaves nothing half-written.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import yaml
from safetensors.torch import save_file

__all__ = ["CONFIG", "write_folder"]

CONFIG = "config.yaml"  # the file that makes a folder a transcoder set
MODEL_KINDS = {"per-layer": "transcoder_set", "cross-layer": "cross_layer_transcoder"}


def _config(tc) -> dict:
    config = {
        "model_kind": MODEL_KINDS[tc.kind],
        "feature_input_hook": tc.feature_input_hook,
        "feature_output_hook": tc.feature_output_hook,
        "scan": tc.name,
    }
    if tc.activation in ("relu", "topk"):  # jumprelu: circuit-tracer reads the thresholds
        config["activation"] = tc.activation
    if tc.k is not None:
        config["k"] = int(tc.k)
    return config


def _write_tensors(tc, folder: Path) -> None:
    import torch

    def save(tensors: dict, name: str) -> None:
        tensors = {
            k: v.detach().to("cpu").contiguous() for k, v in tensors.items() if v is not None
        }
        save_file(tensors, folder / name)

    for layer in range(tc.n_layers):
        if tc.kind == "per-layer":
            k = None if tc.k is None else torch.tensor(int(tc.k))
            save({"W_enc": tc.W_enc(layer), "W_dec": tc.W_dec(layer), "b_enc": tc.b_enc(layer),
                  "b_dec": tc.b_dec(layer), "activation_function.threshold": tc.threshold(layer),
                  "W_skip": tc.W_skip(layer), "k": k}, f"layer_{layer}.safetensors")  # fmt: skip
            continue
        save({f"W_enc_{layer}": tc.W_enc(layer), f"b_enc_{layer}": tc.b_enc(layer),
              f"b_dec_{layer}": tc.b_dec(layer), f"threshold_{layer}": tc.threshold(layer)},
             f"W_enc_{layer}.safetensors")  # fmt: skip
        save({f"W_dec_{layer}": tc.W_dec(layer)}, f"W_dec_{layer}.safetensors")


def write_folder(tc, path: str | Path) -> Path:
    """Write transcoder set ``tc`` (:class:`interp.transcoders.TranscoderSet`) to folder
    ``path`` in circuit-tracer's format; an existing folder is replaced only once the new one
    is complete."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{path} is a file; pass a folder to save transcoders into")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        _write_tensors(tc, tmp)
        text = yaml.safe_dump(_config(tc), sort_keys=False)
        (tmp / CONFIG).write_text(text, encoding="utf-8")
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old)
        else:
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path
