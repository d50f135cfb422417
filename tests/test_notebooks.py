"""The notebooks in docs/notebooks: committed without outputs; the tour runs top to bottom
in a clean kernel, offline, and its executed page (nbconvert) renders in headless Chromium
with every inline report drawn, no request leaving the page and no console error.

The GPT-2 small notebook needs GPT-2's weights; without them in the local Hugging Face
cache (CI, this machine) its run is skipped with that reason.
"""

from __future__ import annotations

import html
import json
import os
import re
from pathlib import Path

import nbformat
import pytest

from interp.models.loading import _hub_cached
from tests.notebooks import NOTEBOOKS, execute, to_html

EXPECTED = {"tour.ipynb", "gpt2_small.ipynb"}
ARTIFACTS = Path(
    os.environ.get("INTERP_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "test-artifacts")
)

# inside each inline report page (a sandboxed, out-of-process frame): every plotly figure has
# axes and drawn data, every CircuitsVis view its canvases (thumbnails and the zoomed heatmap)
FRAME_READY = """[...document.querySelectorAll('.interp-figure')]
    .every(d => d.querySelector('.xtick') && d.querySelector('.trace, .hm'))
&& [...document.querySelectorAll('.interp-attention')]
    .every(d => d.querySelectorAll('canvas').length > 1)"""
FRAME_CHECKS = {
    "title": "document.title",
    "figures": "[...document.querySelectorAll('.interp-figure.js-plotly-plot')]"
    ".filter(d => d.querySelector('.main-svg') && d.querySelector('.trace, .hm'))"
    ".length",
    "views": "[...document.querySelectorAll('.interp-attention')]"
    ".filter(d => d.children.length && d.querySelectorAll('canvas').length > 1).length",
    "blocks": "document.querySelectorAll('.interp-figure, .interp-attention').length",
    "render_errors": "[...document.querySelectorAll('.interp-error')].map(e => e.textContent)",
}
# the inline pages the tour shows: title -> (plotly figures, attention views)
TITLES = {
    "Attention patterns of tiny-induction": (0, 2),  # one view per layer
    "Induction heads of tiny-induction": (2, 0),
    "Circuits of tiny-induction": (1, 0),
    "Attribution of ' data' vs ' text'": (2, 0),
    "Patching ' data' vs ' text'": (2, 0),
    "Patching over an induction task": (1, 0),
    "Discovering the induction circuit": (2, 0),
}
PAGE_CHECKS = {
    "iframes": "document.querySelectorAll('iframe[sandbox]').length",
    "scripts": "document.scripts.length",
    "errors_shown": "[...document.querySelectorAll('.jp-RenderedText[data-mime-type="
    '"application/vnd.jupyter.stderr"]\')].map(e => e.textContent)'
    ".filter(t => /Error|Traceback/.test(t))",
}


def _notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def test_the_notebooks_are_there():
    assert {p.name for p in _notebooks()} == EXPECTED


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.name)
def test_committed_notebooks_have_no_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"cell {i} has outputs: python -m tests.notebooks {path}"
            assert cell.execution_count is None, f"cell {i} has an execution count"
    assert nb.metadata["kernelspec"]["name"] == "python3"
    checkout = str(Path(__file__).resolve().parents[1])
    assert checkout not in path.read_text(encoding="utf-8"), "a path of this checkout leaked in"


@pytest.fixture(scope="module")
def tour(tmp_path_factory, fork_server):
    """The tour, executed once (its kernel forked from the warm server); its HTML page."""
    nb = execute(NOTEBOOKS / "tour.ipynb", server=fork_server)
    out = tmp_path_factory.mktemp("tour")
    nbformat.write(nb, out / "tour.ipynb")
    page = out / "tour.html"
    page.write_text(to_html(nb, "interp tour"), encoding="utf-8")
    return nb, page


@pytest.mark.slow
def test_tour_runs_in_a_clean_kernel(tour):
    nb, _ = tour
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    for cell in code:
        assert not [o for o in cell.outputs if o.output_type == "error"]
    text = "\n".join(o.get("text", "") for c in code for o in c.outputs)
    assert "refused:" in text  # the reference model refuses the rotary bundled model
    assert "induction heads: ['L1H" in text
    assert "EAP-IG against exact over every edge: correlation" in text
    assert "the circuit without its edges into keys: faithfulness" in text
    assert "SAE(topk, blocks.1.hook_resid_pre" in text and "of which the top SAE rows" in text


def _page_sources(nb) -> list[str]:
    return [
        o.data["text/html"]
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if "<iframe srcdoc=" in o.get("data", {}).get("text/html", "")
    ]


@pytest.mark.slow
def test_tour_page_loads_nothing_from_the_network(tour):
    nb, page = tour
    text = page.read_text(encoding="utf-8")
    outside = re.sub(r'srcdoc="[^"]*"', 'srcdoc=""', text)  # the notebook page itself
    assert "<script" not in outside  # nbconvert's basic fragment: no script of its own
    assert not re.search(r'<(?:link|img|iframe|script)\b[^>]*\b(?:src|href)="(?!#)', outside)
    # each inline page is an interp Report: a Content-Security-Policy with no network at all
    frames = _page_sources(nb)
    assert len(frames) == len(TITLES)
    for source in frames:
        assert 'sandbox="allow-scripts"' in source
        inner = html.unescape(re.search(r'srcdoc="([^"]*)"', source).group(1))
        csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', inner)
        policy = html.unescape(csp.group(1))
        assert "default-src 'none'" in policy and "connect-src 'none'" in policy, policy


@pytest.mark.slow
@pytest.mark.browser
def test_tour_page_renders_in_a_browser(tour, browser):
    _, page = tour
    default, browser.timeout_s = browser.timeout_s, 90  # seven frames of plotly and CircuitsVis
    try:
        top, frames = browser.open_frames(
            page,
            ready_js=FRAME_READY,
            checks=FRAME_CHECKS,
            top_checks=PAGE_CHECKS,
            n_frames=len(TITLES),
            settle_s=1.0,
        )
    finally:
        browser.timeout_s = default
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "tour-result.json").write_text(
        json.dumps({"top": top.values, "frames": [f.values for f in frames]}, indent=1)
    )
    assert top.values["ready"], [f.values for f in frames]
    assert top.exceptions == top.errors == top.dialogs == [], top
    assert top.network_requests() == []
    assert top.values["scripts"] == 0  # the notebook page runs nothing; only its frames do
    assert top.values["errors_shown"] == []
    assert top.values["iframes"] == len(frames) == len(TITLES)  # every inline page watched
    by_title = {f.values["title"]: f for f in frames}
    assert sorted(by_title) == sorted(TITLES), list(by_title)
    for frame in frames:
        assert frame.exceptions == frame.errors == frame.dialogs == [], frame
        assert frame.network_requests() == [], frame
        values = frame.values
        assert values["render_errors"] == [] and values["blocks"] > 0, values
        assert values["figures"] + values["views"] == values["blocks"], values
    for title, (figures, views) in TITLES.items():
        assert (by_title[title].values["figures"], by_title[title].values["views"]) == (
            figures,
            views,
        ), title


@pytest.mark.weights
@pytest.mark.slow
@pytest.mark.skipif(
    not _hub_cached("gpt2", "config.json"),
    reason="GPT-2 weights are not in the local Hugging Face cache (no hub "
    "access here); load 'gpt2' once online to run gpt2_small.ipynb",
)
def test_gpt2_small_notebook_runs():
    nb = execute(NOTEBOOKS / "gpt2_small.ipynb", timeout_s=600)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not [o for o in cell.outputs if o.output_type == "error"]


@pytest.mark.slow
def test_gpt2_small_notebook_rehearsal(tmp_path, fork_server):
    """Without the weights, every cell of gpt2_small.ipynb still runs on a random checkpoint of
    GPT-2 small's layout (12 layers of 12 heads, so every head the notebook names exists), with
    the one check that needs the real weights (the known induction heads rank top) left out:
    the code is right, only the findings need GPT-2 itself. d_model is 48 (d_head 4), not 768:
    no cell depends on the width, and the IOI task's patching of every head (144 heads x 32
    rows) costs the square of it: 93 s of CPU at d_model 192, 24 s at 48. The IOI task has 8
    rows here, not 32: the cell's code is the same (a task of several rows, patched in one
    grid), only its mean is over fewer rows, and nothing here reads the mean."""
    from tests.checkpoints import make_checkpoint

    model_dir = make_checkpoint(
        tmp_path / "gpt2-small-layout",
        arch="gpt2",
        n_layers=12,
        n_heads=12,
        d_model=48,
        n_ctx=128,
        vocab_size=1000,
    )
    nb = nbformat.read(NOTEBOOKS / "gpt2_small.ipynb", as_version=4)
    swaps = {
        'load_model("gpt2", device="cpu")': f'load_model({str(model_dir)!r}, device="cpu")',
        "assert known <= top, table.head(10)": "pass  # random weights: no induction",
        # the random checkpoint's tokenizer (420 tokens trained on a few sentences) keeps two
        # of ioi's names whole, too few; these seven words are single tokens there
        "ioi = interp.tasks.ioi(model, 32, seed=0)": "ioi = interp.tasks.ioi(model, 8, seed=0, "
        "names=['John', 'Mary', 'cat', 'dog', 'bird', 'token', 'byte'])",
    }
    for old, new in swaps.items():
        assert sum(c.source.count(old) for c in nb.cells) == 1, old
        for cell in nb.cells:
            cell.source = cell.source.replace(old, new)
    path = tmp_path / "gpt2_small.ipynb"
    nbformat.write(nb, path)
    done = execute(path, timeout_s=600, server=fork_server)
    code = [c for c in done.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    assert len(_page_sources(done)) == 4
