"""The fixed parts of every interp page (:mod:`interp.pages.html`): its Content-Security-Policy, its
style sheet, the one bootstrap script that draws the figures and attention views from their
JSON data blocks, and plotly's configuration. No data is ever spliced into any of them."""

from __future__ import annotations

__all__: list[str] = []  # private to interp.pages.html, which imports them

# no network, no plugins, no frames; scripts only by hash (filled in per page).
# 'unsafe-inline' styles: plotly inserts <style> elements and React sets style attributes.
_CSP = (
    "default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src data:; connect-src 'none'; worker-src 'none'; "
    "frame-src 'none'; object-src 'none'; base-uri 'none'; form-action 'none'"
)

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
       color: #1f2328; background: #fff; }
main { max-width: 1100px; margin: 0 auto; padding: 24px; }
h1 { font-size: 1.6em; margin: 0.2em 0 0.6em; }
h2 { font-size: 1.25em; margin: 1.4em 0 0.5em; border-bottom: 1px solid #d0d7de; }
p { line-height: 1.5; white-space: pre-wrap; overflow-wrap: anywhere; }
figure { margin: 1em 0; }
figcaption { color: #57606a; font-size: 0.92em; margin-top: 0.3em; white-space: pre-wrap; }
.interp-table { width: fit-content; max-width: 100%; max-height: 32em; overflow: auto;
                border: 1px solid #d0d7de; }
table { border-collapse: separate; border-spacing: 0; font-size: 0.9em;
        font-variant-numeric: tabular-nums; }
th, td { border-right: 1px solid #d0d7de; border-bottom: 1px solid #d0d7de;
         padding: 3px 8px; text-align: right; white-space: pre; }
th { background: #f6f8fa; position: sticky; top: 0; z-index: 1; }
td.text { text-align: left; }
.interp-note { color: #57606a; font-size: 0.85em; }
.interp-error { color: #b42318; font-weight: 600; }
.interp-warning { border: 2px solid #bf8700; background: #fff8c5; border-radius: 6px;
                  padding: 0.6em 1em; margin: 1em 0; }
.interp-warning li { line-height: 1.5; margin: 0.3em 0; }
.interp-attention { min-height: 120px; }
.interp-tokens { font-family: ui-monospace, monospace; font-size: 0.9em; margin: 2px 0; }
.interp-token { white-space: pre; }
""".strip()

# Reads every data block and renders it. Fixed text: no data is ever spliced into it.
_BOOTSTRAP = """
(function () {
  "use strict";
  function fail(target, kind, err) {
    var p = document.createElement("p");
    p.className = "interp-error";
    p.textContent = "could not render this " + kind + ": " + err;
    target.appendChild(p);
    console.error(err);
  }
  var blocks = document.querySelectorAll('script[type="application/json"][data-interp-kind]');
  for (var i = 0; i < blocks.length; i++) {
    var block = blocks[i];
    var kind = block.getAttribute("data-interp-kind");
    var target = document.getElementById(block.getAttribute("data-interp-target"));
    try {
      var spec = JSON.parse(block.textContent);
      if (kind === "figure") {
        Plotly.newPlot(target, spec.data || [], spec.layout || {}, spec.config || {});
      } else if (kind === "attention") {
        CircuitsVis.render(target.id, CircuitsVis.AttentionHeads, spec);
      } else {
        throw new Error("unknown view kind " + kind);
      }
    } catch (err) {
      fail(target, kind, err);
    }
  }
})();
""".strip()

_PLOTLY_CONFIG = {
    "displaylogo": False,
    "responsive": True,
    "showLink": False,
    "showSendToCloud": False,
    "showEditInChartStudio": False,
}
