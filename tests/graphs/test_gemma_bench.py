"""The Gemma-2-2B-shaped GPU bench at a tiny --scale on the CPU: benchmarks/make_gemma_bench.py
writes a Gemma 2 checkpoint interp loads (Gemma 2's config kept: softcapping, alternating
sliding windows, post-norms, grouped key/value heads) with sparse transcoders, and
benchmarks/bench_graph_gemma.py's timed path gives a graph that passes the frozen-model
identity check (float32) and runs in bf16 as the GPU bench does. Speed is not asserted."""

from __future__ import annotations

import json

import pytest
import torch

import tests.support  # noqa: F401  (it loads tests.support_graphs: import it first)
from benchmarks.bench_graph_gemma import parse_cases, run_case
from benchmarks.make_gemma_bench import build, sizes
from tests.support_graphs import check_graph_identity

SCALE = 0.01  # 2 layers, d_model 24, 2 heads sharing 1 key/value head, 164 features a layer
N_POS = 12


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("gemma-bench")
    build(out, SCALE, device="cpu", n_ctx=64)
    return out


def test_sizes_at_scale_one_are_gemma_2_2b():
    assert sizes(1.0) == {
        "n_layers": 26, "d_model": 2304, "n_heads": 8, "n_kv_heads": 4, "d_head": 256,
        "d_mlp": 9216, "d_vocab": 256000, "sliding_window": 4096, "d_tc": 16384,
    }  # fmt: skip
    with pytest.raises(ValueError, match="scale"):
        sizes(0)


def test_the_full_size_model_has_gemma_2_2b_parameter_count():
    """Built on the meta device (no memory): google/gemma-2-2b's 2,614,341,888 parameters."""
    from benchmarks.make_gemma_bench import _model

    with torch.device("meta"):
        model = _model(sizes(1.0), n_ctx=8192)
    assert sum(p.numel() for p in model.parameters()) == 2_614_341_888
    assert model.dtype == torch.bfloat16
    assert model.config.layer_types[:2] == ["sliding_attention", "full_attention"]


def test_cases_parse_and_bad_ones_are_refused():
    assert parse_cases("1024:0:60,8192:8192:600:900") == [
        {"n_pos": 1024, "max_feature_nodes": None, "target_s": 60, "limit_s": 300},
        {"n_pos": 8192, "max_feature_nodes": 8192, "target_s": 600, "limit_s": 900},
    ]
    with pytest.raises(ValueError, match="N_POS:MAX_FEATURE_NODES"):
        parse_cases("1024:0")


@pytest.mark.slow
def test_tiny_bench_loads_as_gemma2_and_its_graph_passes_the_identity_check(bench):
    stats = json.loads((bench / "build_stats.json").read_text())
    config = json.loads((bench / "model" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    assert config["attn_logit_softcapping"] == 50.0 and config["final_logit_softcapping"] == 30.0
    assert config["layer_types"] == ["sliding_attention", "full_attention"]
    density = [layer["density"] for layer in stats["layers"]]
    assert all(0.005 <= d <= 0.02 for d in density), density  # ~1% on the calibration inputs

    res, g = run_case(bench, N_POS, device="cpu", dtype=torch.float32, warm=4)
    model, tc = g.context["model"], g.context["tc"]
    assert model.cfg.architecture == "Gemma2ForCausalLM"
    assert (model.cfg.n_layers, model.cfg.d_model, model.cfg.n_heads) == (2, 24, 2)
    assert model.cfg.n_key_value_heads == 1 and "blocks.0.ln2_post.hook_out" in model.hook_dict
    assert tc.d_tc == stats["sizes"]["d_tc"]
    assert res["n_features"] == res["n_active"] > 0  # uncapped: every active feature kept
    assert res["n_nodes"] == len(g.nodes) and res["batch_used"] >= 1
    assert res["estimate_bytes"] > 0 and res["wall_s"] > 0
    assert g.info["backward"] == "one-copy"  # sliding windows, soft-capping, post-norms
    check_graph_identity(model, g.tokens, tc, g)

    capped, g16 = run_case(bench, N_POS, 5, device="cpu", warm=4)  # bf16, capped: the GPU path
    assert capped["dtype"] == "bfloat16" and capped["n_features"] == 5
    assert g16.context["model"].cfg.dtype == torch.bfloat16
    assert g16.info["backward"] == "one-copy"
    assert torch.isfinite(g16.adjacency).all()
