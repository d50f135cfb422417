"""Activations on disk: written in shards, read back shuffled in batches (docs/scale.md)."""

from __future__ import annotations

from interp.foundation.doors import exports, lazy_package

_EXPORTS = exports(
    __name__,
    {
        ".activations": ("ActivationStore", "fill_store"),
        "interp.models.fingerprint": ("model_fingerprint",),
    },
)

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_package(__name__, _EXPORTS)
