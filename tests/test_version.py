"""The version says what the package is: ``interp.__version__`` is pyproject's version, and
CHANGELOG.md has a section for it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import interp

ROOT = Path(__file__).resolve().parents[1]


def test_version_is_pyprojects_and_the_changelog_has_it():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert interp.__version__ == project["version"]
    headings = re.findall(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert headings[0] == interp.__version__, headings
