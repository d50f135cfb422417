"""Deprecated: :func:`interp.dictionaries.files.read_tensors` reads SAE and transcoder files
alike since 0.6.0; ``read_safetensors`` keeps working until 0.7 with a DeprecationWarning."""

from __future__ import annotations

import warnings

__deprecated__ = "use interp.dictionaries.files.read_tensors; this path goes in 0.7.0"


def __getattr__(name: str):
    if name != "read_safetensors":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        "interp.saes.safetensors_file.read_safetensors moved to "
        "interp.dictionaries.files.read_tensors in 0.6.0; the old path goes in 0.7",
        DeprecationWarning,
        stacklevel=2,
    )
    from interp.dictionaries.files import read_tensors

    return read_tensors
