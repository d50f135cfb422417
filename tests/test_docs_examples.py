"""Every example in README.md and docs/*.md runs as written, in order, offline.

How (the rules are in ``tests/doc_examples.py``): per document, every ```python block and
every ``interp ...`` / ``python ...`` command of a shell block (```bash, ```sh, ```console or a
bare ```) runs in document order, in one fresh process whose working directory is a new
temporary folder (files the examples write land there), with ``HF_HUB_OFFLINE=1``. The Python
blocks of one document share one namespace, as in a notebook; where the document shows a
block's output (a bare block right after it), the block must print exactly that. ``interp``
and ``python`` in shell commands are this interpreter (``python -m interp.cli``) and this
checkout's package. The document's process and each ``interp`` command's are forked from a
warm server (``tests/fork_server.py``, docs/testing.md): fresh processes, their imports done.

Marks, an HTML comment on the line before a block (invisible on the rendered page); nothing
else leaves a block out, and every block left out is a skipped test below, with its reason:

- ``<!-- needs: gpt2-weights -->``: needs the real GPT-2 weights; runs when they are in the
  local Hugging Face cache, skipped otherwise;
- ``<!-- not-run: set-up -->``: the README's venv and pip commands, which CI itself runs
  (``.ci/run``). The README's ``<!-- main-command -->`` / ``<!-- test-command -->`` count as
  set-up too; the ``interp ...`` parts of their ``&&`` chains still run here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_examples import extract, to_json
from tests.forked import FORK_SERVER, served_env

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
DRIVER = Path(__file__).resolve().parent / "doc_examples.py"
TIMEOUT_S = 300

# documents whose examples are known to fail today, with why; strict: fixing them fails here
KNOWN_FAILING: dict[str, str] = {}


def _gpt2_cached() -> bool:
    from interp.models.loading import _hub_cached

    return _hub_cached("gpt2", "config.json")


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def doc_params():
    """Every document, a test each (tests/scheduling.py spreads them over the workers)."""
    params = []
    for path in DOCS:
        # whole documents, commands and all: 5-70 s each
        marks = [pytest.mark.slow]
        if _name(path) in KNOWN_FAILING:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_FAILING[_name(path)]))
        params.append(pytest.param(path, id=_name(path), marks=marks))
    return params


def _skipped_params():
    return [
        pytest.param(path, step, id=f"{_name(path)}:{step.line}")
        for path in DOCS
        for step in extract(path)
        if step.skip
    ]


def _interp_shim(folder: Path, fork_server: Path) -> Path:
    """A bin folder whose ``interp`` and ``python`` are this interpreter and this checkout;
    ``interp`` runs as a process forked from the fork server."""
    folder.mkdir()
    interp = f'"{FORK_SERVER}" call "{fork_server}" -m interp.cli "$@"'
    for name, args in (("interp", interp), ("python", '"$@"'), ("python3", '"$@"')):
        script = folder / name
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" {args}\n', encoding="utf-8")
        script.chmod(0o755)
    return folder


@pytest.mark.parametrize("path", doc_params())
def test_examples_run_as_written(path: Path, tmp_path: Path, fork_server: Path):
    run_examples(path, tmp_path, fork_server)


def run_examples(path: Path, tmp_path: Path, fork_server: Path) -> None:
    """Run one document's examples as written (the module docstring says how)."""
    weights = _gpt2_cached()
    steps = [s for s in extract(path) if s.skip is None or (s.needs == "gpt2-weights" and weights)]
    if not steps:
        pytest.skip(f"{_name(path)} has no runnable examples")
    work = tmp_path / "work"
    work.mkdir()
    spec = tmp_path / "steps.json"
    spec.write_text(
        json.dumps({"doc": _name(path), "steps": json.loads(to_json(steps))}), encoding="utf-8"
    )
    shims = _interp_shim(tmp_path / "bin", fork_server)
    env = served_env(PATH=os.pathsep.join([str(shims), os.environ.get("PATH", "")]))
    done = subprocess.run(
        [sys.executable, str(FORK_SERVER), "call", str(fork_server), str(DRIVER), str(spec)],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, f"an example of {_name(path)} failed:\n{done.stdout[-6000:]}"


@pytest.mark.parametrize("path, step", _skipped_params())
def test_marked_examples_are_reported(path: Path, step):
    if step.needs == "gpt2-weights" and _gpt2_cached():
        return  # it ran, in order, in test_examples_run_as_written
    pytest.skip(f"{_name(path)}:{step.line} {step.skip}")


def test_extraction_finds_the_examples(tmp_path: Path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "\n".join(
            [
                "text",
                "```python",
                "x = 1",
                "```",
                "```",
                "interp models",
                "output line",
                "$ python -c \\",
                "  'print(1)'",
                "```",
                "<!-- needs: gpt2-weights -->",
                "",
                "```python",
                "y = 2",
                "```",
                "<!-- test-command -->",
                "```bash",
                "python3 -m venv .venv && interp models",
                "```",
                "```text",
                "interp not a command here",
                "```",
            ]
        ),
        encoding="utf-8",
    )
    steps = extract(doc)
    assert [(s.kind, s.code, s.line, s.skip) for s in steps] == [
        ("python", "x = 1\n", 3, None),
        ("shell", "interp models", 6, None),
        ("shell", "python -c  'print(1)'", 8, None),
        ("python", "y = 2\n", 14, "needs: gpt2-weights"),
        (
            "shell",
            "python3 -m venv .venv && interp models",
            18,
            "not-run: set-up (a venv and pip; CI runs it)",
        ),
        ("shell", "interp models", 18, None),
    ]
    doc.write_text("```python\nprint(1)\n```\n\n```\n1\n```\ntext\n```\n2\n```\n", encoding="utf-8")
    assert [(s.kind, s.output) for s in extract(doc)] == [("python", "1")]
    doc.write_text("<!-- needs: llama -->\n```python\nz = 3\n```\n", encoding="utf-8")
    with pytest.raises(ValueError, match="unknown mark"):
        extract(doc)
