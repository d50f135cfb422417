"""benchmarks/bench_discovery.py --quick runs end to end on the CPU: every section prints, and
its checks of numbers (EAP against TransformerLens, rows split) pass; speed is not asserted."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


@pytest.mark.slow
def test_quick_benchmark_runs_and_its_scores_agree(fork_server):
    """The script as a process of its own (forked from the warm server: tests/forked.py)."""
    from tests.forked import python, served_env

    script = Path(__file__).parents[1] / "benchmarks" / "bench_discovery.py"
    done = subprocess.run(
        python(fork_server, str(script), "--quick"),
        capture_output=True,
        text=True,
        timeout=600,
        env=served_env(),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    for header in ("== eap:", "== exact edge patching:", "== acdc"):
        assert header in out, out
    assert "(target <= 1e-4): OK" in out, out  # our EAP equals TransformerLens's
    split = float(out.split("max |split - whole| = ")[1].split()[0])
    assert split < 1e-5, out
