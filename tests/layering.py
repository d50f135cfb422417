"""Read a package's imports from its source (ast) and check them against a layering.

Used by tests/test_architecture.py on ``interp`` and, to prove the checks can fail, on small
packages the tests write. Every ``import`` counts, also inside functions and under
``TYPE_CHECKING``: an import moved into a function to dodge a circle is still a circle.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

LAYERS_BLOCK = re.compile(r"```layers\n(.*?)```", re.S)
OLD_PATHS = "old paths"  # the layers block's line of deprecated modules kept one release


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under the package directory ``root``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _owner(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``from pkg import sub`` is ``pkg.sub``)."""
    top = next(iter(mods)).split(".")[0]
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                wanted = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                wanted = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names
                ]
            else:
                continue
            for target in wanted:
                if target.split(".")[0] == top:
                    owner = _owner(target, mods)
                    if owner and owner != name:
                        targets.add(owner)
        edges[name] = targets
    return edges


def read_layers(markdown: str) -> list[tuple[str, list[str]]]:
    """``[(layer name, module patterns)]`` bottom to top from the ```` ```layers ```` block: one
    line per layer, ``N name: pattern pattern ...`` (``fnmatch`` patterns; ``reference`` is the
    island that may import only itself; ``old paths`` names deprecated modules, each a re-export
    of names that moved, which may import anything and which nothing may import)."""
    match = LAYERS_BLOCK.search(markdown)
    if not match:
        raise ValueError("no ```layers block found")
    layers = []
    for line in match.group(1).strip().splitlines():
        label, _, patterns = line.partition(":")
        layers.append((label.strip(), patterns.split()))
    return layers


def layer_of(module: str, layers: list[tuple[str, list[str]]]) -> tuple[int, str] | None:
    """``(index, layer name)`` of the most specific pattern matching ``module`` (an exact name
    beats a wildcard, a longer pattern a shorter one); None when no pattern matches."""
    best = None
    for index, (label, patterns) in enumerate(layers):
        for pattern in patterns:
            if fnmatch.fnmatchcase(module, pattern):
                rank = (pattern == module, len(pattern))
                if best is None or rank > best[0]:
                    best = (rank, index, label)
    return None if best is None else (best[1], best[2])


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def violations(
    edges: dict[str, set[str]], layers: list[tuple[str, list[str]]], island: str = "reference"
) -> list[str]:
    """One line per module without a layer and per import that points up a layer (or into or
    out of the island), naming both modules and their layers."""
    problems = []
    for module in sorted(edges):
        if layer_of(module, layers) is None:
            problems.append(f"{module} is in no layer of docs/architecture.md")
    for module in sorted(edges):
        own = layer_of(module, layers)
        for target in sorted(edges[module]):
            other = layer_of(target, layers)
            if own is None or other is None or own[1] == OLD_PATHS:
                continue
            if other[1] == OLD_PATHS:
                problems.append(
                    f"{module} imports {target}, an old path kept for users: import its new home"
                )
                continue
            crossing = (own[1] == island) != (other[1] == island)
            if crossing or (own[1] != island and other[0] > own[0]):
                problems.append(
                    f"{module} ({own[1]}) imports {target} ({other[1]}): imports "
                    "point down the layers"
                )
    return problems


def folder_of(module: str) -> str:
    """``interp.X`` for any module under the folder ``interp/X`` (``interp`` for the package)."""
    return ".".join(module.split(".")[:2])


def folder_imports(
    edges: dict[str, set[str]], layers: list[tuple[str, list[str]]]
) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """Folder -> folder it imports -> the (module, module) imports that make the edge, read
    from the module imports (old paths left out: they point wherever their names went)."""
    old = {m for m in edges if (layer_of(m, layers) or (0, ""))[1] == OLD_PATHS}
    folders: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for module, targets in edges.items():
        if module in old:
            continue
        own = folders.setdefault(folder_of(module), {})
        for target in sorted(targets):
            if folder_of(target) != folder_of(module):
                own.setdefault(folder_of(target), []).append((module, target))
    return folders


def folder_violations(
    folders: dict[str, dict[str, list[tuple[str, str]]]], layers: list[tuple[str, list[str]]]
) -> list[str]:
    """One line per folder that imports a folder of its own layer (tier) or a higher one,
    naming one module import that does it: across folders, imports point strictly down."""
    problems = []
    for folder in sorted(folders):
        own = layer_of(folder, layers)
        for target, pairs in sorted(folders[folder].items()):
            other = layer_of(target, layers)
            if own and other and other[0] >= own[0]:
                a, b = pairs[0]
                problems.append(
                    f"{folder} ({own[1]}) imports {target} ({other[1]}), e.g. {a} imports {b}: "
                    "a folder imports only folders of lower tiers"
                )
    return problems
