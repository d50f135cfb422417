"""Package doors that cost nothing to import: a public name is looked up in its module on first
use (``import interp.stores`` loads no torch); and old names kept one release after they moved,
each looked up in its new home with a DeprecationWarning (:func:`moved_names`)."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable

__all__ = ["lazy_exports", "moved_names"]


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: each name of ``exports`` (name -> the module
    that defines it) imported from its module when first asked for."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__


def moved_names(module: str, moved: dict[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``module``'s names that moved in 0.6.0 (old name -> its new
    home, ``"package.module.name"``): each warns (DeprecationWarning, naming the new home) and
    is the new home's; any other name is an AttributeError."""

    def __getattr__(name: str):
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} moved to {moved[name]} in 0.6.0; the old path goes in 0.7",
            DeprecationWarning,
            stacklevel=2,
        )
        home, _, new = moved[name].rpartition(".")
        return getattr(importlib.import_module(home), new)

    return __getattr__
