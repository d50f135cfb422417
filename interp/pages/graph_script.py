"""The script of the graph explorer page (:mod:`interp.pages.graph`): fixed text, no data ever
spliced in. It reads the page's one JSON data block; :mod:`interp.pages.graph_view` lays out,
draws, zooms and filters the graph (SVG built with DOM calls), and the part here fills the
panel of a clicked node and keeps supernodes. Every token string reaches the page as
``textContent`` only, never as markup. ``document.body.dataset.ready`` is set when the graph is
drawn, ``readyMs`` to ``performance.now()`` then (the page's load time, for the benchmark)."""

from __future__ import annotations

from interp.pages.graph_view import VIEW_JS

__all__: list[str] = []  # private to interp.pages.graph

_PANEL_JS = r"""
  var panel = document.getElementById("interp-graph-panel"), picked = [];
  function listEdges(parent, title, list, end) {
    h("h3", title, parent);
    var sorted = list.slice().sort(byWeight);
    var ul = h("ul", null, parent, "interp-graph-list");
    sorted.slice(0, 12).forEach(function (l) {
      var li = h("li", null, ul);
      h("span", fmt(l.weight), li, l.weight > 0 ? "interp-pos" : "interp-neg");
      h("span", " " + label(byId[l[end]]), li);
      if (carried(l)) {
        li.appendChild(document.createTextNode(" "));
        var b = h("button", "heads", li, "interp-heads-button");
        b.type = "button";
        b.title = "the attention heads carrying this edge";
        b.addEventListener("click", function () { showEdge(l); });
      }
    });
    if (!sorted.length) h("li", "none", ul);
  }
  function tokenPairs(parent, title, pairs) {
    h("h3", title, parent);
    var p = h("p", null, parent, "interp-tokens");
    pairs.forEach(function (pair) {
      h("span", shown(pair[0]), p, "interp-token");
      h("span", " " + fmt(pair[1]) + "  ", p);
    });
  }
  function contexts(parent, list) {
    h("h3", "top contexts", parent);
    list.forEach(function (c) {
      var line = h("div", null, parent, "interp-tokens");
      var top = Math.max.apply(null, c.acts.concat([1e-9]));
      c.tokens.forEach(function (tok, i) {
        var s = h("span", shown(tok), line, "interp-token");
        s.style.background = "rgba(255, 140, 0, " + Math.max(0, c.acts[i] / top).toFixed(3) + ")";
        s.title = fmt(c.acts[i]);
        if (i === c.mark) s.style.outline = "1px solid #1f2328";
      });
    });
  }
  function checks(parent, n) {
    var list = ins[n.node_id].filter(function (l) {
      return byId[l.source].feature_type === FEATURE; });
    if (!list.length) return;
    h("h3", "checks by intervention (frozen replacement model)", parent);
    var ul = h("ul", null, parent, "interp-graph-list");
    list.sort(byWeight);
    list.slice(0, 8).forEach(function (l) {
      var s = byId[l.source], parts = l.source.split("_");
      h("li", "FeatureEdit(layer=" + s.layer + ", feature=" + parts[1] + ", pos=" + s.ctx_idx +
        ", value=0): this node moves by " + fmt(-l.weight), ul);
    });
  }
  // attention (interp graph --attention): an edge's heads, a head's strongest QK pairs
  var qk = {};
  (g.qk || []).forEach(function (e) {
    qk[[e.layer, e.head, e.query_pos, e.key_pos].join(",")] = e; });
  function carried(l) {
    return (l.heads || []).some(function (x) { return x[0] >= 0; }); }
  function itemLabel(id) { return byId[id] ? label(byId[id]) : id; }
  function showEdge(l) {
    panel.textContent = "";
    var s = byId[l.source], t = byId[l.target];
    h("h2", "edge " + label(s) + " \u2192 " + label(t), panel);
    h("p", "weight: " + fmt(l.weight) + "\nquery position (target): " + t.ctx_idx +
      "\nkey position (source): " + s.ctx_idx, panel);
    var back = h("button", "back to " + label(t), panel);
    back.type = "button";
    back.addEventListener("click", function () { show(t); });
    h("h3", "heads carrying it (head loadings, summing to the weight)", panel);
    var ul = h("ul", null, panel, "interp-graph-list interp-edge-heads");
    var box = h("div", null, panel, "interp-qk");
    l.heads.forEach(function (x) {
      var li = h("li", null, ul);
      h("span", fmt(x[2]), li, x[2] > 0 ? "interp-pos" : "interp-neg");
      if (x[0] < 0) { h("span", " residual (no head)", li); return; }
      li.appendChild(document.createTextNode(" "));
      var b = h("button", "L" + x[0] + "H" + x[1], li, "interp-head");
      b.title = "its strongest QK pairs at query " + t.ctx_idx + ", key " + s.ctx_idx;
      b.type = "button";
      b.dataset.head = x[0] + "," + x[1];
      b.addEventListener("click", function () { showQK(box, x[0], x[1], t.ctx_idx, s.ctx_idx); });
    });
    document.body.dataset.edge = l.source + ">" + l.target;
  }
  function showQK(box, layer, head, q, k) {
    box.textContent = "";
    var e = qk[[layer, head, q, k].join(",")], name = "L" + layer + "H" + head;
    h("h3", name + "'s score at query " + q + ", key " + k, box);
    if (!e) {
      h("p", "Not decomposed: graph.json keeps the QK pairs of its " + (g.qk || []).length +
        " strongest (head, query, key) only (interp.graphs.qk.qk_attribution computes any).",
        box, "interp-note");
    } else {
      h("p", "pre-softmax score " + fmt(e.score) + " (before any soft cap), a sum over " +
        "pairs (query-side node \u00d7 key-side node); the " + e.pairs.length + " largest:", box);
      var ul = h("ul", null, box, "interp-graph-list interp-qk-pairs");
      e.pairs.forEach(function (p) {
        var li = h("li", null, ul);
        h("span", fmt(p[2]), li, p[2] > 0 ? "interp-pos" : "interp-neg");
        h("span", " " + itemLabel(p[0]) + " \u00d7 " + itemLabel(p[1]), li);
      });
    }
    document.body.dataset.head = layer + "," + head;
  }
  function show(n) {
    panel.textContent = "";
    h("h2", label(n), panel);
    var facts = h("p", null, panel);
    facts.textContent = "kind: " + (KIND[n.feature_type] || n.feature_type) +
      "\nactivation: " + fmt(n.activation) + "\ninfluence: " + fmt(n.influence) +
      "\nnode id: " + n.node_id;
    var isFeature = n.feature_type === FEATURE;
    var key = isFeature ? n.node_id.split("_").slice(0, 2).join("_") : null;
    var d = key && details[key];
    if (d) {
      tokenPairs(panel, "promotes", d.promoted);
      tokenPairs(panel, "suppresses", d.suppressed);
      if (d.contexts) contexts(panel, d.contexts);
    }
    listEdges(panel, "strongest inputs", ins[n.node_id], "source");
    listEdges(panel, "strongest outputs", outs[n.node_id], "target");
    checks(panel, n);
  }
  function select(id, add) {
    picked = add ? picked.concat([id]) : [id];
    Object.keys(nodeEls).forEach(function (k) {
      nodeEls[k].classList.toggle("interp-picked", picked.indexOf(k) >= 0); });
    highlight(id);
    show(byId[id]);
    document.body.dataset.clicked = id;
  }
  // supernodes: named groups of nodes, kept in qParams.supernodes of the saved JSON
  var supers = g.qParams.supernodes;
  var superList = document.getElementById("interp-supernodes");
  function drawSupers() {
    superList.textContent = "";
    Object.keys(nodeEls).forEach(function (k) { nodeEls[k].classList.remove("interp-grouped"); });
    supers.forEach(function (s, i) {
      var names = s.slice(1).map(function (id) { return label(byId[id]); });
      var li = h("li", s[0] + ": " + names.join(", "), superList);
      var b = h("button", "remove", li);
      b.type = "button";
      b.addEventListener("click", function () { supers.splice(i, 1); drawSupers(); });
      s.slice(1).forEach(function (id) { nodeEls[id].classList.add("interp-grouped"); });
    });
  }
  document.getElementById("interp-group").addEventListener("click", function () {
    var name = document.getElementById("interp-group-name").value.trim();
    if (!name || picked.length < 1) return;
    supers.push([name].concat(picked));
    drawSupers();
  });
  document.getElementById("interp-save").addEventListener("click", function () {
    var blob = new Blob([JSON.stringify(g, null, 1)], {type: "application/json"});
    var a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = "graph.json";
    a.click();
    setTimeout(function () { URL.revokeObjectURL(a.href); }, 1000);
  });
  drawSupers();
  function highlight(id) {
    edgeEls.forEach(function (e) {
      var on = e.dataset.source === id || e.dataset.target === id;
      e.classList.toggle("interp-on", on);
      e.classList.toggle("interp-off", !on);
    });
  }
  // start: at the left, every row labelled; the whole width when it fits at 40% or more
  function home() {
    var fit = fitZoom();
    zoomTo(fit >= 0.4 ? Math.min(1, fit) : 1);
    box.scrollLeft = 0;
    box.scrollTop = 0;
  }
  home();
  drawOverview();
  readFilters();
  window.interpGraph = {
    supernodes: supers, select: select, home: home, showEdge: showEdge,
    zoom: function (z, at) { if (z !== undefined) zoomTo(z, at); return zoom; },
    json: function () { return JSON.stringify(g); }};
  document.body.dataset.readyMs = performance.now().toFixed(0);
  document.body.dataset.ready = "1";
"""

GRAPH_JS = (
    '(function () {\n  "use strict";\n'
    + VIEW_JS.strip("\n")
    + "\n"
    + _PANEL_JS.strip("\n")
    + "\n})();"
)
