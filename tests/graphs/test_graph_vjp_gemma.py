"""The one-copy backward on Gemma 2 (interp.graphs.vjp, interp.graphs.relations): its norms
scale by ``1 + w`` and its post-norms (``ln1_post`` after the attention, ``ln2_post`` after the
MLP) sit between each sublayer and the residual. The rows equal the batched frozen pass's (which
differentiates the bridge's own norms on Gemma 2: an independent computation) at every
transcoder site, before and after ``ln2_post``, capped and uncapped, per-layer and cross-layer,
in float32, float64 and bfloat16; each relation the transpose assumes of Gemma 2, planted
missing, is refused.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import interp.graphs.frozen as frozen
import interp.graphs.vjp as vjp
from interp import attribution_graph, load_model
from tests.graphs.test_graph_vjp import (
    CAP,
    TOKENS,
    assert_rows_close,
    both,
    half_rtol,
    rows_rtol,
)
from tests.transcoder_folders import random_transcoders

# (input hook, output hook, kind, skip): mlp.hook_out is the MLP's own output (ln2_post between
# it and the residual), hook_mlp_out what the block adds (after ln2_post)
SITES = [
    ("mlp.hook_in", "mlp.hook_out", "per-layer", True),
    ("mlp.hook_in", "mlp.hook_out", "cross-layer", False),
    ("mlp.hook_in", "hook_mlp_out", "per-layer", True),
    ("ln2.hook_normalized", "hook_mlp_out", "cross-layer", False),
    ("ln2.hook_out", "mlp.hook_out", "per-layer", True),
    ("hook_resid_mid", "mlp.hook_out", "per-layer", True),
]


def _tc(model, hook_in="mlp.hook_in", hook_out="mlp.hook_out", kind="per-layer", skip=True):
    tc = random_transcoders(
        model, kind=kind, d_tc=16, seed=1, skip=skip, input_hook=hook_in, output_hook=hook_out
    )
    return tc.to(dtype=torch.float64) if model.cfg.dtype == torch.float64 else tc


@pytest.mark.parametrize("hook_in,hook_out,kind,skip", SITES)
def test_every_site_gives_the_batched_rows(zoo, hook_in, hook_out, kind, skip):
    model = zoo.model("gemma2")
    tc = _tc(model, hook_in, hook_out, kind, skip)
    assert vjp.one_copy_fits(model, tc)
    got = vjp.record(model, TOKENS, tc)
    assert isinstance(got, vjp.OneCopy)
    assert (got.mlp_post is not None) == (hook_out == "mlp.hook_out")
    for cap in (None, CAP):
        want, got = both(model, tc, max_feature_nodes=cap)
        assert_rows_close(want, got, rows_rtol(torch.float32, model.cfg.d_model))


@pytest.mark.parametrize("kind", ["per-layer", "cross-layer"])
def test_float64_rows_agree_to_rounding(zoo, kind):
    model = load_model(zoo.directory("gemma2"), device="cpu", dtype=torch.float64)
    tc = _tc(model, kind=kind, skip=kind == "per-layer")
    for cap in (None, CAP):
        want, got = both(model, tc, max_feature_nodes=cap)
        assert got.dtype == torch.float64
        assert_rows_close(want, got, rows_rtol(torch.float64, model.cfg.d_model))


def test_a_bfloat16_model_is_computed_in_float32(zoo):
    model = load_model(zoo.directory("gemma2"), device="cpu", dtype=torch.bfloat16)
    tc = _tc(model)
    for cap in (None, CAP):
        want, got = both(model, tc, max_feature_nodes=cap)
        assert got.dtype == torch.float32
        assert_rows_close(want, got, half_rtol(torch.bfloat16))


def test_the_default_is_the_one_copy_backward(zoo):
    model = zoo.model("gemma2")
    g = attribution_graph(model, TOKENS, _tc(model), max_feature_nodes=CAP)
    assert g.info["backward"] == "one-copy"


def _doubled(prefix: str):
    right = frozen.norm_paths

    def doubled(m, busy):
        paths = right(m, busy)
        paths[prefix].weight = 2 * paths[prefix].weight
        return paths

    return doubled


def _layout(**changed):
    right = vjp.block_layout
    return lambda m, tc: dataclasses.replace(right(m, tc), **changed)


# each relation the transpose assumes of Gemma 2, planted missing:
# what -> (the transcoders' output hook, (name patched, its replacement), the refusal's reason)
PLANTED = {
    "no 1 + w": (
        "mlp.hook_out",
        ("with_offsets", lambda m, norms: norms),
        "layer 0: ln1's frozen map",
    ),
    "ln1_post's weight": (
        "mlp.hook_out",
        ("norm_paths", _doubled("blocks.1.ln1_post")),
        "layer 1: ln1_post's frozen map",
    ),
    "ln2_post's weight": (
        "mlp.hook_out",
        ("norm_paths", _doubled("blocks.0.ln2_post")),
        "layer 0: ln2_post's frozen map",
    ),
    "ln1_post left out": (
        "mlp.hook_out",
        ("block_layout", _layout(attn_post=False)),
        "layer 0: the residual after attention",
    ),
    "ln2_post left out": (
        "mlp.hook_out",
        ("block_layout", _layout(mlp_post=False)),
        "layer 0: the residual after the MLP",
    ),
    "ln2_post twice": (  # the transcoders write after ln2_post already
        "hook_mlp_out",
        ("block_layout", _layout(mlp_post=True)),
        "layer 0: ln2_post reads the mlp_out",
    ),
}


@pytest.mark.parametrize("what", PLANTED)
def test_a_planted_miss_is_refused(zoo, monkeypatch, what):
    hook_out, patch, why = PLANTED[what]
    model = zoo.model("gemma2")
    tc = _tc(model, hook_out=hook_out)
    assert isinstance(vjp.record(model, TOKENS, tc), vjp.OneCopy)
    name, replacement = patch
    monkeypatch.setattr(frozen if name == "norm_paths" else vjp, name, replacement)
    got = vjp.record(model, TOKENS, tc)
    assert isinstance(got, str) and why in got, got
    with pytest.raises(ValueError, match="does not cover this model"):
        attribution_graph(model, TOKENS, tc, backward="one-copy")


def test_a_sliding_window_shorter_than_the_prompt(tmp_path):
    """Layer 0 attends to the last 4 positions only (Gemma 2's local layers); the pattern the
    recording keeps is the windowed one, as the batched pass's."""
    from tests.zoo import make_zoo_checkpoint

    model = load_model(make_zoo_checkpoint(tmp_path / "gemma2", "gemma2", sliding_window=4))
    assert model.cfg.layer_types[0] == "sliding_attention"
    tc = _tc(model, kind="cross-layer", skip=False)
    got = vjp.record(model, TOKENS, tc)
    assert isinstance(got, vjp.OneCopy)
    assert float(got.patterns[0][:, -1, :-4].abs().max()) == 0.0  # outside the window
    assert float(got.patterns[1][:, -1, :-4].abs().max()) > 0.0  # the global layer
    for cap in (None, CAP):
        want, got = both(model, tc, max_feature_nodes=cap)
        assert_rows_close(want, got, rows_rtol(torch.float32, model.cfg.d_model))
