"""The one helper behind every package door and every old path (``interp.foundation.doors``):
each door lists and gives its names without importing torch, and an old path warns at the
caller's line, naming the old path, the new one and the release that removes it."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest

from interp.foundation.doors import lazy_package, moved, warn_moved_module

ROOT = Path(__file__).resolve().parents[1]
DOORS = (  # every package door: lazy_package (the root package's own, importing nothing)
    "interp",
    "interp.dictionaries",
    "interp.discovery",
    "interp.foundation.executors",
    "interp.graphs",
    "interp.saes",
    "interp.stores",
    "interp.transcoders",
)


def test_importing_every_door_imports_no_torch():
    code = f"import sys\nimport {', '.join(DOORS)}\nassert 'torch' not in sys.modules, 'torch'"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("door", DOORS)
def test_a_door_lists_and_gives_every_name_of_its_modules(door):
    module = importlib.import_module(door)
    assert set(module.__all__) == set(module._EXPORTS) and set(module.__all__) <= set(dir(module))
    for name in module.__all__:
        home = importlib.import_module(module._EXPORTS[name])
        assert getattr(module, name) is getattr(home, name), name
    with pytest.raises(AttributeError, match=f"module '{door}' has no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018


def test_the_package_door_also_gives_its_subpackages():
    import interp

    assert interp.tasks is importlib.import_module("interp.tasks")
    with pytest.raises(AttributeError, match="_private"):
        interp._private  # noqa: B018


@pytest.fixture
def old_module(monkeypatch):
    """A module ``old.place`` whose ``__getattr__`` serves a rename in place and a move."""
    module = types.ModuleType("old.place")
    module.NEW = object()
    monkeypatch.setitem(sys.modules, "old.place", module)
    module.__getattr__ = moved(
        "old.place", {"OLD": "old.place:NEW", "path": "pathlib:Path"}, until="9.0"
    )
    return module


def test_an_old_name_warns_at_the_callers_line_and_gives_the_object(old_module):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        value = old_module.path
        renamed = old_module.OLD
    assert value is Path and renamed is old_module.NEW
    assert [w.category for w in caught] == [DeprecationWarning] * 2
    assert caught[0].filename == __file__ and caught[0].lineno == line
    assert str(caught[0].message) == (
        "old.place.path moved to pathlib.Path (since 0.6.0); the old path goes in 9.0"
    )
    assert str(caught[1].message).startswith("old.place.OLD is now old.place.NEW")
    with pytest.raises(AttributeError, match="module 'old.place' has no attribute 'other'"):
        old_module.other  # noqa: B018


def test_a_new_home_without_its_module_is_refused():
    with pytest.raises(ValueError, match="'NEW' is not 'package.module:name'"):
        moved("old.place", {"OLD": "NEW"})


def test_an_old_module_warns_at_the_importing_line(tmp_path, monkeypatch):
    (tmp_path / "old_mod.py").write_text(
        "from interp.foundation.doors import warn_moved_module\n"
        "warn_moved_module(__name__, 'import new_mod')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        import old_mod  # noqa: F401
    monkeypatch.delitem(sys.modules, "old_mod")
    assert len(caught) == 1 and caught[0].category is DeprecationWarning
    assert caught[0].filename == __file__ and caught[0].lineno == line
    assert str(caught[0].message) == "old_mod is deprecated and goes in 0.7.0: import new_mod"
    assert warn_moved_module.__module__ == "interp.foundation.doors"


def test_lazy_package_lists_names_not_yet_imported(monkeypatch):
    package = types.ModuleType("a_door")
    monkeypatch.setitem(sys.modules, "a_door", package)
    package.__getattr__, package.__dir__ = lazy_package("a_door", {"Path": "pathlib"})
    assert "Path" in package.__dir__() and "Path" not in vars(package)
    assert package.Path is Path and vars(package)["Path"] is Path  # kept after the first use
