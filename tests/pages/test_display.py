"""Notebook display: short reprs with no tensor values, HTML summaries of the real results,
every untrusted string escaped, and a Report shown inline in a sandboxed frame."""

from __future__ import annotations

from html.parser import HTMLParser

import pandas as pd
import pytest
import torch

from interp import run_cached, run_induction_scan
from interp.engine import estimate_cache_bytes
from interp.foundation.formatting import grouped_names, summary_html, table_html
from interp.pages.display import page_iframe
from interp.pages.html import Report

HOSTILE = [
    "</script><script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "\"'&amp;",
    "<b>bold</b>",
]


class Markup(HTMLParser):
    """Tags, attributes and text of an HTML fragment, as a browser would tokenise it."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += attrs

    def handle_data(self, data):
        self.text.append(data)


class Rows(HTMLParser):
    """The ``<td>`` texts of each body row of an HTML table."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None
        self.feed(text.split("<tbody>", 1)[1].split("</tbody>", 1)[0])
        self.close()

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag == "td":
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td":
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def assert_inert(fragment: str) -> Markup:
    """No script, style, image or event handler: the fragment cannot act on the notebook."""
    markup = Markup(fragment)
    assert not {"script", "style", "img", "svg", "iframe", "a", "object"} & set(markup.tags)
    assert not [name for name, _ in markup.attrs if name.startswith("on")]
    return markup


def assert_no_tensor_values(text: str) -> None:
    assert "tensor(" not in text and "array(" not in text, text[:500]


@pytest.fixture(scope="module")
def scan(gpt2_model):
    return run_induction_scan(gpt2_model, seq_lens=[4, 8], batch_size=2, ablate=2)


def test_induction_result_shows_verdict_losses_settings_and_top_rows(scan):
    text = repr(scan)
    assert_no_tensor_values(text)
    assert len(text) < 600
    expected = [f"L{r.layer}H{r.head}" for r in scan.table.itertuples() if r.is_induction]
    assert scan.induction_heads() == expected
    if expected:
        assert ", ".join(expected) in text
    else:
        assert "no induction head among 8 heads" in text
    assert f"{scan.loss_first_half:.4g}" in text and f"{scan.loss_repeated_half:.4g}" in text
    assert "seq_lens [4, 8] (as given)" in text

    page = scan._repr_html_()
    assert_no_tensor_values(page)
    markup = assert_inert(page)
    cells = [t for t in markup.text if t.strip()]
    assert "seq_lens" in cells and "[4, 8] (as given)" in cells
    # the table's first rows, in the table's order: layer, head, induction score
    top = scan.table.head(10)
    rows = Rows(page).rows
    assert len(rows) == len(top) and all(len(r) == len(scan.table.columns) for r in rows)
    assert [int(r[0]) for r in rows] == top["layer"].tolist()
    assert [float(r[2]) for r in rows] == pytest.approx(top["induction_score"].tolist(), rel=1e-3)
    assert f"{len(scan.table)} rows" in page


def test_induction_result_when_defaults_did_not_fit(scan):
    settings = dict(scan.settings, seq_lens_reason="the context of <b>8</b> tokens is short")
    changed = type(scan)(**{**scan.__dict__, "settings": settings})
    assert "the context of <b>8</b> tokens is short" in repr(changed)
    markup = assert_inert(changed._repr_html_())
    assert any("the context of <b>8</b> tokens is short" in t for t in markup.text)


def test_scan_parts_repr_without_values(scan):
    for text in (repr(scan.batch), repr(scan.scan), scan.scan._repr_html_()):
        assert_no_tensor_values(text)
        assert len(text) < 20_000
    assert repr(scan.batch) == (
        f"RepeatedTokens(tokens {list(scan.batch.tokens.shape)}, seq_lens 4 x2, 8 x2, prefix 1)"
    )
    assert "float32 [2, 4]" in repr(scan.scan)


def test_cached_run_says_what_was_cached_with_shapes_and_memory(gpt2_model):
    run = run_cached(gpt2_model, "a b c d e", patterns=True, resid=("post",))
    n = run.tokens.shape[1]
    text = repr(run)
    assert_no_tensor_values(text)
    expected_bytes = sum(t.numel() * t.element_size() for t in run.activations.values())
    expected_bytes += run.logits.numel() * run.logits.element_size()
    expected_bytes += run.tokens.numel() * run.tokens.element_size()
    assert run.memory_bytes() == expected_bytes
    # the budget planner's estimate, from shapes alone, is what the run holds
    assert (
        estimate_cache_bytes(gpt2_model, tuple(run.tokens.shape), patterns=True, resid=("post",))
        == expected_bytes
    )
    assert f"{expected_bytes / 1e6:.3g} MB" in text
    assert f"blocks.{{L}}.attn.hook_pattern x2 float32 [1, 4, {n}, {n}]" in text
    assert "blocks.{L}.hook_resid_post x2 float32" in text
    page = run._repr_html_()
    assert_no_tensor_values(page)
    cells = [t for t in assert_inert(page).text if t.strip()]
    assert "blocks.{L}.attn.hook_pattern" in cells and "0, 1" in cells
    assert f"[1, 4, {n}, {n}]" in cells
    empty = run_cached(gpt2_model, "a b", keep_logits=False)
    assert "cached: nothing" in repr(empty) and "logits not kept" in repr(empty)


def test_grouped_names():
    names = [
        "blocks.0.attn.hook_pattern",
        "blocks.1.attn.hook_pattern",
        "ln_final.hook_scale",
        "blocks.10.hook_resid_post",
    ]
    assert grouped_names(names) == {
        "blocks.{L}.attn.hook_pattern": [0, 1],
        "ln_final.hook_scale": [],
        "blocks.{L}.hook_resid_post": [10],
    }


def test_other_results_repr_without_values(gpt2_model):
    from interp.attribution.residual import residual_parts
    from interp.circuits import circuit_weights
    from interp.models.layernorm import fold_info, fold_layernorm

    folded = fold_layernorm(gpt2_model)
    tokens = run_cached(gpt2_model, "a b c").tokens
    for obj in (
        fold_info(folded),
        circuit_weights(gpt2_model),
        residual_parts(folded, tokens, 2, neurons=False),
    ):
        text = repr(obj)
        assert_no_tensor_values(text)
        assert len(text) < 400, text


def test_path_patch_result_summary(gpt2_model):
    from interp.interventions.paths import path_patch_senders

    clean = torch.tensor([[0, 5, 6, 7, 8]])
    corrupted = torch.tensor([[0, 9, 10, 11, 8]])
    result = path_patch_senders(
        gpt2_model, clean, corrupted, receivers=["logits"], metric=lambda logits: logits[:, -1, 3]
    )
    text = repr(result)
    assert_no_tensor_values(text)
    best = result.table.loc[result.table["recovered"].abs().idxmax()]
    assert f"{best['sender']}: {best['recovered']:.4g}" in text
    page = result._repr_html_()
    rows = Rows(page).rows
    sender = [c for c in result.table.columns if c != "receivers"].index("sender")
    assert rows[0][sender] == best["sender"]  # ranked by |recovered|
    recovered = [abs(float(r[sender - 1])) for r in rows]
    assert recovered == sorted(recovered, reverse=True)
    assert_inert(page)


def test_hostile_strings_stay_text():
    df = pd.DataFrame({HOSTILE[0]: HOSTILE, "value": range(len(HOSTILE))})
    page = summary_html(
        HOSTILE[1],
        {HOSTILE[2]: HOSTILE[3], "prompt": HOSTILE[0]},
        table=table_html(df),
        table_title=HOSTILE[0],
    )
    markup = assert_inert(page)
    assert markup.tags.count("td") == 2 * len(HOSTILE) + 2
    for text in HOSTILE:
        assert text in markup.text


def test_report_is_shown_in_a_sandboxed_frame_holding_the_page():
    report = Report(HOSTILE[0])
    report.add_text(HOSTILE[1])
    report.add_table(pd.DataFrame({"token": HOSTILE}))
    report.add_attention(HOSTILE, torch.eye(len(HOSTILE))[None])
    assert repr(report) == f"Report({HOSTILE[0]!r}: 1 text, 1 table, 1 attention)"
    shown = report._repr_html_()
    markup = Markup(shown)
    assert markup.tags == ["iframe"]  # nothing else reaches the notebook
    attrs = dict(markup.attrs)
    assert attrs["srcdoc"] == report.to_html()  # the page, exactly, CSP and scripts included
    assert attrs["sandbox"] == "allow-scripts"
    assert attrs["title"] == HOSTILE[0]
    assert "<" not in shown.split('srcdoc="', 1)[1].split('"', 1)[0]
    assert shown.count("CircuitsVis") == report.to_html().count("CircuitsVis")
    assert shown.isascii()  # read the same in a page of any encoding


def test_page_iframe_escapes_quotes():
    markup = Markup(page_iframe('<p title="x">"\'</p>', title='"><script>', height=100))
    assert markup.tags == ["iframe"]
    assert dict(markup.attrs)["srcdoc"] == '<p title="x">"\'</p>'


def test_bundled_model_scan_names_its_induction_heads(bundled_model):
    from interp.foundation.formatting import head_names

    result = run_induction_scan(bundled_model)
    heads = head_names(result.table[result.table["is_induction"]])
    assert heads, "the bundled model has induction heads"
    assert f"{len(heads)} of 8 heads are induction heads: {', '.join(heads)}" in repr(result)
    assert ", ".join(heads) in result._repr_html_()


@pytest.mark.browser
def test_reports_render_inline_in_their_frames(browser, tmp_path):
    """Two Report outputs in one notebook-like page, in headless Chromium (offline): each
    frame draws its figures and attention view with no error and no request, the hostile
    one runs nothing, and the page around them holds no script."""
    from interp.pages.plotting import head_heatmap
    from tests.test_browser import CHECKS, PWNED, READY, hostile_report, pattern

    scores = pd.DataFrame(
        [(layer, head, (layer - head) / 3) for layer in range(2) for head in range(4)],
        columns=["layer", "head", "score"],
    )
    full = Report("inline report")
    full.add_figure(head_heatmap(scores, "score"))
    full.add_table(scores)
    full.add_attention([" a", " b", " c", " a"], pattern(4, 4, 0))
    # no charset: the frames must not depend on how the page around them is decoded
    page = (
        "<!DOCTYPE html><html><head><title>notebook</title></head>"
        f'<body><div class="output">{full._repr_html_()}</div>'
        f'<div class="output">{hostile_report()._repr_html_()}</div></body></html>'
    )
    path = tmp_path / "notebook.html"
    path.write_text(page, encoding="ascii")
    top, frames = browser.open_frames(
        path,
        ready_js=READY,
        checks=CHECKS,
        n_frames=2,
        top_checks={"scripts": "document.scripts.length", "pwned": "typeof window.__pwned"},
    )
    assert top.values["ready"], [f.values for f in frames]
    assert top.values["scripts"] == 0 and top.values["pwned"] == "undefined"
    assert top.exceptions == top.errors == top.dialogs == [] and top.network_requests() == []
    assert len(frames) == 2
    by_title = {f.values["title"]: f for f in frames}
    inline, hostile = by_title["inline report"], by_title[PWNED[0]]
    for frame in (inline, hostile):
        assert frame.exceptions == [] and frame.errors == [] and frame.dialogs == []
        assert frame.network_requests() == []
        assert frame.values["render_errors"] == [] and frame.values["pwned"] == "undefined"
        assert frame.values["on_attributes"] == [] and frame.values["foreign"] == 0
        assert frame.values["views"] == 1 and all(n > 200 for n in frame.values["drawn"])
    assert inline.values["figures"] == 1
    assert hostile.values["tokens"] == [PWNED] and hostile.values["h1"] == PWNED[0]
