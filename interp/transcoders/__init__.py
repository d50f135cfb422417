"""Transcoders (per-layer, skip and cross-layer) in circuit-tracer's format: load, check, save,
train.

The door: :func:`load_transcoders` reads a folder (circuit-tracer's or SAELens's) into a
:class:`TranscoderSet`, :func:`check_transcoders_fit` checks it against a model,
:func:`write_folder` saves one, :func:`train_transcoder` trains one.
"""

from __future__ import annotations

import importlib

# public name -> its module, imported on first use (importing the package stays cheap)
_EXPORTS = {
    "TranscoderSet": "interp.transcoders.transcoder",
    "load_transcoders": "interp.transcoders.loading",
    "check_transcoders_fit": "interp.transcoders.loading",
    "TranscoderLoadError": "interp.transcoders.loading",
    "TranscoderFitError": "interp.transcoders.loading",
    "write_folder": "interp.transcoders.files",
    "train_transcoder": "interp.transcoders.train",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
