"""Ray and submitit are installed by CI and their tests never skip there: the README's test
command (which .ci/run runs) installs extras holding both, .ci/run sets CI=true, and under CI a
missing package fails the tests that need it instead of skipping them (tests/optional.py)."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

from tests.optional import require_module

ROOT = Path(__file__).resolve().parents[2]


def _readme_extras() -> set[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- test-command -->", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    found = re.search(r'pip install -e "\.\[([^\]]+)\]"', block)
    assert found, f"the README's test command installs no extras: {block.strip()}"
    return {e.strip() for e in found.group(1).split(",")}


def test_ci_installs_ray_and_submitit():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    extras = extras["project"]["optional-dependencies"]
    installed = {req for name in _readme_extras() for req in extras[name]}
    names = {re.split(r"[<>=!~\[ ]", req, maxsplit=1)[0] for req in installed}
    assert {"ray", "submitit"} <= names, sorted(names)
    assert "export CI=true" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


@pytest.mark.parametrize("ci", ["true", "1"])
def test_a_missing_package_fails_under_ci(monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(pytest.fail.Exception, match=r"ray is not installed .*\.\[ray\]"):
        require_module("ray", "ray")


def test_a_missing_package_skips_off_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("INTERP_REQUIRE_OPTIONAL", raising=False)
    monkeypatch.setitem(sys.modules, "submitit", None)
    with pytest.raises(pytest.skip.Exception, match=r"\.\[slurm\]"):
        require_module("submitit", "slurm")
