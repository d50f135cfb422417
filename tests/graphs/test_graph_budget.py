"""The graph build's memory estimate: its structure (fast: the parts it adds, what a
half-precision model on CPU adds per pass) and, slow, the peak a fresh process measures
against it (within 15%) and against ``max_bytes`` (at most 10% over)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from interp.graphs import budget, graph_plan
from interp.graphs.budget import estimate_graph_bytes

ROOT = Path(__file__).resolve().parents[2]
ESTIMATE_SPREAD = 0.15  # the bound: the estimate within 15% of the measured peak
BUDGET_SLACK = 0.10  # a run under max_bytes peaks at most 10% above it


def _model(dtype: torch.dtype, device: str = "cpu"):
    cfg = SimpleNamespace(d_model=128, n_heads=4, dtype=dtype, device=device)
    return SimpleNamespace(cfg=cfg)


TC = SimpleNamespace(n_layers=2, d_tc=512, kind="per-layer")


def _estimate(dtype, device="cpu", n_pos=32, cap=None, batch=64, n_active=400):
    return estimate_graph_bytes(_model(dtype, device), TC, n_pos, cap, batch, n_active=n_active)


def test_half_precision_on_cpu_adds_its_kernels_per_pass():
    # sqrt(passes): fitted to the kernels measured over 5 to 54 passes (budget._KERNELS)
    for batch in (64, 16, 1):
        passes = -(-10 // batch) + -(-400 // batch)  # the logits' passes, then the features'
        extra = _estimate(torch.bfloat16, "cpu", batch=batch) - _estimate(
            torch.bfloat16, "cuda", batch=batch
        )
        assert abs(extra - budget._KERNELS * passes**0.5) <= 1
    # float32 compiles no per-shape kernels: the same estimate on either device
    assert _estimate(torch.float32, "cpu") == _estimate(torch.float32, "cuda")


def test_one_copy_counts_mkl_buffers_per_thread():
    """On CPU the one-copy estimate counts MKL's matmul buffers once per thread: the
    attention transpose's [pos batch*d_head] operand up to _GEMM_K positions, and the rest."""

    def at(threads, n_pos=32, device="cpu"):
        return budget.graph_bytes(
            _model(torch.float32, device), TC, n_pos, n_active=400, keep=256, n_logits=10,
            batch=64, source_bytes=10**6, one_copy=True, threads=threads,
        )  # fmt: skip

    d_head = 128 // 4
    assert at(2) - at(1) == budget._GEMM_OTHER + 4 * 64 * d_head * 32
    assert at(8) - at(4) == 4 * (at(2) - at(1))
    # bounded by MKL's blocking: the same per thread at 512 and 2,048 positions
    grow = [at(2, n) - at(1, n) for n in (512, 2048)]
    assert grow[0] == grow[1] == budget._GEMM_OTHER + 4 * 64 * d_head * budget._GEMM_K
    assert at(None) == at(torch.get_num_threads())  # the build's own thread count
    assert at(1, device="cuda") == at(16, device="cuda")  # no MKL on a GPU


def test_the_estimate_grows_with_what_the_build_holds():
    f32, bf16 = torch.float32, torch.bfloat16
    # the frozen pass and attention at the model's item size: bfloat16 holds less at scale
    assert _estimate(bf16, n_pos=512, cap=256, n_active=5000) < _estimate(
        f32, n_pos=512, cap=256, n_active=5000
    )
    # attention's [batch head pos pos]: more than twice the bytes for twice the positions
    small, large = (_estimate(f32, n_pos=n, cap=256, n_active=10 * n) for n in (512, 1024))
    assert large > 2 * small
    # a cap keeps fewer rows; a smaller batch holds a smaller frozen pass
    assert _estimate(f32, n_active=20_000, cap=256) < _estimate(f32, n_active=20_000)
    assert _estimate(f32, n_pos=256, batch=8) < _estimate(f32, n_pos=256, batch=64)
    with pytest.raises(ValueError, match="at least 2 positions"):
        _estimate(f32, n_pos=1)


def test_max_bytes_keeps_the_headroom():
    """The estimate fills at most max_bytes less HEADROOM: the least a graph needs, plus the
    headroom, is the smallest budget accepted."""
    from interp.engine.plan import MemoryBudgetError

    model = _model(torch.float32)

    def plan(max_bytes):
        return graph_plan.plan_graph(
            model, TC, 64, n_active=800, n_logits=10, source_bytes=10**6, max_feature_nodes=256,
            batch_size=64, max_bytes=max_bytes, free=None, one_copy=True,
        )  # fmt: skip

    roomy = plan(10**9)
    least = budget.least_bytes(
        lambda b: budget.graph_bytes(model, TC, 64, n_active=800, keep=256, n_logits=10,
                                     batch=b, source_bytes=10**6, one_copy=True), 64,
    )  # fmt: skip
    assert roomy.batch == 64 and least < roomy.estimated_bytes
    # a budget the estimate at batch 64 fits, but not with the headroom: a smaller batch
    tight = plan(roomy.estimated_bytes + budget.HEADROOM - 1)
    assert tight.batch < 64 and tight.estimated_bytes <= roomy.estimated_bytes - 1
    assert plan(least + budget.HEADROOM).estimated_bytes == least
    with pytest.raises(MemoryBudgetError, match=f"needs at least {least + budget.HEADROOM} "):
        plan(least + budget.HEADROOM - 1)


def test_a_build_under_max_bytes_only_lowers_the_threshold(monkeypatch):
    """return_freed_memory sets glibc's mmap threshold once and afterwards only lowers it: a
    graph's FREED_AT after a run_cached budget's 1 MiB holds, and 1 MiB after it changes
    nothing."""
    from interp.engine import allocator

    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setattr(allocator, "_FREED_MEMORY_RETURNED", 0)
    if not allocator.return_freed_memory(2**20):
        pytest.skip("no glibc here")
    assert allocator._FREED_MEMORY_RETURNED == 2**20
    assert allocator.return_freed_memory(budget.FREED_AT)
    assert allocator._FREED_MEMORY_RETURNED == budget.FREED_AT < 2**20
    assert allocator.return_freed_memory(2**20)
    assert allocator._FREED_MEMORY_RETURNED == budget.FREED_AT


def _child(tmp_path, **spec) -> dict:
    spec = {"device": "cpu", "layers": 2, "d_model": 128, "d_tc": 512, "dir": str(tmp_path)} | spec
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_graph_memory.py"), "--child",
         json.dumps(spec)],
        capture_output=True, text=True, check=True, env=env,
    )  # fmt: skip
    return json.loads(out.stdout.split("RESULT ", 1)[1])


# from 16 positions (a 3.5 MiB peak) to sizes where a one-copy graph's peak (25-55 MB) stands
# well above a fresh process's noise, on one thread (as these tests' children run) and on two:
# MKL keeps matmul buffers per thread (0.4-0.7 MiB at 16 positions, budget._GEMM_OTHER), which
# the estimate counts by the thread count. Before it did, the smallest points missed: the
# 16-position bfloat16 estimate 1.17-1.21 of its peak on one thread, the 32-position capped
# float32 one 0.82-0.89 on two (docs/graphs.md, "Memory and scale")
# A graph of 16-32 positions peaks at 4-12 MiB, and glibc's heap layout moves that peak from one
# fresh process to the next: repeats of the per-layer float32 16-position point peaked at
# 3.8-4.4 MiB (its estimate 4.3: 0.97-1.13), the 32-position one at 7.3-8.7 MiB (docs/graphs.md,
# "Memory and scale"). There the peak is the median of REPEATS fresh processes, so that one
# process's layout does not decide the test; the bound is the same
NOISY_UP_TO = 32
REPEATS = 3
POINTS = [
    ("per-layer", "float32", 16, None, 1),
    ("per-layer", "float32", 16, None, 2),
    ("cross-layer", "bfloat16", 16, None, 1),
    ("cross-layer", "bfloat16", 16, None, 2),
    ("per-layer", "float32", 32, 256, 1),
    ("per-layer", "float32", 32, 256, 2),
    ("cross-layer", "float32", 64, 256, 1),
    ("per-layer", "bfloat16", 128, None, 1),
    ("cross-layer", "float32", 256, 256, 1),
]
# An uncapped bfloat16 graph on CPU under max_bytes peaked up to 47% over it with the batched
# pass (oneDNN's kernels grow faster with the passes of a smaller batch than the estimate's
# sqrt(passes); docs/graphs.md, "Memory and scale"). The one-copy backward, the default since
# 0.6.0, runs one pass in bfloat16 and its rows in float32: that point is now within the slack
# (it was an xfail(strict), "so that a fix shows": it showed). The 32- and 64-position points
# peaked 1.13-1.30x their budgets before budget.HEADROOM and FREED_AT
BUDGET_POINTS = [
    ("per-layer", "float32", 32, 256),
    ("cross-layer", "float32", 64, 256),
    ("cross-layer", "bfloat16", 128, None),
    POINTS[-1][:4],
]


@pytest.mark.slow
@pytest.mark.parametrize("kind, dtype, n_pos, cap, threads", POINTS)
def test_measured_peak_is_the_estimate(tmp_path, kind, dtype, n_pos, cap, threads):
    """A fresh process's peak resident size over the build (the memory benchmark's child, its
    matmuls on ``threads`` threads; the estimate counts MKL's buffers for that many)."""
    runs = REPEATS if n_pos <= NOISY_UP_TO else 1
    got = [
        _child(tmp_path, kind=kind, dtype=dtype, n_pos=n_pos, cap=cap, threads=threads)
        for _ in range(runs)
    ]
    free = sorted(got, key=lambda run: run["peak"])[runs // 2]  # the median peak
    assert free["threads"] == threads
    assert abs(free["estimate"] / free["peak"] - 1) <= ESTIMATE_SPREAD, got


@pytest.mark.slow
@pytest.mark.parametrize("kind, dtype, n_pos, cap", BUDGET_POINTS)
def test_budgeted_peak_stays_within_max_bytes(tmp_path, kind, dtype, n_pos, cap):
    """A budget halfway between a smaller batch's least estimate and the chosen batch's, plus
    the planner's headroom (the estimate fills at most max_bytes less HEADROOM)."""
    free = _child(tmp_path, kind=kind, dtype=dtype, n_pos=n_pos, cap=cap)
    limit = (free["estimate"] + free["one"]) // 2 + budget.HEADROOM
    bound = _child(tmp_path, kind=kind, dtype=dtype, n_pos=n_pos, cap=cap, max_bytes=limit)
    assert bound["batch"] < free["batch"]
    assert bound["peak"] <= (1 + BUDGET_SLACK) * limit, (bound, limit)
