"""The peers' environments for experiments/parity.py: one virtual environment per peer library,
made (or reused) under a cache folder, or a Python given for it.

Each peer needs what interp does not run with (circuit-tracer and SAELens pin TransformerLens
< 4), so each gets its own venv: ``python -m venv``, then ``pip install`` of torch at interp's own
version first, then the peer's requirements with torch pinned again (nnsight, which
dictionary-learning needs, asks for torchvision, whose newest release would pull a newer torch
with every CUDA library). A finished venv holds ``interp-parity.json`` with what was installed; a
venv whose file is missing or names other requirements is made again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PEERS", "Peer", "ensure_env", "peer_versions", "plain_env"]

MARKER = "interp-parity.json"


@dataclass(frozen=True)
class Peer:
    name: str  # as the command line and the table name it
    requirements: tuple[str, ...]  # pip requirements, installed after torch
    module: str  # imported to check a Python given for the peer
    dists: tuple[str, ...]  # distributions whose versions the report names
    env_var: str  # the environment variable that gives a ready Python
    remove: tuple[str, ...] = ()  # distributions uninstalled after the install (see PEERS)


PEERS = {
    p.name: p
    for p in (
        Peer("circuit-tracer", ("circuit-tracer==0.5.0", "transformer-lens<4"), "circuit_tracer",
             ("circuit-tracer", "transformer-lens"), "INTERP_CIRCUIT_TRACER_PYTHON"),
        Peer("saelens", ("sae-lens>=6,<7", "transformer-lens<4"), "sae_lens",
             ("sae-lens", "transformer-lens"), "INTERP_SAELENS_PYTHON"),
        # EleutherAI's sparsify is eai-sparsify on PyPI (PyPI's "sparsify" is another project)
        Peer("sparsify", ("eai-sparsify==1.3.3",), "sparsify", ("eai-sparsify",),
             "INTERP_SPARSIFY_PYTHON"),
        # nnsight 0.3 (dictionary-learning's) requires torchvision but never imports it; PyPI's
        # torchvision is built for PyPI's CUDA torch, whose operators a CPU torch lacks, and
        # transformers imports it when it is there: "operator torchvision::nms does not exist"
        Peer("dictionary_learning", ("dictionary-learning==0.1.0",), "dictionary_learning",
             ("dictionary-learning",), "INTERP_DICTIONARY_LEARNING_PYTHON",
             remove=("torchvision",)),
    )
}  # fmt: skip


def plain_env() -> dict[str, str]:
    """This process's environment without its venv and ``PYTHONPATH`` (for a peer's Python)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _python(folder: Path) -> Path:
    return folder / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_env(peer: Peer, envs: Path, torch_req: str, log: Path) -> Path:
    """The Python of ``envs/peer.name``, made with torch and the peer's requirements unless a
    finished one is there; raises ``RuntimeError`` (the env removed) when pip fails."""
    folder = envs / peer.name
    want = {"torch": torch_req, "requirements": list(peer.requirements),
            "removed": list(peer.remove)}  # fmt: skip
    marker = folder / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == want and _python(folder).exists():
        return _python(folder)
    if folder.exists():  # an unfinished or outdated env of this cache: made again
        shutil.rmtree(folder)
    envs.mkdir(parents=True, exist_ok=True)
    steps = [
        [sys.executable, "-m", "venv", str(folder)],
        [str(_python(folder)), "-m", "pip", "install", "--disable-pip-version-check", torch_req],
        [str(_python(folder)), "-m", "pip", "install", "--disable-pip-version-check", torch_req,
         *peer.requirements],
    ] + ([[str(_python(folder)), "-m", "pip", "uninstall", "--yes", *peer.remove]]
         if peer.remove else [])  # fmt: skip
    with log.open("a") as out:
        for cmd in steps:
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=plain_env())
            if done.returncode:
                shutil.rmtree(folder, ignore_errors=True)
                what = f"pip {' '.join(cmd[3:])}" if "pip" in cmd else "python -m venv"
                raise RuntimeError(f"{what} failed (exit {done.returncode}; see {log})")
    marker.write_text(json.dumps(want))
    return _python(folder)


def peer_versions(peer: Peer, python: str) -> dict[str, str]:
    """``{distribution: version}`` of the peer, TransformerLens and torch in ``python``;
    raises ``RuntimeError`` when that Python cannot import the peer."""
    code = (
        f"import importlib.metadata as m, json, {peer.module}\n"
        f"print(json.dumps({{d: m.version(d) for d in {[*peer.dists, 'torch']!r}}}))"
    )
    done = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, env=plain_env(), cwd="/"
    )
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{python} cannot import {peer.module}: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])
