"""The model a worker runs: loaded from the driver's checkpoint once per worker process, and
checked against the driver's fingerprint (a model changed in memory after loading is refused,
never silently replaced by its checkpoint). A worker its executor gave a GPU of its own
(:mod:`interp.foundation.executors.devices`) loads a CUDA model onto that GPU, ``"cuda"``: its
first visible device, whatever index the driver's model had."""

from __future__ import annotations

import os

import torch

from interp.foundation.executors.call import WORKER_GPU
from interp.models.fingerprint import model_fingerprint
from interp.models.loading import load_model

__all__ = ["model_source", "model_spec", "worker_device", "worker_model"]

_MODELS: dict[tuple, tuple] = {}  # (source, device, dtype) -> (model, fingerprint)


def model_source(model) -> str:
    """The checkpoint ``model`` was loaded from (a folder or hub name), for the workers."""
    config = getattr(getattr(model, "original_model", None), "config", None)
    source = getattr(config, "_name_or_path", "") or ""
    if not source:
        raise ValueError(
            "executor=: the workers load the model from its checkpoint, and this one was built "
            "in memory; save it (model.original_model.save_pretrained(folder) with its "
            "tokenizer) and load it with interp.load_model(folder)"
        )
    return str(source)


def model_spec(model, source: str | None = None) -> dict:
    """What a worker needs to load ``model``: source, device, dtype and fingerprint."""
    return {
        "source": source or model_source(model),
        "device": str(model.cfg.device),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "fingerprint": model_fingerprint(model),
    }


def worker_device(device: str) -> str:
    """Where this worker loads a model the driver has on ``device`` (module docstring)."""
    if device.startswith("cuda") and os.environ.get(WORKER_GPU) == "1":
        return "cuda"
    return device


def worker_model(source: str, device: str, dtype: str, fingerprint: str | None = None):
    """The model of ``source`` in this process (loaded once, on :func:`worker_device`),
    checked against ``fingerprint``."""
    device = worker_device(device)
    wanted = (source, device, dtype)
    if wanted not in _MODELS:
        model = load_model(source, device=device, dtype=getattr(torch, dtype))
        _MODELS[wanted] = (model, model_fingerprint(model))
    model, found = _MODELS[wanted]
    if fingerprint is not None and found != fingerprint:
        raise ValueError(
            f"the model loaded from {source} is not the one given (fingerprint {found}, "
            f"expected {fingerprint}): was it changed after loading? Save it and load it from "
            "its folder"
        )
    return model
