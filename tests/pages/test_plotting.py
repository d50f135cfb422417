"""Figures from results: the numbers plotted are the numbers given (checked cell by cell),
labels follow the conventions, and text from data cannot become plotly markup."""

from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

from interp.pages.html import Report
from interp.pages.plotting import (
    attention_heatmap,
    attribution_bars,
    head_heatmap,
    head_label,
    logit_lens_lines,
    loss_by_position,
    plotly_text,
    token_label,
)

HOSTILE = [
    "</script><script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "<b>b</b>",
    "\"'&",
    '<a href="javascript:alert(1)">x</a>',
]


def strings_in(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in strings_in(k) + strings_in(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in strings_in(v)]
    if isinstance(value, np.ndarray) and value.dtype == object:
        return strings_in(value.tolist())
    return []


def assert_no_markup_from(fig: go.Figure, hostile: list[str]) -> None:
    """No hostile string appears raw anywhere in the figure; each appears escaped."""
    texts = strings_in(fig.to_plotly_json())
    for bad in hostile:
        if "<" in bad:
            assert not any(bad in t for t in texts), bad
        assert any(plotly_text(bad) in t for t in texts), bad
    tags = {t for text in texts for t in _tags(text)}
    assert tags <= {"<br>", "<extra>", "</extra>"}, tags


def _tags(text: str) -> list[str]:
    import re

    return re.findall(r"<[^<>]*>", text)


def scores_df(n_layers=3, n_heads=4, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        [(layer, head, rng.normal()) for layer in range(n_layers) for head in range(n_heads)],
        columns=["layer", "head", "score"],
    )


# -- head_heatmap ------------------------------------------------------------------------------


def test_head_heatmap_puts_each_score_in_its_cell():
    df = scores_df().sample(frac=1, random_state=1)  # row order must not matter
    df.loc[df.index[0], "score"] = float("nan")
    fig = head_heatmap(df, "score", title="induction")
    (trace,) = fig.data
    z = trace.z
    for row in df.itertuples():
        cell = z[row.layer][row.head]
        if math.isnan(row.score):
            assert cell is None  # undefined: a blank cell, not a colour
        else:
            assert cell == pytest.approx(row.score)
        assert trace.customdata[row.layer][row.head].startswith(head_label(row.layer, row.head))
    assert trace.zmid == 0 and trace.colorscale[0][1] != trace.colorscale[-1][1]
    assert fig.layout.yaxis.autorange == "reversed" and fig.layout.yaxis.title.text == "layer"
    assert fig.layout.title.text == "induction"


def test_head_heatmap_sequential_scale_blank_missing_heads_and_errors():
    df = pd.DataFrame({"layer": [0, 1], "head": [0, 2], "score": [0.1, 0.9]})
    fig = head_heatmap(df, "score")
    assert fig.data[0].zmid is None
    assert [list(row) for row in fig.data[0].z] == [[0.1, None, None], [None, None, 0.9]]
    with pytest.raises(ValueError, match="L0H0 appears more than once"):
        head_heatmap(pd.concat([df, df]), "score")
    with pytest.raises(ValueError, match=r"\['nope'\] missing"):
        head_heatmap(df, "nope")
    with pytest.raises(ValueError, match="empty"):
        head_heatmap(df.iloc[:0], "score")


def test_head_label():
    assert head_label(5, 1) == "L5H1"
    assert head_label(np.int64(11), torch.tensor(0)) == "L11H0"


# -- loss_by_position -------------------------------------------------------------------------


def test_loss_by_position_plots_the_batch_mean_with_a_band():
    loss = torch.rand(4, 6, generator=torch.Generator().manual_seed(0))
    tokens = ["a", "\n", "a", HOSTILE[0], HOSTILE[1], " the"]
    fig = loss_by_position(loss, tokens=tokens, marks={3: HOSTILE[2]}, title=HOSTILE[3])
    mean = fig.data[-1]
    assert list(mean.x) == list(range(6))
    assert mean.y == pytest.approx(loss.mean(0).tolist())
    upper, lower = fig.data[0], fig.data[1]
    assert upper.y == pytest.approx((loss.mean(0) + loss.std(0)).tolist())
    assert lower.y == pytest.approx((loss.mean(0) - loss.std(0)).tolist())
    assert list(fig.layout.xaxis.ticktext) == [token_label(t, max_chars=24) for t in tokens]
    assert fig.layout.xaxis.ticktext[1] == "↵"
    assert fig.layout.xaxis.ticktext[3] == plotly_text(HOSTILE[0][:23] + "…")
    assert fig.layout.shapes[0].x0 == 3
    assert_no_markup_from(fig, HOSTILE[:4])


def test_loss_by_position_from_a_dataframe_matches_the_tensor():
    loss = torch.rand(3, 5, generator=torch.Generator().manual_seed(1))
    df = pd.DataFrame(
        [(b, p, float(loss[b, p])) for b in range(3) for p in range(5)],
        columns=["batch", "pos", "loss"],
    )
    from_df, from_tensor = loss_by_position(df), loss_by_position(loss)
    assert from_df.data[-1].y == pytest.approx(from_tensor.data[-1].y)
    assert from_df.data[0].y == pytest.approx(from_tensor.data[0].y)
    single = loss_by_position(loss[0])
    assert len(single.data) == 1  # no band for one sequence
    with pytest.raises(ValueError, match="2 tokens for 5 positions"):
        loss_by_position(loss, tokens=["a", "b"])
    with pytest.raises(ValueError, match="batch, pos"):
        loss_by_position(torch.zeros(2, 2, 2))


# -- attribution_bars -------------------------------------------------------------------------


def test_attribution_bars_sorts_by_magnitude_and_colours_by_sign():
    df = pd.DataFrame(
        {
            "layer": [0, 0, 1, 1, 2],
            "head": [0, 1, 0, 1, 0],
            "attribution": [0.5, -2.0, float("nan"), 1.0, -0.1],
        }
    )
    fig = attribution_bars(df)
    (bar,) = fig.data
    assert list(fig.layout.yaxis.ticktext) == ["L0H1", "L1H1", "L0H0", "L2H0", "L1H0"]
    assert bar.x == (-2.0, 1.0, 0.5, -0.1, None)
    colours = list(bar.marker.color)
    assert colours[0] == colours[3] != colours[1] == colours[2]
    top = attribution_bars(df, top_k=2)
    assert list(top.layout.yaxis.ticktext) == ["L0H1", "L1H1"]
    with pytest.raises(ValueError, match="top_k"):
        attribution_bars(df, top_k=0)


def test_attribution_bars_labels_from_columns_and_escapes_them():
    df = pd.DataFrame({"component": HOSTILE, "logit_diff": range(len(HOSTILE))})
    fig = attribution_bars(df, "logit_diff", title="by component")
    assert list(fig.layout.yaxis.ticktext) == [plotly_text(c) for c in reversed(HOSTILE)]
    assert_no_markup_from(fig, HOSTILE)


# -- logit_lens_lines -------------------------------------------------------------------------


def test_logit_lens_lines_one_line_per_token_in_stage_order():
    stages = ["embed", "L0", "L1", "final"]
    df = pd.DataFrame(
        [
            (s, t, 10 * i + j)
            for j, t in enumerate([" Mary", HOSTILE[1]])
            for i, s in enumerate(stages)
        ],
        columns=["stage", "token", "logit"],
    )
    fig = logit_lens_lines(df, "logit", x="stage")
    assert [trace.name for trace in fig.data] == [token_label(" Mary"), token_label(HOSTILE[1])]
    assert list(fig.data[1].y) == [1, 11, 21, 31]
    assert list(fig.data[1].x) == [0, 1, 2, 3]
    assert list(fig.layout.xaxis.ticktext) == stages
    assert_no_markup_from(fig, [HOSTILE[1]])
    numeric = logit_lens_lines(
        pd.DataFrame({"layer": [0, 2, 4], "prob": [0.1, 0.2, 0.3]}), "prob", line=None
    )
    assert list(numeric.data[0].x) == [0, 2, 4] and len(numeric.data) == 1


# -- attention_heatmap ------------------------------------------------------------------------


def test_attention_heatmap_cells_and_token_axes():
    g = torch.Generator().manual_seed(0)
    pattern = torch.randn(5, 5, generator=g).tril().softmax(-1)
    tokens = ["a", "b", "a", HOSTILE[0], HOSTILE[2]]  # repeated "a" must stay two ticks
    fig = attention_heatmap(pattern, tokens, title=HOSTILE[1])
    (trace,) = fig.data
    for q in range(5):
        for k in range(5):
            assert trace.z[q][k] == pytest.approx(float(pattern[q, k]))
    assert list(fig.layout.xaxis.ticktext) == [token_label(t, max_chars=24) for t in tokens]
    assert list(fig.layout.yaxis.tickvals) == list(range(5))
    assert fig.layout.yaxis.autorange == "reversed"
    assert (trace.zmin, trace.zmax) == (0.0, 1.0)
    assert trace.customdata[3][0].startswith(plotly_text(HOSTILE[0]))
    assert_no_markup_from(fig, [HOSTILE[0], HOSTILE[1], HOSTILE[2]])
    with pytest.raises(ValueError, match="q_pos == k_pos"):
        attention_heatmap(torch.ones(2, 3), ["a", "b"])
    with pytest.raises(ValueError, match="1 tokens for 2 positions"):
        attention_heatmap(torch.ones(2, 2), ["a"])


def test_token_label_and_plotly_text():
    assert token_label("a\nb\tc") == "a↵b⇥c"
    assert token_label("") == "∅"
    assert token_label(" the") == " the"
    assert token_label("<abcdef>", max_chars=4) == "&lt;ab…"
    assert plotly_text("<b>&") == "&lt;b&gt;&amp;"
    assert html.unescape(plotly_text(HOSTILE[4])) == HOSTILE[4]


def test_every_figure_goes_into_a_report():
    report = Report("all figures")
    df = scores_df()
    report.add_figure(head_heatmap(df, "score"))
    report.add_figure(loss_by_position(torch.rand(2, 4), tokens=list("abcd")))
    report.add_figure(attribution_bars(df, "score"))
    report.add_figure(logit_lens_lines(df.rename(columns={"head": "token"}), "score"))
    report.add_figure(attention_heatmap(torch.eye(3), ["x", "y", "z"]))
    page = report.to_html()
    assert page.count('data-interp-kind="figure"') == 5
