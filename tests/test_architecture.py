"""The house holds: imports point down the layers of docs/architecture.md, never in a circle,
read module by module and folder by folder, and no library file is over 400 lines
(tests/layering.py reads the imports)."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.layering import (
    OLD_PATHS,
    cycles,
    folder_imports,
    folder_violations,
    imports,
    layer_of,
    modules,
    read_layers,
    violations,
)

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400  # a file to read in one sitting (the aim is 300)
MAX_FUNCTION_LINES = 80  # a function to read on one screen: plan, work, assembly apart


@pytest.fixture(scope="module")
def graph():
    return imports(modules(ROOT / "interp"))


@pytest.fixture(scope="module")
def layers():
    return read_layers((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))


def test_no_import_circles(graph):
    found = cycles(graph)
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_imports_point_down_the_layers(graph, layers):
    problems = violations(graph, layers)
    assert not problems, "\n".join(problems)


def test_no_folder_circles(graph, layers):
    """Read folder by folder (``interp.X``), the imports form no circle: two folders of one
    tier may import each other's modules without a module circle, and this catches it."""
    folders = folder_imports(graph, layers)
    found = cycles({f: set(targets) for f, targets in folders.items()})
    assert not found, "folder circles: " + "; ".join(
        " <-> ".join(c) + " (" + ", ".join(
            f"{a} imports {b}" for f in c for t in c if t in folders.get(f, {})
            for a, b in folders[f][t][:1]
        ) + ")"
        for c in found
    )  # fmt: skip


def test_no_folder_imports_one_above_it_or_beside_it(graph, layers):
    """Across folders, imports point strictly down: a folder imports folders of lower tiers
    (floors) only, never one of its own tier."""
    problems = folder_violations(folder_imports(graph, layers), layers)
    assert not problems, "\n".join(problems)


def test_no_library_file_is_over_400_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "interp").rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"split these by concern: {long}"


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``file:function:length`` for every function (methods and nested ones too) under ``root``
    longer than ``limit`` lines, counted from ``def`` to its last line as ast's
    ``lineno``/``end_lineno`` do (docstring included, decorators not)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.name}:{length}")
    return found


def test_no_library_function_is_over_80_lines():
    long = long_functions(ROOT / "interp")
    assert not long, "split these into named steps: " + ", ".join(long)


def test_a_planted_long_function_is_named_with_its_length(tmp_path):
    lines = [f"x{i} = {i}" for i in range(80)]
    short = "def short():\n" + "".join(f"    {line}\n" for line in lines[:79])  # 80 lines
    long = "class C:\n    def long(self):\n" + "".join(f"        {line}\n" for line in lines)
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": short, "pkg/b.py": long})
    assert long_functions(tmp_path / "pkg") == ["pkg/b.py:long:81"]


def test_the_reference_model_imports_nothing_of_interp(graph):
    outside = {
        m: sorted(t for t in targets if not t.startswith("interp.reference"))
        for m, targets in graph.items()
        if m.startswith("interp.reference")
    }
    assert not any(outside.values()), outside


def test_the_layers_place_what_the_docs_say(layers):
    assert layer_of("interp.pages.induction", layers)[1] == "4 presentation"
    assert layer_of("interp.induction.scores", layers)[1] == "3c first analyses"
    assert layer_of("interp.dictionaries", layers)[0] < min(
        layer_of(f"interp.{f}", layers)[0]
        for f in ("tasks", "stores", "circuits", "interventions", "saes", "attribution", "graphs")
    )  # the dictionary core is the bottom of the analyses
    assert layer_of("interp.engine.cache", layers)[1] == "2 engine"
    assert layer_of("interp.nowhere", layers) is None


# the package of each layer but the analyses (one package per analysis)
LAYER_PACKAGES = {
    "0 foundation": ["foundation"],
    "1 model access": ["models"],
    "2 engine": ["engine"],
    "4 presentation": ["pages"],
    "5 command line": ["cli"],
    "reference": ["reference"],
}


def test_folders_are_the_layers(layers):
    """Every layer is whole packages (``interp.X`` and ``interp.X.*``), one package for each
    layer but the analyses, and no module lies loose beside them: ``ls interp/`` shows the
    layers."""
    for name, patterns in layers:
        if name == OLD_PATHS:
            continue
        packages = [p.split(".")[1] for p in patterns if p != "interp" and not p.endswith(".*")]
        assert sorted(patterns) == sorted(
            (["interp"] if name.startswith("0 ") else [])
            + [f"interp.{p}" for p in packages]
            + [f"interp.{p}.*" for p in packages]
        ), f"layer {name} is not whole packages: {patterns}"
        if name in LAYER_PACKAGES:
            assert packages == LAYER_PACKAGES[name], (name, packages)
        else:  # the analyses' tiers, 3a lowest
            assert re.fullmatch(r"3[a-z] .+", name), name
    loose = sorted(p.name for p in (ROOT / "interp").glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules outside the layers' folders: {loose}"


# ---- the checks can fail: a small package with a circle and an upward import ----

LAYERS = """```layers
0 base: pkg pkg.low
1 engine: pkg.engine pkg.engine.*
2 top: pkg.top
reference: pkg.ref
```"""


def _write(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return modules(root / "pkg")


def test_a_planted_circle_is_found_even_inside_a_function(tmp_path):
    mods = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/engine/__init__.py": "",
            "pkg/engine/a.py": "from pkg.engine import b\n",
            "pkg/engine/b.py": "def f():\n    from . import a\n",
            "pkg/low.py": "",
        },
    )
    assert cycles(imports(mods)) == [["pkg.engine.a", "pkg.engine.b"]]


def test_a_planted_upward_import_is_named_with_both_modules(tmp_path):
    mods = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import top\n"
            ),
            "pkg/top.py": "",
            "pkg/ref.py": "from pkg.low import x\n",
            "pkg/stray.py": "",
        },
    )
    problems = violations(imports(mods), read_layers(LAYERS))
    assert problems == [
        "pkg.stray is in no layer of docs/architecture.md",
        "pkg.low (0 base) imports pkg.top (2 top): imports point down the layers",
        "pkg.ref (reference) imports pkg.low (0 base): imports point down the layers",
    ]
    assert not cycles(imports(mods))


def test_a_planted_folder_circle_is_found_through_relative_and_inner_imports(tmp_path):
    """``pkg.a`` and ``pkg.b`` sit in one tier and their modules form no circle, yet the
    folders import each other (a relative import one way, an in-function one the other)."""
    mods = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a/__init__.py": "",
            "pkg/a/x.py": "from ..b import y\n",
            "pkg/a/z.py": "",
            "pkg/b/__init__.py": "",
            "pkg/b/y.py": "",
            "pkg/b/w.py": "def f():\n    from pkg.a import z\n",
        },
    )
    edges = imports(mods)
    assert not cycles(edges)
    tiers = read_layers("```layers\n3a low: pkg pkg.a pkg.a.* pkg.b pkg.b.*\n```")
    folders = folder_imports(edges, tiers)
    assert cycles({f: set(t) for f, t in folders.items()}) == [["pkg.a", "pkg.b"]]
    same = "a folder imports only folders of lower tiers"
    assert folder_violations(folders, tiers) == [  # one tier: neither way is down
        f"pkg.a (3a low) imports pkg.b (3a low), e.g. pkg.a.x imports pkg.b.y: {same}",
        f"pkg.b (3a low) imports pkg.a (3a low), e.g. pkg.b.w imports pkg.a.z: {same}",
    ]
    tiers = read_layers("```layers\n3a low: pkg pkg.a pkg.a.*\n3b high: pkg.b pkg.b.*\n```")
    assert folder_violations(folder_imports(edges, tiers), tiers) == [
        f"pkg.a (3a low) imports pkg.b (3b high), e.g. pkg.a.x imports pkg.b.y: {same}"
    ]


def test_an_old_path_is_left_out_of_the_folders_and_may_not_be_imported(tmp_path):
    mods = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low.py": "from pkg.old import x\n",
            "pkg/top.py": "",
            "pkg/old.py": "from pkg.top import x\n",
            "pkg/ref.py": "",
        },
    )
    layered = read_layers(LAYERS.removesuffix("```") + "old paths: pkg.old\n```")
    edges = imports(mods)
    assert violations(edges, layered) == [
        "pkg.low imports pkg.old, an old path kept for users: import its new home"
    ]
    assert "pkg.old" not in folder_imports(edges, layered)


def test_every_old_path_says_it_is_deprecated(layers):
    """The old-paths line and the modules that mark themselves ``__deprecated__`` agree (the
    API reference leaves those out; tests/test_deprecated_paths.py imports each)."""
    marked = set()
    for name, path in modules(ROOT / "interp").items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__deprecated__" for t in node.targets
            ):
                marked.add(name)
    listed = dict(layers).get(OLD_PATHS, [])  # none while no move is pending
    assert marked == set(listed), (marked, listed)


DOORS = ("interp.saes", "interp.graphs", "interp.transcoders", "interp.stores")  # lazy doors


def test_the_lazy_doors_load_nothing_until_asked_and_give_every_name():
    """``import interp.saes`` (graphs, transcoders, stores) imports no torch; each name of the
    door's ``__all__`` is then the object its module defines."""
    code = f"import sys\nimport {', '.join(DOORS)}\nassert 'torch' not in sys.modules, 'torch'"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    for door in DOORS:
        module = importlib.import_module(door)
        assert module.__all__, door
        for name in module.__all__:
            home = importlib.import_module(module._EXPORTS[name])
            assert getattr(module, name) is getattr(home, name), (door, name)
        with pytest.raises(AttributeError, match="no_such_name"):
            module.no_such_name  # noqa: B018
