"""Module doors, written once: a package's public names looked up in their modules on first use
(``import interp.stores`` loads no torch), and the old paths of moved names, which still work
for one release and say where the name went (a ``DeprecationWarning`` at the caller's line)."""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable

__all__ = ["exports", "lazy_exports", "lazy_package", "moved", "warn_moved_module"]

SINCE = "0.6.0"  # the release that moved the names still served from their old paths
UNTIL = "0.7.0"  # the release that removes those old paths


def _missing(module: str, name: str) -> AttributeError:
    return AttributeError(f"module {module!r} has no attribute {name!r}")


def exports(package: str, modules: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """A door's table, name -> the module that defines it, from each module and the names it
    gives (a module written ``.x`` is ``package.x``; each module written once, not once a name).
    A name given by two modules is refused."""
    table: dict[str, str] = {}
    for module, names in modules.items():
        home = package + module if module.startswith(".") else module
        for name in names:
            if name in table:
                raise ValueError(f"{package}: {name!r} is given by {table[name]} and {home}")
            table[name] = home
    return table


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: each name of ``exports`` (name -> the module
    that defines it) imported from its module when first asked for, then kept in the package."""

    def __getattr__(name: str):
        if name not in exports:
            raise _missing(package, name)
        value = getattr(importlib.import_module(exports[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


def lazy_package(
    package: str, exports: dict[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__``: :func:`lazy_exports`, and a listing that
    shows the names not yet imported.

    A door (``interp.graphs``, ``interp.saes``, ...) is then::

        _EXPORTS = exports(__name__, {".attribute": ("attribution_graph",), ...})
        __all__ = sorted(_EXPORTS)
        __getattr__, __dir__ = lazy_package(__name__, _EXPORTS)

    (``interp`` itself keeps its own: it sits on the foundation's floor and imports nothing.)
    """

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return lazy_exports(package, exports), __dir__


def moved(module: str, names: dict[str, str], *, until: str = UNTIL) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``module`` serving the old paths of moved or renamed names:
    ``names`` maps an old name to its new home, ``"package.module:new_name"``. Asking for an old
    name warns (``DeprecationWarning`` at the caller's line: old path, new path, when the old
    one goes) and gives the object itself, imported from its new home.

    For example ``__getattr__ = moved(__name__, {"Graph": "interp.discovery.graph:EdgeGraph"})``.
    """
    for old, target in names.items():
        if target.count(":") != 1:
            raise ValueError(f"{module}.{old}: new home {target!r} is not 'package.module:name'")

    def __getattr__(name: str):
        if name not in names:
            raise _missing(module, name)
        home, new = names[name].split(":")
        verb = "is now" if home == module else "moved to"  # a rename in place
        warnings.warn(
            f"{module}.{name} {verb} {home}.{new} (since {SINCE}); the old path goes in {until}",
            DeprecationWarning,
            stacklevel=2,  # the line that asked for the old name
        )
        return getattr(importlib.import_module(home), new)

    return __getattr__


def warn_moved_module(module: str, where: str, *, until: str = UNTIL) -> None:
    """Called at the top of a deprecated module: importing it warns (``DeprecationWarning`` at
    the importer's line) that ``module`` goes in ``until`` and ``where`` its names are now."""
    warnings.warn(
        f"{module} is deprecated and goes in {until}: {where}",
        DeprecationWarning,
        stacklevel=3,  # past this function and the module's own line: the importing line
    )
