"""experiments/cuda_check.py's half-precision and capped graph checks, run here on the CPU (the
script compares a device with the CPU; no GPU here): the bundled model in bfloat16 against its
float32 twin with rounded weights, uncapped and capped, agrees within the dtype's bound, the
capped analysis runs, and a half graph with a head removed is refused."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import interp

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cuda_check():
    spec = importlib.util.spec_from_file_location(
        "cuda_check", ROOT / "experiments" / "cuda_check.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["cuda_check"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("cuda_check", None)


def test_the_half_precision_rows_agree_on_the_cpu(cuda_check):
    rows = []
    cuda_check.check_half("cpu", "bfloat16", rows)
    assert [r[0] for r in rows] == [
        "tiny-induction/bfloat16/attribution_graph",
        "tiny-induction/bfloat16/attribution_graph_capped",
    ]
    for label, status, diff, bound, *_, detail in rows:
        assert status == "agrees", (label, detail)
        assert 0 < diff <= bound  # bfloat16 rounds: not the same graph, within the bound
    assert "warned" not in rows[0][-1]  # the value and norm paths ran: no fallback


def test_a_graph_with_a_missing_head_is_refused(cuda_check, bundled_model):
    reference = cuda_check.half_graph(bundled_model, capped=True)
    half = interp.load_model("tiny-induction", device="cpu", dtype=torch.bfloat16)
    d_head = int(half.cfg.d_head)
    dense = half.original_model.gpt_neox.layers[0].attention.dense.weight  # [out in]
    with torch.no_grad():
        dense[:, :d_head] = 0  # head 0 of layer 0 removed
    got = cuda_check.half_graph(half, capped=True)
    status, diff, bound, detail = cuda_check.compare_half(reference, got, torch.bfloat16, 2, True)
    assert status == "differs" and diff > bound, detail


def test_the_capped_analysis_runs(cuda_check, bundled_model):
    parts = cuda_check.graph_capped(bundled_model, {})
    assert (parts["nodes"]["feature"] >= 0).sum() == cuda_check.CAP
