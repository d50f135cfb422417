"""Deprecated: :func:`interp.dictionaries.files.read_tensors` reads SAE and transcoder files
alike since 0.6.0; ``read_safetensors`` keeps working until 0.7 with a DeprecationWarning."""

from __future__ import annotations

from interp.foundation.doors import moved_names

__deprecated__ = "use interp.dictionaries.files.read_tensors; this path goes in 0.7.0"


__getattr__ = moved_names(__name__, {"read_safetensors": "interp.dictionaries.files.read_tensors"})
