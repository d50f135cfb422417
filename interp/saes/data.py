"""Deprecated: moved to :mod:`interp.dictionaries.data` in 0.6.0 (token rows and activations
serve SAEs, transcoders, graphs and stores alike). The old names keep working until 0.7, each
with a DeprecationWarning."""

from __future__ import annotations

import warnings

__deprecated__ = "use interp.dictionaries.data; this path goes in 0.7.0"

_MOVED = ("SKIP_DIRS", "TokenRows", "activations_at", "repeated_random_tokens", "stdlib_sources")


def __getattr__(name: str):
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"interp.saes.data.{name} moved to interp.dictionaries.data.{name} in 0.6.0; the old "
        "path goes in 0.7",
        DeprecationWarning,
        stacklevel=2,
    )
    from interp.dictionaries import data

    return getattr(data, name)
