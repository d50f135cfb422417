"""Patching heatmaps and the report section are made from the frame, cell for cell."""

from __future__ import annotations

import math

import pytest

from interp.interventions import logit_diff, patch_activations
from interp.pages.html import Report
from interp.pages.patching import add_patching_section
from interp.pages.patching_plots import patching_heatmap


@pytest.fixture(scope="module")
def frame(gpt2_model):
    clean = gpt2_model.to_tokens("The cat sat on the mat. The dog sat on the")
    corrupted = clean.clone()
    corrupted[0, 2] = 50
    return patch_activations(
        gpt2_model,
        clean,
        corrupted,
        logit_diff(int(clean[0, 3]), 9),
        sites=["resid_pre", "heads", "heads_pos"],
        method="both",
    )


def _cell(fig, y, x):
    return fig.data[0].z[y][x]


def test_layer_by_position(frame):
    fig = patching_heatmap(frame, "resid_pre")
    row = frame[
        (frame["site"] == "resid_pre")
        & (frame["method"] == "exact")
        & (frame["layer"] == 1)
        & (frame["pos"] == 2)
    ]
    assert _cell(fig, 1, 2) == pytest.approx(float(row["recovered"].iloc[0]))
    assert list(fig.data[0].y) == ["L0", "L1"]


def test_layer_by_head_and_heads_by_position(frame, gpt2_model):
    fig = patching_heatmap(frame, "head", per_position=False, method="attribution")
    row = frame[
        (frame["site"] == "head")
        & (frame["method"] == "attribution")
        & frame["pos"].isna()
        & (frame["layer"] == 1)
        & (frame["head"] == 3)
    ]
    assert _cell(fig, 1, 3) == pytest.approx(float(row["recovered"].iloc[0]))
    fig = patching_heatmap(frame, "head")
    assert len(fig.data[0].y) == gpt2_model.cfg.n_layers * gpt2_model.cfg.n_heads
    assert fig.data[0].y[5] == "L1H1"


def test_nan_cells_are_blank_and_bad_sites_say_what_exists(frame):
    nan_frame = frame.copy()
    nan_frame["recovered"] = math.nan
    assert all(v is None for row in patching_heatmap(nan_frame, "resid_pre").data[0].z for v in row)
    with pytest.raises(ValueError, match="the frame has sites"):
        patching_heatmap(frame, "mlp_out")


def test_report_section_escapes_and_lists_errors(frame):
    report = Report("patching <script>")
    add_patching_section(
        report, frame, tokens=["<script>alert(1)</script>"] * frame.attrs["n_tokens"]
    )
    page = report.to_html()
    assert "Attribution patching against exact patching" in page
    assert "<script>alert(1)</script>" not in page and "alert(1)" in page
