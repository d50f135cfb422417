"""Start-up time of the ``interp`` command, measured from outside, side by side.

Each case is a fresh interpreter (``python -m interp.cli ...``, what the ``interp`` script
runs), timed from spawn to exit; cases run interleaved (A B C ... A B C ...) after one
warm-up each, and the best of ``--repeat`` is kept, so that other work on the machine hits
every case alike and the figure is the import cost, not the noise. Beside them: an empty
interpreter (``python -c pass``), ``import torch`` alone, and a real command on the bundled
model (all the imports, then under a second of work); each case also as a ratio to
``import torch``.

Target (issue: start-up): ``--help``, ``COMMAND --help`` and every refused command line
(exit code 2) take <= 1 s, far below ``import torch``; only a command that runs its work
imports torch and TransformerLens.

    python benchmarks/bench_startup.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cases(scratch: Path) -> dict[str, tuple[list[str], int]]:
    """name -> (arguments of ``python``, the exit code the case must end with)."""
    cli = ["-m", "interp.cli"]
    return {
        "python -c pass": (["-c", "pass"], 0),
        "import torch": (["-c", "import torch"], 0),
        "interp --help": ([*cli, "--help"], 0),
        "interp patch --help": ([*cli, "patch", "--help"], 0),
        "refused by argparse (--max-bytes 5XB)": (
            [*cli, "induction", "--max-bytes", "5XB", "--out", str(scratch / "o")],
            2,
        ),
        "refused after parsing (--prompt '')": (
            [*cli, "attribute", "--prompt", "", "--answer", " c", "--out", str(scratch / "o")],
            2,
        ),
        "interp models": ([*cli, "models"], 0),
        "missing --model folder (exit 1)": (
            [
                *cli,
                "circuits",
                "--model",
                str(scratch / "no-such-model"),
                "--out",
                str(scratch / "o"),
            ],
            1,
        ),
        "interp circuits on tiny-induction": (
            [
                *cli,
                "circuits",
                "--baseline-samples",
                "2",
                "--no-report",
                "--out",
                str(scratch / "circuits"),
            ],
            0,
        ),
    }


def run_once(argv: list[str], expected: int, env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *argv], env=env, cwd=ROOT, capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - start
    if done.returncode != expected:
        raise RuntimeError(
            f"{argv} exited {done.returncode}, expected {expected}:\n{done.stderr[-2000:]}"
        )
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per case (best kept)")
    args = parser.parse_args()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    with tempfile.TemporaryDirectory(prefix="interp-bench-startup-") as scratch:
        todo = cases(Path(scratch))
        for argv, expected in todo.values():  # warm-up: the file cache, .pyc files
            run_once(argv, expected, env)
        times: dict[str, list[float]] = {name: [] for name in todo}
        for _ in range(args.repeat):
            for name, (argv, expected) in todo.items():
                times[name].append(run_once(argv, expected, env))
    best = {name: min(values) for name, values in times.items()}
    torch_s = best["import torch"]
    width = max(map(len, best))
    print(
        f"best of {args.repeat}, seconds (python {sys.version.split()[0]}, {os.cpu_count()} CPUs)"
    )
    print(f"{'case':<{width}}  {'best s':>7}  {'/ import torch':>14}")
    for name, seconds in best.items():
        print(f"{name:<{width}}  {seconds:7.3f}  {seconds / torch_s:14.2f}")


if __name__ == "__main__":
    main()
