"""Optional packages the suite needs (Ray, submitit): a test without one skips on a developer's
machine and fails on CI, where every test must run (nothing is skipped silently there)."""

from __future__ import annotations

import importlib
import os

import pytest

__all__ = ["required_in_ci", "require_module"]


def required_in_ci() -> bool:
    """Whether a missing optional package fails its tests instead of skipping them: on CI
    (``CI=true``, which GitHub Actions and ``.ci/run`` set), or with
    ``INTERP_REQUIRE_OPTIONAL=1``."""
    ci = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
    return ci or bool(os.environ.get("INTERP_REQUIRE_OPTIONAL"))


def require_module(name: str, extra: str):
    """``import name``; without it the calling test skips, or fails on CI
    (:func:`required_in_ci`), naming the extra that installs it."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        message = f"{name} is not installed ({err}); pip install -e '.[{extra}]'"
        if required_in_ci():
            pytest.fail(f"{message}: CI runs these tests and must not skip them", pytrace=False)
        pytest.skip(message)
