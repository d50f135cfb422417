"""The commands' pages: light (the partial plotly.js bundle), every figure titled, colour scales
fixed or centred and stated, tables in their own scroll box without an index column; and in a
real browser they render offline and fit the window."""

from __future__ import annotations

import re
from pathlib import Path

import plotly.graph_objects as go
import pytest
import torch

import interp.pages.assets as page_assets
import interp.pages.html as ih
from interp.cli import main
from interp.pages.html import Report
from tests.pages.test_html import data_blocks, executable, parse

MAX_INDUCTION_PAGE = 2_500_000  # bytes: the limit (it was 6.2 MB with the full bundle)
PARTIAL_HEADER = re.compile(
    r"^/\*\*\n\* plotly\.js \(cartesian - minified\) v(\d+\.\d+\.\d+)\n"
    r"\* Copyright 2012-\d{4}, Plotly, Inc\.\n\* All rights reserved\.\n"
    r"\* Licensed under the MIT license\n\*/\n"
)


def write_pages(out: Path, model: str, *, fast: bool, question: list[str]) -> dict[str, Path]:
    quick = ["--seq-lens", "5,8", "--batch-size", "2", "--ablate-top", "3"] if fast else []
    assert main(["induction", "--model", model, "--out", str(out / "induction"), *quick]) == 0
    assert main(["attribute", "--model", model, *question, "--out", str(out / "attribute")]) == 0
    assert (
        main(
            [
                "circuits",
                "--model",
                model,
                "--out",
                str(out / "circuits"),
                "--baseline-samples",
                "8" if fast else "200",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "attention",
                "--model",
                model,
                "--prompt",
                "a b c d a b c d",
                "--out",
                str(out / "attention.html"),
            ]
        )
        == 0
    )
    return {
        "induction": out / "induction" / "report.html",
        "attribute": out / "attribute" / "report.html",
        "circuits": out / "circuits" / "report.html",
        "attention": out / "attention.html",
    }


@pytest.fixture(scope="module")
def pages(gpt2_dir, tmp_path_factory) -> dict[str, Path]:
    question = [
        "--prompt",
        "When Mary and John went to the store, John gave a drink to",
        "--answer",
        " Mary",
        "--wrong",
        " John",
    ]
    return write_pages(
        tmp_path_factory.mktemp("pages"), str(gpt2_dir), fast=True, question=question
    )


def figures(path: Path) -> list[dict]:
    return data_blocks(parse(path.read_text(encoding="utf-8")), "figure")


# -- the partial bundle -------------------------------------------------------------------------


def test_vendored_bundle_is_the_official_partial_build_with_its_licence():
    source = page_assets.PLOTLY_PARTIAL.read_text(encoding="utf-8")
    header = PARTIAL_HEADER.match(source)
    assert header, "the vendored file must start with plotly's own MIT licence header"
    assert header.group(1) == ih.PLOTLY_PARTIAL_VERSION
    licence = page_assets.PLOTLY_PARTIAL.with_name("plotly.js-LICENSE").read_text()
    assert licence.startswith("MIT License") and "Plotly" in licence
    # the figures' JSON is written by python plotly for the plotly.js it bundles
    from plotly.offline import get_plotlyjs_version

    assert get_plotlyjs_version().split(".")[0] == ih.PLOTLY_PARTIAL_VERSION.split(".")[0]
    # the full bundle registers the same way, so the reading of trace types is checked
    full = set(re.findall(page_assets._TRACE_MODULE, ih.plotly_js()))
    assert ih.partial_trace_types() < full and "scatter3d" in full


def test_every_trace_type_interp_draws_is_in_the_partial_bundle(pages):
    from interp.pages.plotting import (
        attention_heatmap,
        attribution_bars,
        head_heatmap,
        logit_lens_lines,
        loss_by_position,
    )
    from tests.pages.test_plotting import scores_df

    df = scores_df()
    made = [
        head_heatmap(df, "score"),
        loss_by_position(torch.rand(2, 4)),
        attribution_bars(df, "score"),
        logit_lens_lines(df.rename(columns={"head": "token"}), "score"),
        attention_heatmap(torch.eye(3), ["x", "y", "z"]),
    ]
    used = {trace.type for fig in made for trace in fig.data}
    used |= {
        trace["type"] for page in pages.values() for fig in figures(page) for trace in fig["data"]
    }
    assert used == {"heatmap", "bar", "scatter"}
    assert used <= ih.partial_trace_types()


def test_pages_inline_the_partial_bundle_and_fall_back_to_the_full_one(pages):
    for name in ("induction", "attribute", "circuits"):
        scripts = executable(parse(pages[name].read_text(encoding="utf-8")))
        assert scripts == [ih.plotly_js(partial=True), ih._BOOTSTRAP], name
    report = Report("a trace type the partial bundle lacks")
    report.add_figure(go.Figure(go.Scatter3d(x=[0], y=[0], z=[0])))
    assert executable(parse(report.to_html())) == [ih.plotly_js(), ih._BOOTSTRAP]


def test_page_weights(pages):
    sizes = {name: path.stat().st_size for name, path in pages.items()}
    assert sizes["induction"] <= MAX_INDUCTION_PAGE, sizes
    partial, full = len(ih.plotly_js(partial=True).encode()), len(ih.plotly_js().encode())
    assert partial < full / 3
    for name in ("induction", "attribute", "circuits"):  # the bundle plus a little data
        assert partial < sizes[name] < partial + 300_000, (name, sizes)


def test_bundled_model_pages_with_default_settings_stay_light(tmp_path):
    sizes = {
        name: path.stat().st_size
        for name, path in write_pages(
            tmp_path,
            "tiny-induction",
            fast=False,
            question=["--prompt", "a b c d a b c", "--answer", " d"],
        ).items()
    }
    assert sizes["induction"] <= MAX_INDUCTION_PAGE, sizes


# -- figures and tables -------------------------------------------------------------------------


def test_every_figure_has_a_title_and_states_its_colour_scale(pages):
    for name, path in pages.items():
        for fig in figures(path):
            assert fig["layout"]["title"]["text"].strip(), (name, fig["layout"])
            for trace in fig["data"]:
                if trace["type"] == "heatmap":
                    assert re.search(
                        r"fixed 0 to 1|fixed -1 to 1|0 white", trace["colorbar"]["title"]["text"]
                    ), (name, trace)


def test_heatmaps_of_shares_are_fixed_and_signed_ones_centred(pages):
    shares = {"induction_score", "prev_token_score", "duplicate_token_score"}
    seen = set()
    for fig in figures(pages["induction"]):
        trace = fig["data"][0]
        if trace["type"] != "heatmap":
            continue
        label = trace["colorbar"]["title"]["text"].split("<br>")[0]
        seen.add(label)
        if label in shares or label == "attention":
            assert (trace["zmin"], trace["zmax"]) == (0.0, 1.0), label
        else:  # copying score, ablation loss increase: centred on 0
            assert trace["zmid"] == 0 and trace["zmin"] == -trace["zmax"], label
    assert shares | {"attention", "copying_score", "ablation_loss_increase"} <= seen
    for page in ("attribute", "circuits"):
        heat = [f["data"][0] for f in figures(pages[page]) if f["data"][0]["type"] == "heatmap"]
        assert heat and all(t["zmid"] == 0 and t["zmin"] == -t["zmax"] for t in heat)


def test_tables_scroll_in_their_own_box_without_an_index_column(pages):
    for name in ("induction", "attribute", "circuits"):
        page = pages[name].read_text(encoding="utf-8")
        parser = parse(page)
        assert page.count("<table>") == page.count('<div class="interp-table" tabindex="0">')
        assert page.count("<table>") >= 1
        headers = parser.text["th"]
        assert "" not in headers and "<NA>" not in parser.text["td"], name
    circuits = parse(pages["circuits"].read_text(encoding="utf-8"))
    rows = re.findall(r"<thead><tr>(.*?)</tr>", pages["circuits"].read_text(encoding="utf-8"))
    assert [re.match(r"<th>(\w+)</th>", r).group(1) for r in rows] == [
        "layer",
        "kind",
        "kind",
        "kind",
    ]
    assert circuits.text["th"][:3] == ["layer", "head", "copying_score"]


def test_induction_report_needs_no_circuitsvis(pages):
    parser = parse(pages["induction"].read_text(encoding="utf-8"))
    assert data_blocks(parser, "attention") == []
    assert ih.circuitsvis_js() not in executable(parser)
    titles = [f["layout"]["title"]["text"] for f in figures(pages["induction"])]
    assert sum("by induction score" in t for t in titles) == 3  # the top three heads


# -- in a browser -------------------------------------------------------------------------------

FITS = {
    "overflow": "document.documentElement.scrollWidth - window.innerWidth",
    "sticky": "[...document.querySelectorAll('th')].every(th => "
    "getComputedStyle(th).position === 'sticky')",
    "boxes": "[...document.querySelectorAll('.interp-table')].map(d => "
    "getComputedStyle(d).overflow)",
}


@pytest.mark.browser
@pytest.mark.parametrize("name", ["induction", "attribute", "circuits", "attention"])
def test_command_pages_render_and_fit_the_window(name, pages, browser):
    from tests.test_browser import CHECKS, open_page
    from tests.test_browser import assert_clean as clean

    checks_before = dict(CHECKS)
    CHECKS.update(FITS)
    try:
        result = open_page(browser, pages[name], f"command-{name}", width=1000)
    finally:
        CHECKS.clear()
        CHECKS.update(checks_before)
    clean(result)
    n_figures = len(figures(pages[name]))
    assert result.values["figures"] == n_figures
    assert result.values["overflow"] <= 0, "the page is wider than the window"
    if name != "attention":
        assert result.values["sticky"] is True
        assert set(result.values["boxes"]) == {"auto"}
