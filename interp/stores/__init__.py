"""Activations on disk: written in shards, read back shuffled in batches (docs/scale.md)."""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ActivationStore": "interp.stores.activations",
    "fill_store": "interp.stores.activations",
    "model_fingerprint": "interp.models.fingerprint",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'interp.stores' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
