"""Every plotting function takes what its analysis returns, as it is (no renaming), and draws
the analysis's own numbers: checked on a tiny GPT-2 and on the bundled model."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

import interp
from interp.attribution import heads_table, logit_attribution, logit_lens
from interp.circuits import copying_scores
from interp.pages.plotting import (
    attention_heatmap,
    attribution_bars,
    head_heatmap,
    logit_lens_lines,
    loss_by_position,
    token_label,
)

PROMPT = "import sys\nimport os\nimport sys\nimport"  # bundled: ' sys', ' os' are one token


@pytest.fixture(scope="module", params=["gpt2", "bundled"])
def case(request):
    """(model, prompt, answer, wrong) for each model."""
    if request.param == "gpt2":
        model = request.getfixturevalue("gpt2_model")
        return model, "When Mary and John went to the store, John gave a drink to", " Mary", " John"
    return request.getfixturevalue("bundled_model"), PROMPT, " os", " sys"


@pytest.fixture(scope="module")
def scan(case):
    model = case[0]
    return interp.run_induction_scan(model, seq_lens=[4, 8], batch_size=2, ablate=2)


def heatmap_cells(fig) -> dict[tuple[int, int], float]:
    (trace,) = fig.data
    return {
        (layer, head): value
        for layer, row in enumerate(trace.z)
        for head, value in enumerate(row)
        if value is not None
    }


def assert_cells(fig, table, value) -> None:
    cells = heatmap_cells(fig)
    expected = {
        (int(r.layer), int(r.head)): float(getattr(r, value))
        for r in table.itertuples()
        if not math.isnan(float(getattr(r, value)))
    }
    assert cells.keys() == expected.keys()
    for key, v in expected.items():
        assert cells[key] == pytest.approx(v, abs=1e-12)


def test_head_heatmap_takes_the_induction_table_and_result(case, scan):
    table = interp.detect_induction_heads(case[0], seq_lens=[4, 8], batch_size=2, ablate=2)
    fig = head_heatmap(table)
    assert_cells(fig, table, "induction_score")
    assert "induction_score" in fig.layout.title.text
    assert_cells(head_heatmap(scan), scan.table, "induction_score")  # the InductionResult
    assert_cells(head_heatmap(scan.table, "copying_score"), scan.table, "copying_score")


def test_head_heatmap_takes_copying_scores(case):
    scores = copying_scores(case[0])
    assert_cells(head_heatmap(scores), scores, "copying_score")
    assert_cells(
        head_heatmap(scores, "copying_score", scale="unit-signed"), scores, "copying_score"
    )


def test_attribution_plots_take_logit_attribution(case):
    model, prompt, answer, wrong = case
    dla = logit_attribution(model, prompt, answer, wrong=wrong)
    total = dla.loc[dla["component"] == "total", "contribution"].item()
    fig = attribution_bars(dla)
    (bar,) = fig.data
    assert len(bar.x) == len(dla) - 1  # every component but the total
    assert sum(bar.x) == pytest.approx(total, abs=1e-6)  # the bars add up to the logit diff
    labels = list(fig.layout.yaxis.ticktext)
    heads = [
        f"L{layer}H{head}"
        for layer in range(model.cfg.n_layers)
        for head in range(model.cfg.n_heads)
    ]
    assert set(heads) <= set(labels) and "embed" in labels and "total" not in labels
    assert len(set(labels)) == len(labels)  # every bar named apart
    assert abs(bar.x[0]) == max(abs(v) for v in bar.x)
    with_total = attribution_bars(dla, drop_total=False)
    assert "total" in with_total.layout.yaxis.ticktext
    assert len(attribution_bars(dla, "contribution", top_k=5).data[0].x) == 5
    # the per-head heatmap of the same frame: its head rows
    assert_cells(head_heatmap(dla), heads_table(dla), "contribution")
    neurons = logit_attribution(model, prompt, answer, neurons=True)
    if (neurons["component"] == "neuron").any():
        assert any(
            t.startswith("neuron L0 N") for t in attribution_bars(neurons).layout.yaxis.ticktext
        )


def test_logit_lens_lines_take_logit_lens(case):
    model, prompt, answer, wrong = case
    lens = logit_lens(model, prompt, answer, wrong=wrong)
    fig = logit_lens_lines(lens)
    assert [t.name for t in fig.data] == [
        token_label(f"{answer} (answer)"),
        token_label(f"{wrong} (wrong)"),
    ]
    assert list(fig.data[0].y) == pytest.approx(lens["answer_logit"].tolist())
    assert list(fig.data[1].y) == pytest.approx(lens["wrong_logit"].tolist())
    assert list(fig.layout.xaxis.ticktext) == lens["label"].tolist()
    diff = logit_lens_lines(lens, "logit_diff")
    assert len(diff.data) == 1
    assert list(diff.data[0].y) == pytest.approx(
        (lens["answer_logit"] - lens["wrong_logit"]).tolist(), abs=1e-9
    )
    bare = logit_lens(model, prompt)
    top = logit_lens_lines(bare)
    assert list(top.data[0].y) == pytest.approx(bare["top1_prob"].tolist())
    assert all(
        token_label(t) in h for t, h in zip(bare["top1_token"], top.data[0].customdata, strict=True)
    )


def test_attention_heatmap_takes_run_cached_patterns(case):
    model, prompt = case[0], case[1]
    run = interp.run_cached(model, prompt, patterns=True)
    tokens = model.to_str_tokens(prompt)
    pattern = run.patterns()[1, 0, 2]
    fig = attention_heatmap(pattern, tokens)
    z = torch.tensor(
        [[math.nan if v is None else v for v in row] for row in fig.data[0].z], dtype=torch.float64
    )
    assert torch.allclose(z, pattern.double())
    assert torch.allclose(z.sum(-1), torch.ones(len(tokens), dtype=torch.float64))


def test_loss_by_position_takes_the_induction_scan(scan):
    fig = loss_by_position(scan)
    mean = fig.data[-1]
    expected = scan.scan.loss.double().mean(0)
    got = torch.tensor([math.nan if v is None else v for v in mean.y], dtype=torch.float64)
    assert torch.allclose(got, expected, equal_nan=True)
    marks = sorted(shape.x0 for shape in fig.layout.shapes)
    assert marks == [scan.batch.prefix + n for n in (4, 8)]
    again = loss_by_position(scan.scan)  # the HeadScan alone: no marks
    assert list(again.data[-1].y) == list(mean.y) and not again.layout.shapes


def test_head_heatmap_takes_a_path_patching_result(case):
    from interp.interventions.paths import path_patch_senders

    model, prompt = case[0], case[1]
    clean = interp.run_cached(model, prompt).tokens
    corrupted = clean.flip(1)
    result = path_patch_senders(
        model, clean, corrupted, receivers=["logits"], metric=lambda logits: logits[:, -1, 3]
    )
    heads = result.table[result.table["head"].notna()]
    assert_cells(head_heatmap(result), heads, "recovered")


def test_head_heatmap_takes_a_heads_patching_frame(case):
    from interp.interventions import logit_diff, patch_activations
    from interp.pages.patching_plots import patching_heatmap

    model, prompt = case[0], case[1]
    clean = interp.run_cached(model, prompt).tokens
    corrupted = clean.flip(1)
    metric = logit_diff(3, 4)
    frame = patch_activations(model, clean, corrupted, metric, sites=("heads",), method="both")
    exact = frame[frame["method"] == "exact"]
    assert_cells(head_heatmap(frame), exact, "recovered")
    assert heatmap_cells(head_heatmap(frame)) == heatmap_cells(patching_heatmap(frame, "head"))
    mixed = patch_activations(model, clean, corrupted, metric, sites=("heads", "q"))
    with pytest.raises(ValueError, match="patching_heatmap"):
        head_heatmap(mixed)


def test_the_theme_is_plotly_white_for_every_trace_drawn(gpt2_model):
    """theme() keeps plotly_white's layout and its defaults for the traces interp draws (so the
    figures look the same), and every figure gets its own copy."""
    import plotly.io as pio

    from interp.pages.plot_style import TEMPLATE, TRACE_TYPES, theme

    full = pio.templates[TEMPLATE]
    figures = [
        head_heatmap(copying_scores(gpt2_model), "copying_score"),
        attribution_bars(logit_attribution(gpt2_model, "a b c", 5)),
    ]
    drawn = {trace.type for fig in figures for trace in fig.data}
    assert drawn <= set(TRACE_TYPES)
    pages = Path(interp.__file__).parent / "pages"  # every trace the pages can draw
    sources = " ".join(f.read_text(encoding="utf-8") for f in pages.glob("*.py"))
    used = {name.lower() for name in re.findall(r"go\.(\w+)\(", sources)}
    assert used - {"figure"} == set(TRACE_TYPES)
    for fig in figures:
        template = fig.layout.template
        assert template is not theme()
        assert template.layout.to_plotly_json() == full.layout.to_plotly_json()
        for kind in TRACE_TYPES:
            ours = [t.to_plotly_json() for t in getattr(template.data, kind)]
            assert ours == [t.to_plotly_json() for t in getattr(full.data, kind)], kind
