"""Activations on disk: written in shards, read back shuffled in batches (docs/scale.md)."""

from __future__ import annotations

from interp.foundation.doors import lazy_package

_EXPORTS = {
    "ActivationStore": "interp.stores.activations",
    "fill_store": "interp.stores.activations",
    "model_fingerprint": "interp.models.fingerprint",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_package(__name__, _EXPORTS)
