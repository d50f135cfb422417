"""docs/api.md is current and complete, and every public name says what it is.

Public names: ``interp.__all__`` and the ``__all__`` of every module of the package
(``experiments/write_api_reference.py`` finds them and writes the page).
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api.md"

# public names another branch owns that still lack a docstring or comment; strict: once they
# have one, remove them here
UNDOCUMENTED_ELSEWHERE: dict[str, str] = {}
# public callables that still take a bare **kwargs; strict as above
BARE_KWARGS_ELSEWHERE: dict[str, str] = {}


def _writer():
    spec = importlib.util.spec_from_file_location(
        "write_api_reference", ROOT / "experiments" / "write_api_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def writer():
    return _writer()


@pytest.fixture(scope="module")
def public(writer):
    """(qualified name, module, name, object) for every public name of every module."""
    rows = []
    for module in writer.public_modules():
        for name in module.__all__:
            rows.append((f"{module.__name__}.{name}", module, name, getattr(module, name)))
    return rows


def test_api_reference_is_current(writer):
    assert API.read_text(encoding="utf-8") == writer.render(), (
        "docs/api.md is out of date: run python experiments/write_api_reference.py"
    )


def test_every_module_is_found(writer):
    names = {m.__name__ for m in writer.public_modules()}
    import interp

    # interp's own docstring names its modules; each must be in the reference
    named = set(re.findall(r"``(interp\.[a-z_.]+)``", interp.__doc__))
    assert named and named <= names, named - names
    assert {"interp", "interp.reference", "interp.pages.plotting", "interp.engine"} <= names


def test_every_public_name_is_in_its_section(writer):
    sections = {}
    current = None
    for line in API.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"^## `([\w.]+)`$", line)
        if heading:
            current = sections.setdefault(heading[1], set())
        entry = re.match(r"^- (?:class )?`(\w+)", line)
        if entry and current is not None:
            current.add(entry[1])
    for module in writer.public_modules():
        assert module.__name__ in sections, f"no section for {module.__name__} in docs/api.md"
        assert sections[module.__name__] == set(module.__all__), (
            f"{module.__name__}: docs/api.md lists {sorted(sections[module.__name__])}, "
            f"__all__ is {sorted(module.__all__)}"
        )
    import interp

    assert {"bundled_models", "ReferenceGPT2"} <= sections["interp"]
    assert sections["interp"] == set(interp.__all__)


def test_every_public_name_has_a_docstring_or_comment(writer, public):
    modules = writer.public_modules()
    missing = set()
    for qualified, module, name, obj in public:
        if writer.is_constant(obj):
            ok = writer.constant_comment(name, module, modules) is not None
        else:
            ok = writer.own_doc(obj) is not None
        if not ok:
            missing.add(qualified)
    assert missing <= set(UNDOCUMENTED_ELSEWHERE), (
        f"public names with no docstring (constants: no comment beside them): "
        f"{sorted(missing - set(UNDOCUMENTED_ELSEWHERE))}"
    )
    assert missing >= set(UNDOCUMENTED_ELSEWHERE), (
        f"now documented, remove from UNDOCUMENTED_ELSEWHERE: "
        f"{sorted(set(UNDOCUMENTED_ELSEWHERE) - missing)}"
    )


def test_public_signatures_spell_out_their_keywords(public):
    bare = set()
    for _qualified, _, _, obj in public:
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        try:
            params = inspect.signature(obj).parameters.values()
        except (TypeError, ValueError):
            continue
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            continue
        if any(p.kind is p.VAR_KEYWORD for p in params):
            bare.add(f"{obj.__module__}.{obj.__qualname__}")
    assert bare == set(BARE_KWARGS_ELSEWHERE), (
        f"public callables with a bare **kwargs: {sorted(bare)}; name the keyword arguments "
        f"(and remove fixed ones from BARE_KWARGS_ELSEWHERE)"
    )


def test_detect_induction_heads_takes_the_scan_keywords():
    from interp.induction import detect_induction_heads, run_induction_scan

    def keywords(fn):
        return [
            (p.name, p.default, p.annotation)
            for p in inspect.signature(fn).parameters.values()
            if p.kind is p.KEYWORD_ONLY
        ]

    assert keywords(detect_induction_heads) == keywords(run_induction_scan)
    assert [
        p.name
        for p in inspect.signature(detect_induction_heads).parameters.values()
        if p.kind is p.VAR_KEYWORD
    ] == []
