"""Deprecated: moved to :mod:`interp.dictionaries.data` in 0.6.0 (token rows and activations
serve SAEs, transcoders, graphs and stores alike). The old names keep working until 0.7, each
with a DeprecationWarning."""

from __future__ import annotations

from interp.foundation.doors import moved_names

__deprecated__ = "use interp.dictionaries.data; this path goes in 0.7.0"

_MOVED = ("SKIP_DIRS", "TokenRows", "activations_at", "repeated_random_tokens", "stdlib_sources")


__getattr__ = moved_names(__name__, {name: f"interp.dictionaries.data.{name}" for name in _MOVED})
