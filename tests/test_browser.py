"""Generated pages in a real browser (headless Chromium, network off): every view renders,
no script error, no request leaves the page, hostile text never runs. Screenshots are kept
under test-artifacts/ (or $INTERP_TEST_ARTIFACTS).

Chromium comes from .ci/install_chromium.sh; without it these tests skip, unless
INTERP_REQUIRE_BROWSER=1 (CI sets it), where a missing browser fails them. One browser serves
the whole run: the ``browser`` fixture in conftest.py.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

from interp.pages.html import Report
from interp.pages.plotting import (
    attention_heatmap,
    attribution_bars,
    head_heatmap,
    logit_lens_lines,
    loss_by_position,
)
from tests.browser import Chromium

pytestmark = pytest.mark.browser

ARTIFACTS = Path(
    os.environ.get("INTERP_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "test-artifacts")
)

# set by the injected payloads if any of them ever runs
PWNED = [
    "</script><script>window.__pwned=1;document.title='pwned';alert(1)</script>",
    '<img src=x onerror="window.__pwned=2;alert(2)">',
    '<svg onload="window.__pwned=3"></svg>',
    "\"'&amp;",
    "line\u2028sep\u2029end",
]

# every figure plotted (axes with ticks, data drawn: traces or heatmap images) and every
# attention view drawn (head thumbnails and the zoomed heatmap are canvases)
READY = """
[...document.querySelectorAll('.interp-figure')]
    .every(d => d.querySelector('.xtick') && d.querySelector('.trace, .hm'))
&& [...document.querySelectorAll('.interp-attention')]
    .every(d => d.querySelectorAll('canvas').length > 1)
"""

CHECKS = {
    "figures": "[...document.querySelectorAll('.interp-figure.js-plotly-plot')]"
    ".filter(d => d.querySelector('.xtick') && d.querySelector('.trace, .hm')).length",
    "views": "[...document.querySelectorAll('.interp-attention')]"
    ".filter(d => d.querySelectorAll('canvas').length > 1).length",
    # the zoomed heatmap of each view really has coloured pixels
    "drawn": """[...document.querySelectorAll('.interp-attention')].map(d => {
        const c = [...d.querySelectorAll('canvas')].at(-1);
        const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < px.length; i += 4)
            if (px[i + 3] && !(px[i] > 250 && px[i + 1] > 250 && px[i + 2] > 250)) n++;
        return n; })""",
    "render_errors": "[...document.querySelectorAll('.interp-error')].map(e => e.textContent)",
    "pwned": "typeof window.__pwned",
    "title": "document.title",
    "h1": "document.querySelector('h1').textContent",
    "cells": "[...document.querySelectorAll('td')].map(e => e.textContent)",
    # elements no report makes itself (plotly draws svg in its plot divs and measures text
    # in one hidden svg of its own)
    "foreign": "[...document.querySelectorAll('img, iframe, object, embed, svg, a, form')]"
    ".filter(e => !e.closest('.js-plotly-plot, #js-plotly-tester')).length",
    "on_attributes": "[...document.querySelectorAll('*')].filter(e => [...e.attributes]"
    ".some(a => a.name.startsWith('on'))).map(e => e.outerHTML.slice(0, 80))",
    "svg_text": "[...document.querySelectorAll('.main-svg text')].map(t => t.textContent)",
    "tokens": "[...document.querySelectorAll('script[data-interp-kind=attention]')]"
    ".map(s => JSON.parse(s.textContent).tokens)",
}


def open_page(browser: Chromium, path: Path, name: str, **kwargs):
    result = browser.open(
        path, ready_js=READY, checks=CHECKS, screenshot=ARTIFACTS / f"{name}.png", **kwargs
    )
    shutil.copyfile(path, ARTIFACTS / f"{name}.html")
    return result


def assert_clean(result) -> None:
    assert result.values["ready"], f"views did not render: {result.values}"
    assert result.exceptions == []
    assert result.errors == []
    assert result.network_requests() == []
    assert result.dialogs == []
    assert result.values["render_errors"] == []
    assert result.values["pwned"] == "undefined"
    assert result.values["on_attributes"] == []
    assert result.values["foreign"] == 0


def pattern(n_heads: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(n_heads, n, n, generator=g) * 2
    return scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -torch.inf).softmax(-1)


def test_full_report_renders_offline(browser, tmp_path):
    scores = pd.DataFrame(
        [(layer, head, (layer - head) / 3) for layer in range(4) for head in range(4)],
        columns=["layer", "head", "score"],
    )
    tokens = ["<|endoftext|>", " When", " Mary", " and", " John", " went", " Mary", "\n"]
    report = Report("Everything on one page")
    report.add_text("All figure kinds, a table and two attention views.")
    report.add_figure(head_heatmap(scores, "score", title="scores"), caption="heatmap")
    report.add_figure(loss_by_position(torch.rand(3, 8), tokens=tokens, marks={4: "half"}))
    report.add_figure(attribution_bars(scores.assign(attribution=scores.score), top_k=6))
    report.add_figure(
        logit_lens_lines(
            pd.DataFrame(
                {
                    "layer": [0, 1, 2] * 2,
                    "token": [" Mary"] * 3 + [" John"] * 3,
                    "logit": [1, 2, 4, 1, 1, 0.5],
                }
            )
        )
    )
    report.add_figure(attention_heatmap(pattern(1, 8, 0)[0], tokens))
    report.add_table(scores, caption="scores", max_rows=5)
    report.add_attention(tokens, pattern(4, 8, 1), head_names=[f"L0H{h}" for h in range(4)])
    report.add_attention(tokens, pattern(4, 8, 2), head_names=[f"L1H{h}" for h in range(4)])
    result = open_page(browser, report.write(tmp_path / "report.html"), "report")
    assert_clean(result)
    assert result.values["figures"] == 5
    assert result.values["views"] == 2
    assert all(n > 1000 for n in result.values["drawn"]), result.values["drawn"]
    assert " Mary" in result.values["svg_text"]
    assert (ARTIFACTS / "report.png").stat().st_size > 10_000


def hostile_report() -> Report:
    report = Report(PWNED[0])
    for text in PWNED:
        report.add_heading(text)
        report.add_text(text)
    report.add_table(pd.DataFrame({PWNED[1]: PWNED, "value": range(len(PWNED))}))
    report.add_figure(attention_heatmap(pattern(1, len(PWNED), 3)[0], PWNED, title=PWNED[1]))
    report.add_figure(go.Figure(go.Bar(x=PWNED, y=[1] * len(PWNED))), caption=PWNED[2])
    report.add_attention(PWNED, pattern(2, len(PWNED), 4), head_names=PWNED[:2])
    return report


@pytest.mark.parametrize("csp", ["csp", "no-csp"])
def test_hostile_text_never_runs(browser, tmp_path, csp):
    """With the page's CSP, and with it bypassed: escaping alone must keep scripts out."""
    path = hostile_report().write(tmp_path / "hostile.html")
    result = open_page(browser, path, f"hostile-{csp}", bypass_csp=csp == "no-csp")
    assert_clean(result)
    assert result.values["title"] == PWNED[0]
    assert result.values["h1"] == PWNED[0]
    assert result.values["cells"][::2] == PWNED
    assert result.values["tokens"] == [PWNED]
    # the figure's tick labels show the tokens literally (plotly read no markup from them)
    assert PWNED[1] in result.values["svg_text"] and PWNED[2] in result.values["svg_text"]


def hostile_checkpoint(directory: Path) -> Path:
    """A GPT-2 checkpoint whose tokenizer's tokens are the hostile strings themselves."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tests.checkpoints import SPECIAL, make_checkpoint

    make_checkpoint(directory, arch="gpt2", with_tokenizer=False)
    vocab = {SPECIAL: 0} | {text: i + 1 for i, text in enumerate(PWNED)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("\n"), behavior="removed")
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=SPECIAL, eos_token=SPECIAL, unk_token=SPECIAL
    ).save_pretrained(directory)
    return directory


def test_attention_command_with_a_hostile_tokenizer(browser, tmp_path):
    from interp.cli import main

    model_dir = hostile_checkpoint(tmp_path / "hostile-model")
    out = tmp_path / "attention.html"
    prompt = "\n".join(PWNED + PWNED[:2])
    assert (
        main(["attention", "--model", str(model_dir), "--prompt", prompt, "--out", str(out)]) == 0
    )
    result = open_page(browser, out, "attention-command")
    assert_clean(result)
    assert result.values["views"] == 2  # one per layer
    assert all(n > 1000 for n in result.values["drawn"])
    expected = ["<|endoftext|>"] + PWNED + PWNED[:2]  # GPT-2 prepends BOS
    assert result.values["tokens"] == [expected, expected]


def test_the_harness_sees_requests_errors_and_dialogs(browser, tmp_path):
    """The checks above can fail: a page that does all the bad things is caught."""
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><body>"
        "<div class='interp-figure'><i class='xtick'></i><i class='trace'></i></div><img src='http://example.invalid/pixel.png'>"
        "<script>window.__pwned = 1; fetch('https://example.invalid/x').catch(() => {});"
        "alert('hi'); console.error('logged'); throw new Error('boom');</script>"
        "</body></html>",
        encoding="utf-8",
    )
    result = browser.open(page, ready_js=READY, checks=CHECKS)
    assert any("example.invalid/pixel.png" in u for u in result.network_requests())
    assert any("example.invalid/x" in u for u in result.network_requests())
    assert result.dialogs == ["alert: hi"]
    assert any("boom" in e for e in result.exceptions)
    assert any("logged" in e for e in result.errors)
    assert result.values["pwned"] == "number"
    assert result.values["foreign"] == 1
    assert json.dumps(result.values["tokens"]) == "[]"
