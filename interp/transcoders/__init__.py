"""Transcoders (per-layer, skip and cross-layer) in circuit-tracer's format: load, check, save,
train.

The door: :func:`load_transcoders` reads a folder (circuit-tracer's or SAELens's) into a
:class:`TranscoderSet`, :func:`check_transcoders_fit` checks it against a model,
:func:`write_folder` saves one, :func:`train_transcoder` trains one.
"""

from __future__ import annotations

from interp.foundation.doors import lazy_exports

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

__getattr__ = lazy_exports(__name__, _EXPORTS)
