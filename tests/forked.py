"""The warm fork server (tests/fork_server.py) as the tests use it: the environment it serves,
and how a test runs ``python ARGS...`` as a process forked from it. The ``fork_server``
fixture (tests/conftest.py) starts one per worker; docs/testing.md says what a command run
there keeps of a fresh interpreter."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORK_SERVER = Path(__file__).resolve().parent / "fork_server.py"


def served_env(**extra: str) -> dict[str, str]:
    """The environment the server runs in, so the commands a test starts in it: a request
    whose environment differs (but for PATH and the like) runs in a fresh interpreter."""
    return dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        MPLBACKEND="Agg",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        **extra,
    )


def python(server: Path, *args: str) -> list[str]:
    """The argv that runs ``python ARGS...`` (``-m MODULE ...`` or ``SCRIPT ...``) forked from
    the server at ``server``; run it with :func:`served_env`."""
    return [sys.executable, str(FORK_SERVER), "call", str(server), *args]


def forked_workers(monkeypatch, server: Path) -> None:
    """Have the worker processes this test's executors start (``sys.executable -m ...``, the
    local executor's and submitit's) forked from the warm server at ``server``: its environment
    and its ``python`` shim (tests/fork_server.py). Each worker is still a process of its own
    that unpickles its job and loads the model from disk, with only the imports done (8-9 s of
    a fresh interpreter's 10); tests/executors/test_executors.py starts fresh ones."""
    from tests.fork_server import shim_path

    for key, value in served_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "executable", shim_path(str(server)))
