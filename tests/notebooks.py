"""Notebook helpers for the tests: strip outputs, execute from a clean kernel, convert to a
self-contained HTML page.

Strip the committed notebooks after editing them in Jupyter::

    python -m tests.notebooks docs/notebooks/*.ipynb
"""

from __future__ import annotations

import html
import json
import os
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "docs" / "notebooks"

# the page around nbconvert's "basic" fragment: nbconvert's full templates ("lab",
# "classic") load require.js, MathJax and mermaid from a CDN; the fragment has no script
PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
        max-width: 1150px; padding: 16px; color: #1f2328; }}
.jp-InputArea pre, .jp-OutputArea pre {{ background: #f6f8fa; padding: 6px; overflow: auto; }}
table {{ border-collapse: collapse; font-size: 0.85em; }}
th, td {{ border: 1px solid #d0d7de; padding: 2px 6px; }}
</style>
</head>
<body>
{body}
</body>
</html>
"""


def strip(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Remove outputs, execution counts and per-cell run metadata (in place)."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        for key in ("execution", "collapsed", "scrolled"):
            cell.metadata.pop(key, None)
    nb.metadata.pop("widgets", None)
    return nb


def execute(
    path: Path, *, timeout_s: int = 300, server: Path | None = None
) -> nbformat.NotebookNode:
    """Run the notebook at ``path`` top to bottom in a fresh ``python3`` kernel (ipykernel,
    started with this interpreter), its working directory the notebook's folder, this
    checkout's ``interp`` first on the path. With ``server`` (the ``fork_server`` fixture's
    socket), the kernel is a process forked from that warm server (tests/forked.py): fresh,
    its imports done. A failing cell raises ``nbclient.exceptions.CellExecutionError`` naming
    the cell."""
    import tempfile

    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    from tests.forked import python, served_env

    nb = nbformat.read(path, as_version=4)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as specs:
        manager = None
        if server is not None:  # a "python3" kernel spec whose kernel is forked from the server
            env = served_env()
            spec = Path(specs) / "python3"
            spec.mkdir()
            argv = python(server, "-m", "ipykernel_launcher", "-f", "{connection_file}")
            kernel = {"argv": argv, "display_name": "Python 3", "language": "python"}
            (spec / "kernel.json").write_text(json.dumps(kernel), encoding="utf-8")
            kernels = KernelSpecManager(kernel_dirs=[specs], ensure_native_kernel=False)
            manager = KernelManager(kernel_name="python3", kernel_spec_manager=kernels)
        client = NotebookClient(
            nb,
            km=manager,
            timeout=timeout_s,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
        )
        # the kernel inherits the environment given here (and jupyter_client starts "python"
        # in the kernel spec as sys.executable, this interpreter)
        try:
            client.execute(env=env)
        finally:  # nbclient shuts down only a kernel it started itself
            if manager is not None and manager.has_kernel:
                manager.shutdown_kernel(now=True)
                _gone(manager.connection_file, path.parent)
    return nb


def _gone(connection_file: str, folder: Path, wait_s: float = 10.0) -> None:
    """Wait until neither the kernel's caller (``connection_file`` in its command line) nor a
    process forked from the server in the notebook's ``folder`` (the kernel) runs; fail if one
    stays, as a leaked kernel would."""
    import time

    def ours(pid: Path) -> bool:
        try:
            cmdline = (pid / "cmdline").read_bytes()
            if connection_file.encode() in cmdline:
                return True
            return b"fork_server.py" in cmdline and (pid / "cwd").resolve() == folder.resolve()
        except OSError:
            return False  # ended while we looked

    deadline = time.monotonic() + wait_s
    while (left := [p.name for p in Path("/proc").glob("[0-9]*") if ours(p)]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert not left, f"kernel processes {left} outlived the notebook's run"


def to_html(nb: nbformat.NotebookNode, title: str) -> str:
    """The executed notebook as one page that loads nothing from the network."""
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter(template_name="basic").from_notebook_node(nb)
    return PAGE.format(title=html.escape(title), body=body)


def main(paths: list[str]) -> int:
    for name in paths:
        nb = nbformat.read(name, as_version=4)
        nbformat.write(strip(nb), name)
        print(f"stripped {name}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
