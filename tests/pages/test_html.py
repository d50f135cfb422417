"""Reports: structure, escaping of hostile text, scripts inlined once, atomic writes, and the
``interp attention`` command (the browser checks are in test_browser.py)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

import interp.pages.assets as page_assets
import interp.pages.html as ih
from interp.foundation.files import write_text_atomic
from interp.pages.assets import script_json
from interp.pages.html import Report

HOSTILE = [
    "</script><script>window.__pwned=1;document.title='pwned';alert(1)</script>",
    '<img src=x onerror="window.__pwned=2;alert(2)">',
    "\"'&amp;&lt;",
    "line\u2028sep\u2029para",
    "<!--<script>",
    "</SCRIPT ><svg onload=alert(3)>",
    "<b>bold</b>",
]
# tags a report may contain; anything else (img, svg, b, iframe...) came from data
ALLOWED_TAGS = {
    "html",
    "head",
    "meta",
    "title",
    "style",
    "body",
    "main",
    "h1",
    "h2",
    "p",
    "figure",
    "figcaption",
    "div",
    "script",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
}


class PageParser(HTMLParser):
    """Collects tags, attributes, scripts and the text of each element, as a browser would
    tokenise the page (script content is raw text up to the first ``</script``)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[tuple[dict, str]] = []
        self.text: dict[str, list[str]] = {}
        self._stack: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag not in ("meta",):
            self._stack.append((tag, attrs))
            if tag in ("script", "title", "h1", "h2", "p", "td", "th", "figcaption"):
                self.text.setdefault(tag, []).append("")

    def handle_endtag(self, tag):
        if self._stack and self._stack[-1][0] == tag:
            self._stack.pop()

    def handle_data(self, data):
        if not self._stack:
            return
        tag, attrs = self._stack[-1]
        if tag == "script":
            self.scripts.append((attrs, data))
        if tag in self.text:
            self.text[tag][-1] += data


def parse(page: str) -> PageParser:
    parser = PageParser()
    parser.feed(page)
    parser.close()
    return parser


def executable(parser: PageParser) -> list[str]:
    return [body for attrs, body in parser.scripts if "type" not in attrs]


def data_blocks(parser: PageParser, kind: str) -> list:
    return [
        json.loads(body)
        for attrs, body in parser.scripts
        if attrs.get("type") == "application/json" and attrs.get("data-interp-kind") == kind
    ]


def pattern(n_heads: int, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(n_heads, n, n, generator=g)
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1)


def hostile_report() -> Report:
    report = Report(HOSTILE[0])
    for text in HOSTILE:
        report.add_heading(text)
        report.add_text(text)
    report.add_table(
        pd.DataFrame({"layer": [0, 1], "head": [2, 3], HOSTILE[1]: [HOSTILE[2], HOSTILE[5]]}),
        caption=HOSTILE[4],
    )
    report.add_figure(
        go.Figure(
            go.Bar(x=HOSTILE, y=list(range(len(HOSTILE))), name=HOSTILE[1]),
            layout={"title": HOSTILE[0]},
        ),
        caption=HOSTILE[3],
    )
    report.add_attention(
        HOSTILE, pattern(2, len(HOSTILE)), head_names=HOSTILE[:2], caption=HOSTILE[6]
    )
    return report


# -- escaping ---------------------------------------------------------------------------------


def test_script_json_round_trips_and_cannot_close_a_script():
    value = {"tokens": HOSTILE, HOSTILE[0]: [1.5, None, True]}
    text = script_json(value)
    assert json.loads(text) == value
    for bad in ("<", ">", "&", "\u2028", "\u2029"):
        assert bad not in text
    with pytest.raises(ValueError):
        script_json([float("nan")])


def test_hostile_text_stays_text_everywhere():
    page = hostile_report().to_html()
    parser = parse(page)
    assert {tag for tag, _ in parser.tags} <= ALLOWED_TAGS
    assert not [(t, a) for t, a in parser.tags for name in a if name.startswith("on")]
    # each visible text is the hostile string itself, not markup
    assert parser.text["title"] == [HOSTILE[0]]
    assert parser.text["h1"] == [HOSTILE[0]]
    assert parser.text["h2"] == HOSTILE
    assert [t for t in parser.text["p"] if t in HOSTILE] == HOSTILE
    assert HOSTILE[1] in parser.text["th"]
    assert {HOSTILE[2], HOSTILE[5]} <= set(parser.text["td"])
    assert set(parser.text["figcaption"]) == {HOSTILE[3], HOSTILE[4], HOSTILE[6]}
    # the data blocks hold the same strings (as a browser's JSON.parse would read them)
    (attention,) = data_blocks(parser, "attention")
    assert attention["tokens"] == HOSTILE
    assert attention["attentionHeadNames"] == HOSTILE[:2]
    (figure,) = data_blocks(parser, "figure")
    assert figure["data"][0]["x"] == HOSTILE
    assert figure["layout"]["title"]["text"] == HOSTILE[0]
    # only the page's own three scripts can run
    assert executable(parser) == [ih.plotly_js(partial=True), ih.circuitsvis_js(), ih._BOOTSTRAP]


def test_each_library_is_inlined_once_however_many_views():
    report = Report("many")
    for i in range(3):
        report.add_figure(go.Figure(go.Scatter(y=[i, i + 1])))
        report.add_attention(["a", "b", "c"], pattern(2, 3, seed=i))
    page = report.to_html()
    parser = parse(page)
    assert executable(parser) == [ih.plotly_js(partial=True), ih.circuitsvis_js(), ih._BOOTSTRAP]
    assert len(data_blocks(parser, "figure")) == 3
    assert len(data_blocks(parser, "attention")) == 3
    # the library text itself appears once in the file, not per view
    assert page.count(ih.plotly_js(partial=True)[:2000]) == 1
    assert page.count(ih.circuitsvis_js()[:2000]) == 1
    targets = [a["data-interp-target"] for a, _ in parser.scripts if "data-interp-target" in a]
    ids = [a["id"] for t, a in parser.tags if t == "div" and "id" in a]
    assert sorted(targets) == sorted(ids) and len(set(ids)) == 6


def test_pages_carry_only_the_scripts_they_need():
    table_only = Report("t")
    table_only.add_table(pd.DataFrame({"a": [1]}))
    assert executable(parse(table_only.to_html())) == []
    figures_only = Report("f")
    figures_only.add_figure(go.Figure())
    assert executable(parse(figures_only.to_html())) == [ih.plotly_js(partial=True), ih._BOOTSTRAP]
    attention_only = Report("a")
    attention_only.add_attention(["x"], torch.ones(1, 1, 1))
    assert executable(parse(attention_only.to_html())) == [ih.circuitsvis_js(), ih._BOOTSTRAP]


def csp_of(page: str) -> dict[str, list[str]]:
    parser = parse(page)
    (content,) = [
        a["content"]
        for t, a in parser.tags
        if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"
    ]
    return {part.split()[0]: part.split()[1:] for part in content.split(";") if part.strip()}


def test_csp_allows_exactly_the_page_scripts_and_no_network():
    page = hostile_report().to_html()
    csp = csp_of(page)
    hashes = [
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
        for s in executable(parse(page))
    ]
    assert csp["script-src"] == hashes
    assert csp["default-src"] == ["'none'"]
    assert csp["connect-src"] == ["'none'"]
    assert "'unsafe-inline'" not in csp["script-src"] and "'unsafe-eval'" not in csp["script-src"]
    empty = Report("nothing").to_html()
    assert csp_of(empty)["script-src"] == ["'none'"]


def test_inlined_libraries_cannot_end_their_script_element():
    assert (
        page_assets._inline_script('a="</script>";b="</SCRIPT >"')
        == 'a="<\\/script>";b="<\\/SCRIPT >"'
    )
    assert page_assets._inline_script("x()\n//# sourceMappingURL=x.js.map\n") == "x()\n"
    with pytest.raises(ValueError, match="<!--"):
        page_assets._inline_script("s='<!--'")
    for source in (ih.plotly_js(), ih.plotly_js(partial=True), ih.circuitsvis_js()):
        assert re.search("</script", source, re.IGNORECASE) is None
        assert "sourceMappingURL" not in source


# -- blocks -------------------------------------------------------------------------------


def test_table_formats_escapes_and_truncates():
    df = pd.DataFrame(
        {
            "layer": range(60),
            "score": [0.123456789] * 59 + [float("nan")],
            "flag": [True] * 60,
            "note": ["<i>x</i>"] * 60,
        }
    )
    report = Report("t")
    report.add_table(df, caption="c", max_rows=5)
    parser = parse(report.to_html())
    assert parser.text["th"] == ["layer", "score", "flag", "note"]
    assert parser.text["td"][:4] == ["0", "0.1235", "True", "<i>x</i>"]
    assert len(parser.text["td"]) == 5 * 4
    assert "showing the first 5 of 60 rows" in parser.text["p"]
    named = Report("n")
    named.add_table(df.tail(1).set_index("layer"))
    parser = parse(named.to_html())
    assert parser.text["th"][0] == "layer" and parser.text["td"][:2] == ["59", "NaN"]


def test_add_attention_checks_its_inputs():
    report = Report("x")
    with pytest.raises(ValueError, match="head, q_pos, k_pos"):
        report.add_attention(["a"], torch.ones(1, 1))
    with pytest.raises(ValueError, match="2 tokens"):
        report.add_attention(["a", "b"], torch.ones(1, 3, 3))
    with pytest.raises(ValueError, match="1 head names for 2 heads"):
        report.add_attention(["a"], torch.ones(2, 1, 1), head_names=["L0H0"])
    with pytest.raises(ValueError, match="finite"):
        report.add_attention(["a"], torch.full((1, 1, 1), float("nan")))
    with pytest.raises(TypeError, match="Figure"):
        report.add_figure({"data": []})
    with pytest.raises(TypeError, match="DataFrame"):
        report.add_table([[1]])


def test_attention_values_are_kept_to_the_shown_precision():
    p = pattern(3, 5)
    report = Report("x")
    report.add_attention([str(i) for i in range(5)], p)
    (block,) = data_blocks(parse(report.to_html()), "attention")
    got = torch.tensor(block["attention"], dtype=torch.float64)
    assert got.shape == (3, 5, 5)
    # rounding to ATTENTION_DECIMALS moves a weight by at most half a unit in that place
    assert (got - p.double()).abs().max() <= 0.5 * 10**-ih.ATTENTION_DECIMALS + 1e-12
    assert block["attentionHeadNames"] == ["H0", "H1", "H2"]
    assert block["maskUpperTri"] is True  # causal: the upper triangle is the mask
    bidirectional = Report("b")
    bidirectional.add_attention(["a", "b"], torch.full((1, 2, 2), 0.5))
    (block,) = data_blocks(parse(bidirectional.to_html()), "attention")
    assert block["maskUpperTri"] is False  # weights above the diagonal are shown, not hidden


def test_figures_are_snapshots():
    fig = go.Figure(go.Scatter(y=[1, 2]))
    report = Report("x")
    report.add_figure(fig)
    fig.data[0].y = [5, 6]
    (block,) = data_blocks(parse(report.to_html()), "figure")
    assert block["data"][0]["y"] == [1, 2]
    assert block["config"]["displaylogo"] is False


# -- atomic writes ---------------------------------------------------------------------------


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_write_is_complete_and_leaves_no_temp_file(tmp_path):
    out = Report("ok").write(tmp_path / "sub" / "page.html")
    assert out == tmp_path / "sub" / "page.html"
    assert out.read_text(encoding="utf-8") == Report("ok").to_html()
    assert leftovers(out.parent) == ["page.html"]
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


def test_render_error_midway_writes_nothing(tmp_path, monkeypatch):
    report = Report("x")
    report.add_table(pd.DataFrame({"a": [1]}))
    report.add_figure(go.Figure())  # to_html fetches plotly.js after the blocks are rendered

    def boom(partial=False):
        raise RuntimeError("interrupted while rendering")

    monkeypatch.setattr(ih, "plotly_js", boom)
    with pytest.raises(RuntimeError, match="interrupted"):
        report.write(tmp_path / "page.html")
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_interrupted_write_keeps_the_old_file(tmp_path, monkeypatch, error):
    target = tmp_path / "page.html"
    target.write_text("old page", encoding="utf-8")
    seen = {}

    def interrupted(src, dst):
        seen["tmp"] = Path(src).read_bytes()  # the new page was fully written to the temp file
        raise error

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(type(error)):
        write_text_atomic(target, "new page")
    monkeypatch.undo()
    assert seen["tmp"] == b"new page"
    assert target.read_text(encoding="utf-8") == "old page"
    assert leftovers(tmp_path) == ["page.html"]


def test_failed_fsync_and_unencodable_text_write_nothing(tmp_path, monkeypatch):
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(tmp_path / "a.html", "lone surrogate \ud800")

    def no_fsync(fd):
        raise OSError("fsync failed")

    monkeypatch.setattr(os, "fsync", no_fsync)
    with pytest.raises(OSError, match="fsync"):
        write_text_atomic(tmp_path / "b.html", "text")
    monkeypatch.undo()
    assert leftovers(tmp_path) == []
    with pytest.raises(IsADirectoryError):
        write_text_atomic(tmp_path, "text")


# -- the attention command ----------------------------------------------------------------------


def test_attention_command_writes_one_view_per_layer(neox_dir, tmp_path, capsys):
    from interp.cli import main

    out = tmp_path / "attention.html"
    prompt = "The cat sat on the mat. The cat sat on </script><b>"
    assert main(["attention", "--model", str(neox_dir), "--prompt", prompt, "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    parser = parse(out.read_text(encoding="utf-8"))
    views = data_blocks(parser, "attention")
    assert len(views) == 2  # the fixture has 2 layers
    assert views[1]["attentionHeadNames"] == ["L1H0", "L1H1", "L1H2", "L1H3"]
    assert executable(parser) == [ih.circuitsvis_js(), ih._BOOTSTRAP]
    assert any(prompt in p for p in parser.text["p"])
    # the tokens join back to the prompt (NeoX prepends no BOS) and rows are distributions
    assert "".join(views[0]["tokens"]) == prompt
    weights = torch.tensor(views[0]["attention"], dtype=torch.float64)
    n = len(views[0]["tokens"])
    assert weights.shape == (4, n, n)
    assert torch.allclose(
        weights.sum(-1),
        torch.ones(4, n, dtype=torch.float64),
        atol=n * 0.5 * 10**-ih.ATTENTION_DECIMALS,
    )
    assert (weights.triu(1) == 0).all()  # causal: nothing attends to later tokens


def test_attention_command_layers_and_errors(neox_dir, tmp_path, capsys):
    from interp.cli import main

    out = tmp_path / "one.html"
    assert (
        main(
            [
                "attention",
                "--model",
                str(neox_dir),
                "--prompt",
                "a b a b",
                "--out",
                str(out),
                "--layers",
                "1",
            ]
        )
        == 0
    )
    (view,) = data_blocks(parse(out.read_text(encoding="utf-8")), "attention")
    assert view["attentionHeadNames"][0] == "L1H0"
    bad = tmp_path / "bad.html"
    assert (
        main(
            [
                "attention",
                "--model",
                str(neox_dir),
                "--prompt",
                "a",
                "--out",
                str(bad),
                "--layers",
                "7",
            ]
        )
        == 2
    )
    assert "--layers 7: at most 1 (the model has 2 layers" in capsys.readouterr().err
    assert main(["attention", "--model", str(neox_dir), "--prompt", "", "--out", str(bad)]) == 2
    assert "empty" in capsys.readouterr().err
    assert not bad.exists()
    assert leftovers(tmp_path) == ["one.html"]
