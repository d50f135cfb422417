"""Transcoders (per-layer, skip and cross-layer) in circuit-tracer's format: load, check, save,
train.

The door: :func:`load_transcoders` reads a folder (circuit-tracer's or SAELens's) into a
:class:`TranscoderSet`, :func:`check_transcoders_fit` checks it against a model,
:func:`write_folder` saves one, :func:`train_transcoder` trains one.
"""

from __future__ import annotations

from interp.foundation.doors import exports, lazy_package

_EXPORTS = exports(
    __name__,
    {
        ".transcoder": ("TranscoderSet",),
        ".loading": (
            "load_transcoders",
            "check_transcoders_fit",
            "TranscoderLoadError",
            "TranscoderFitError",
        ),
        ".files": ("write_folder",),
        ".train": ("train_transcoder",),
    },
)

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_package(__name__, _EXPORTS)
