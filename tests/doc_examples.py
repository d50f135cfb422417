"""Extract the examples of a Markdown file and run them in order (used by test_docs_examples).

What counts as an example:

- every fenced block opened with ```python: Python, run as written;
- every fenced block opened with ```bash, ```sh, ```console or a bare ```: its lines that start
  with ``interp `` or ``python`` (after an optional ``$ `` prompt, continued over ``\\`` line
  ends) are shell commands, run with bash. Other lines of those blocks (program output,
  formulas, sketches) are not examples;
- a bare ``` block right after a Python block (nothing but blank lines between) with no
  command in it is that block's printed output: what the block prints must equal it, line by
  line (trailing spaces ignored).

A block is left out only when the line right before its fence (blank lines allowed between)
is one of these HTML comments, invisible on the rendered page:

- ``<!-- needs: gpt2-weights -->``: needs the real GPT-2 weights; reported as a skipped test
  with that reason, and run in order with the rest when the weights are in the local cache;
- ``<!-- not-run: REASON -->``: never run here; reported as a skipped test with REASON. For
  the README's environment set-up (a venv, pip), which CI runs itself.

The README's ``<!-- main-command -->`` and ``<!-- test-command -->`` (read by ``.ci/run``) mark
set-up blocks too: of their ``&&`` chains only the ``interp ...`` parts run here; creating a
venv and installing are what CI does before it runs the tests.

Run as a script (``python doc_examples.py STEPS.json``) it is the driver: every Python step
of one file executes in one shared namespace, shell steps run through bash in between, all in
the current directory; the first failure stops it with the document's line number.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import textwrap
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path

SHELL_LANGS = {"bash", "sh", "shell", "console", ""}
MARK = re.compile(r"^<!--\s*(needs|not-run):\s*(.+?)\s*-->$")
CI_MARKS = {"<!-- main-command -->", "<!-- test-command -->"}
KNOWN_NEEDS = {"gpt2-weights"}
COMMAND = re.compile(r"^(interp|python3?)(\s|$)")


@dataclass(frozen=True)
class Step:
    """One example: a Python block or one shell command, with where it is in its document."""

    kind: str  # "python" or "shell"
    code: str
    line: int  # 1-based line of the block's first code line in the document
    skip: str | None = None  # why it is not run ("needs: gpt2-weights", "not-run: ...")
    needs: str | None = None  # "gpt2-weights" for blocks that run when the weights exist
    output: str | None = None  # what a Python block must print, when the document shows it


def _mark_before(lines: list[str], fence: int) -> str | None:
    """The HTML comment on the last non-blank line before line index ``fence``, if any."""
    i = fence - 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    if i < 0:
        return None
    text = lines[i].strip()
    return text if text.startswith("<!--") and text.endswith("-->") else None


def _shell_commands(body: list[str], first_line: int) -> list[tuple[int, str]]:
    """(line, command) for each ``interp``/``python`` command of a shell-like block."""
    commands, i = [], 0
    while i < len(body):
        line, start = body[i].strip(), first_line + i
        if line.startswith("$ "):
            line = line[2:].lstrip()
        i += 1
        if not COMMAND.match(line):
            continue
        while line.endswith("\\") and i < len(body):
            line = line[:-1] + " " + body[i].strip()
            i += 1
        commands.append((start, line))
    return commands


def _set_up_interp_parts(command: str) -> str | None:
    """The ``interp ...`` parts of a set-up ``&&`` chain, joined again; None if there are none."""
    parts = [p.strip() for p in command.split("&&")]
    parts = [p for p in parts if p.startswith("interp ")]
    return " && ".join(parts) or None


def extract(path: Path) -> list[Step]:
    """Every example of one Markdown file, in document order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    steps: list[Step] = []
    i = 0
    last_python_end = None  # line index of the closing fence of the last Python block
    while i < len(lines):
        opening = lines[i].strip()
        if not opening.startswith("```"):
            i += 1
            continue
        lang = opening[3:].strip().lower()
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            raise ValueError(f"{path.name}:{i + 1}: fenced block is never closed")
        # a block indented inside a list item: its code starts at the fence's indentation
        body = textwrap.dedent("\n".join(lines[i + 1 : end])).split("\n")
        first = i + 2
        mark = _mark_before(lines, i)
        skip = needs = None
        set_up = mark in CI_MARKS
        if mark and not set_up:
            found = MARK.match(mark)
            if found is None:
                pass  # an ordinary comment, not a mark
            elif found[1] == "needs":
                if found[2] not in KNOWN_NEEDS:
                    raise ValueError(
                        f"{path.name}:{i}: unknown mark {mark!r}; known: {sorted(KNOWN_NEEDS)}"
                    )
                needs, skip = found[2], f"needs: {found[2]}"
            else:
                skip = f"not-run: {found[2]}"
        after_python = (
            lang == ""
            and steps
            and steps[-1].kind == "python"
            and steps[-1].output is None
            and last_python_end is not None
            and all(not line.strip() for line in lines[last_python_end + 1 : i])
        )
        if lang == "python":
            steps.append(Step("python", "\n".join(body) + "\n", first, skip, needs))
            last_python_end = end
        elif after_python and not _shell_commands(body, first):
            steps[-1] = replace(steps[-1], output="\n".join(body))
        elif lang in SHELL_LANGS:
            for line, command in _shell_commands(body, first):
                if set_up:
                    steps.append(
                        Step(
                            "shell",
                            command,
                            line,
                            skip="not-run: set-up (a venv and pip; CI runs it)",
                        )
                    )
                    command = _set_up_interp_parts(command)
                    if command is None:
                        continue
                steps.append(Step("shell", command, line, skip, needs))
        i = end + 1
    return steps


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip("\n").splitlines()]


def run_steps(steps: list[dict], doc: str) -> int:
    """Run the steps in order in the current directory; 1 at the first failure."""
    namespace: dict = {"__name__": "__main__"}
    for step in steps:
        where = f"{doc}:{step['line']}"
        _say(f"--- {where} ({step['kind']})")
        if step["kind"] == "python":
            printed = io.StringIO()
            try:
                with contextlib.redirect_stdout(printed):
                    exec(compile(step["code"], where, "exec"), namespace)  # noqa: S102
            except BaseException:
                _say(printed.getvalue().rstrip())
                traceback.print_exc()
                _say(f"FAILED: the Python block at {where}")
                return 1
            _say(printed.getvalue().rstrip())
            if step["output"] is not None and _lines(printed.getvalue()) != _lines(step["output"]):
                _say(
                    f"FAILED: the Python block at {where} printed the above; the document "
                    f"shows:\n{step['output']}"
                )
                return 1
        else:
            done = subprocess.run(
                ["bash", "-c", "set -e -o pipefail\n" + step["code"]], stdin=subprocess.DEVNULL
            )
            if done.returncode != 0:
                _say(f"FAILED: `{step['code']}` at {where} exited with {done.returncode}")
                return 1
    return 0


def to_json(steps: list[Step]) -> str:
    return json.dumps([asdict(s) for s in steps])


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    sys.exit(run_steps(spec["steps"], spec["doc"]))
