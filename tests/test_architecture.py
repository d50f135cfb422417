"""The house holds: imports point down the layers of docs/architecture.md, never in a circle,
and no library file is over 400 lines (tests/layering.py reads the imports)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.layering import cycles, imports, layer_of, modules, read_layers, violations

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
    assert layer_of("interp.induction.scores", layers)[1] == "3 analyses"
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
        packages = [p.split(".")[1] for p in patterns if p != "interp" and not p.endswith(".*")]
        assert sorted(patterns) == sorted(
            (["interp"] if name.startswith("0 ") else [])
            + [f"interp.{p}" for p in packages]
            + [f"interp.{p}.*" for p in packages]
        ), f"layer {name} is not whole packages: {patterns}"
        if name in LAYER_PACKAGES:
            assert packages == LAYER_PACKAGES[name], (name, packages)
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
