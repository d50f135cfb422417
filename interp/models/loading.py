"""Load a hooked model: a hub name, a local checkpoint directory, or a bundled model.

All three go through TransformerLens 4's ``TransformerBridge.boot_transformers``; this module
only decides *what* to hand it and refuses, with one clear message, what would otherwise fail
slowly (a 45-second retry loop offline) or silently (a 1-token tokenizer, pickled weights).
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

import torch

from interp.models.sources import (
    BUNDLED_DIR,
    SAFE_WEIGHTS,
    ModelLoadError,
    bundled_models,
    check_checkpoint_dir,
    resolve_source,
)

__all__ = ["ModelLoadError", "BUNDLED_DIR", "bundled_models", "load_model", "resolve_source"]

logger = logging.getLogger(__name__)


HUB_PROBE_TIMEOUT_S = 3.0  # a reachable hub answers a TCP connect well inside this


def _hub_cached(repo_id: str, filename: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, filename), str)


def _hub_reachable() -> bool:
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=HUB_PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def _hub_is_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0")


def check_hub_name(repo_id: str, *, allow_pickle: bool) -> None:
    """Fail fast when a hub model can be neither found in the cache nor fetched."""
    cached = _hub_cached(repo_id, "config.json")
    if not cached:
        advice = (
            "Download it on a machine with access and pass the directory written by "
            "save_pretrained (config, safetensors weights and tokenizer), or use a bundled "
            f"model: {', '.join(bundled_models()) or 'none installed'}."
        )
        if _hub_is_offline():
            raise ModelLoadError(
                f"'{repo_id}' is not in the local cache and the hub is disabled "
                f"(HF_HUB_OFFLINE is set). {advice}"
            )
        if not _hub_reachable():
            raise ModelLoadError(
                f"'{repo_id}' is not in the local cache and the model hub cannot "
                f"be reached from this machine. {advice}"
            )
    if allow_pickle:
        return
    if cached:
        has_safe = any(_hub_cached(repo_id, f) for f in SAFE_WEIGHTS)
    else:
        from huggingface_hub import list_repo_files

        has_safe = any(f in SAFE_WEIGHTS for f in list_repo_files(repo_id))
    if not has_safe:
        raise ModelLoadError(
            f"'{repo_id}' has no safetensors weights, and loading pickled weights "
            "can run arbitrary code. Pass allow_pickle=True if you trust it."
        )


def load_model(
    name_or_path: str | os.PathLike,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    device_map: str | dict[str, str | int] | None = None,
    max_memory: dict[str | int, int | str] | None = None,
    offload_folder: str | os.PathLike | None = None,
    n_devices: int | None = None,
    n_ctx: int | None = None,
    revision: str | None = None,
    hf_config_overrides: dict | None = None,
):
    """Load a hooked model (a TransformerLens 4 ``TransformerBridge``), in eval mode.

    Args:
        name_or_path: a hub name (``"gpt2"``), a directory written by ``save_pretrained``
            (config, safetensors weights, tokenizer), or a bundled model's short name
            (see :func:`bundled_models`).
        device: where to put the model; ``None`` lets TransformerLens choose.
        dtype: parameter dtype.
        allow_pickle: permit ``pytorch_model.bin`` weights (unpickling can run code).
        trust_remote_code: permit a checkpoint's own modelling code to run.
        device_map: for models larger than memory: accelerate's placement, ``"auto"`` (fill
            each device up to ``max_memory``, put the rest on disk), ``"balanced"``,
            ``"sequential"``, or a dict from module names (``"transformer.h.3"``) to ``"cpu"``,
            ``"disk"`` or a GPU index. Layers placed on disk (or, beside a GPU, on the CPU)
            are offloaded: their weights are read from the checkpoint while each layer runs.
            Every analysis gives the same numbers as in memory, but slower; folding (and so
            logit attribution) refuses offloaded models (TransformerLens 4.3 cannot fold
            them), and TransformerLens refuses maps that mix a GPU with CPU/disk.
            Exclusive with ``device``.
        max_memory: with ``device_map="auto"``, the most each device may hold, e.g.
            ``{"cpu": "1GiB"}`` or ``{0: "10GB", "cpu": "30GB"}``; sizes are bytes or text
            (``"500MB"``, ``"1GiB"``), checked before anything loads.
        offload_folder: where disk-offloaded weights go (safetensors checkpoints are read in
            place and need none; otherwise a temporary directory).
        n_devices: split the layers over this many GPUs (TransformerLens's own placement).
        n_ctx: context length to use instead of the checkpoint's (e.g. a shorter one to
            save memory).
        revision: hub models only: the branch, tag or commit to load.
        hf_config_overrides: entries that replace those of the checkpoint's ``config.json``
            before the model is built.

    The last four are passed to ``TransformerBridge.boot_transformers`` as they are.

    Raises:
        ModelLoadError: the source cannot be loaded; the message says what to do.
    """
    from transformer_lens.model_bridge import TransformerBridge

    kind, location = resolve_source(name_or_path)
    if kind == "hub":
        check_hub_name(location, allow_pickle=allow_pickle)
    else:
        check_checkpoint_dir(Path(location), allow_pickle=allow_pickle)
    folder = None if offload_folder is None else str(offload_folder)
    options = dict(device_map=device_map, max_memory=max_memory, offload_folder=folder)
    options.update(n_devices=n_devices, n_ctx=n_ctx, revision=revision)
    bridge_kwargs = _bridge_options(device, hf_config_overrides=hf_config_overrides, **options)
    logger.info("loading %s model from %s", kind, location)
    try:
        model = TransformerBridge.boot_transformers(
            location,
            device=device,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            **bridge_kwargs,
        )
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"could not load '{name_or_path}': {exc}") from exc
    _check_loaded(model, name_or_path, bridge_kwargs.get("max_memory"))
    model.eval()
    return model


def _bridge_options(device, **options) -> dict:
    """The options given (not None) for ``boot_transformers``, ``max_memory`` in bytes, after
    refusing combinations that cannot work."""
    device_map, max_memory = options["device_map"], options["max_memory"]
    if device is not None and device_map is not None:
        raise ModelLoadError("pass either device or device_map, not both")
    if max_memory is not None:
        from interp.foundation.sizes import parse_size

        if device_map is None:
            raise ModelLoadError(
                "max_memory only takes effect with a device_map; pass device_map='auto' as well"
            )
        try:
            options["max_memory"] = {
                key: parse_size(size) for key, size in dict(max_memory).items()
            }
        except (TypeError, ValueError) as exc:
            raise ModelLoadError(f"bad max_memory {max_memory!r}: {exc}") from exc
    return {key: value for key, value in options.items() if value is not None}


def _check_loaded(model, name_or_path, max_memory) -> None:
    """Refuse a model that loaded but cannot run: all of it on disk, or no usable tokenizer."""
    placed = getattr(getattr(model, "original_model", None), "hf_device_map", None) or {}
    if placed and all(str(v).lower() == "disk" for v in placed.values()):
        # accelerate then has no device to run on and fails inside the first forward pass
        raise ModelLoadError(
            f"max_memory {max_memory} leaves no room for any of the model's "
            "modules, so all of it went to disk; give the device at least "
            "room for the embeddings and one layer"
        )
    if model.tokenizer is None or len(model.tokenizer) < 2:
        raise ModelLoadError(
            f"'{name_or_path}' loaded without a usable tokenizer; save one next "
            "to the weights with tokenizer.save_pretrained(directory)"
        )
