"""The script of the graph explorer page (:mod:`interp.pages.graph`): fixed text, no data ever
spliced in. It reads the page's one JSON data block and draws the graph as SVG built with DOM
calls: every token string reaches the page as ``textContent`` only, never as markup."""

from __future__ import annotations

__all__: list[str] = []  # private to interp.pages.graph

GRAPH_JS = r"""
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var data = JSON.parse(document.getElementById("interp-graph-data").textContent);
  var g = data.graph, details = data.details || {};
  var nodes = g.nodes, links = g.links, nLayers = data.n_layers;
  var byId = {}, ins = {}, outs = {};
  nodes.forEach(function (n) { byId[n.node_id] = n; ins[n.node_id] = []; outs[n.node_id] = []; });
  links.forEach(function (l) { outs[l.source].push(l); ins[l.target].push(l); });
  var SHOWN = {" ": "\u00b7", "\n": "\u23ce", "\t": "\u21e5"};
  function shown(t) { return String(t).replace(/[ \n\t]/g, function (c) { return SHOWN[c]; }); }
  function el(tag, attrs, parent) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function h(tag, text, parent, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    if (cls) e.className = cls;
    if (parent) parent.appendChild(e);
    return e;
  }
  function row(n) {  // drawing row from the top: logits 0, layers, tokens last
    if (n.feature_type === "logit") return 0;
    if (n.feature_type === "embedding") return nLayers + 1;
    return nLayers - parseInt(n.layer, 10);
  }
  function label(n) {
    var t = n.feature_type;
    var tok = g.metadata.prompt_tokens[n.ctx_idx];
    if (t === "embedding") return "token " + shown(tok) + " @" + n.ctx_idx;
    if (t === "logit") return n.clerp;
    if (t === "mlp reconstruction error") return "error L" + n.layer + " @" + n.ctx_idx;
    return "L" + n.layer + " F" + n.node_id.split("_")[1] + " @" + n.ctx_idx;
  }
  function byWeight(a, b) { return Math.abs(b.weight) - Math.abs(a.weight); }
  function fmt(x) { return x === null || x === undefined ? "-" : Number(x).toPrecision(4); }
  // layout: one column per position, wide enough for its busiest cell
  var nPos = g.metadata.prompt_tokens.length, cells = {}, width = [];
  nodes.forEach(function (n) {
    var key = row(n) + ":" + n.ctx_idx;
    (cells[key] = cells[key] || []).push(n);
  });
  for (var p = 0; p < nPos; p++) {
    var most = 1;
    for (var r = 0; r <= nLayers + 1; r++) most = Math.max(most, (cells[r + ":" + p] || []).length);
    width.push(Math.max(56, 16 * most + 8));
  }
  var left = 60, x0 = [], acc = left;
  width.forEach(function (w) { x0.push(acc); acc += w; });
  var rowH = 70, top = 30, H = top + rowH * (nLayers + 2) + 40;
  var svg = el("svg", {width: acc + 20, height: H, class: "interp-graph-svg",
                       role: "img", "aria-label": "attribution graph"});
  var box = document.getElementById("interp-graph");
  box.appendChild(svg);
  box.scrollLeft = box.scrollWidth;  // the logits sit at the last position
  var pos = {};
  Object.keys(cells).forEach(function (key) {
    var list = cells[key], r = +key.split(":")[0], p = +key.split(":")[1];
    list.forEach(function (n, i) {
      var x = x0[p] + width[p] / 2 + (i - (list.length - 1) / 2) * 16;
      pos[n.node_id] = [x, top + rowH * r + rowH / 2];
    });
  });
  for (var r2 = 0; r2 <= nLayers + 1; r2++) {
    var name = r2 === 0 ? "logits" : r2 === nLayers + 1 ? "tokens" : "L" + (nLayers - r2);
    var t = el("text", {x: 4, y: top + rowH * r2 + rowH / 2 + 4, class: "interp-graph-row"}, svg);
    t.textContent = name;
  }
  g.metadata.prompt_tokens.forEach(function (tok, p) {
    var t = el("text", {x: x0[p] + width[p] / 2, y: H - 12, "text-anchor": "middle",
                        class: "interp-graph-token"}, svg);
    t.textContent = shown(tok);
  });
  var maxW = 0;
  links.forEach(function (l) { maxW = Math.max(maxW, Math.abs(l.weight)); });
  var edgeLayer = el("g", {}, svg), nodeLayer = el("g", {}, svg), edgeEls = [];
  links.slice(0, data.max_drawn_links).forEach(function (l) {
    var a = pos[l.source], b = pos[l.target];
    var e = el("line", {x1: a[0], y1: a[1], x2: b[0], y2: b[1],
      stroke: l.weight > 0 ? "#2563eb" : "#dc2626",
      "stroke-width": (0.4 + 4 * Math.abs(l.weight) / (maxW || 1)).toFixed(2),
      "stroke-opacity": 0.45, class: "interp-graph-edge"}, edgeLayer);
    e.dataset.source = l.source; e.dataset.target = l.target;
    edgeEls.push(e);
  });
  var COLORS = {"cross layer transcoder": "#f59e0b", "mlp reconstruction error": "#9ca3af",
                "embedding": "#10b981", "logit": "#8b5cf6"};
  var nodeEls = {};
  nodes.forEach(function (n) {
    var c = pos[n.node_id], e;
    if (n.feature_type === "cross layer transcoder") {
      e = el("circle", {cx: c[0], cy: c[1], r: 6}, nodeLayer);
    } else {
      e = el("rect", {x: c[0] - 6, y: c[1] - 6, width: 12, height: 12}, nodeLayer);
    }
    e.setAttribute("fill", COLORS[n.feature_type]);
    e.setAttribute("class", "interp-graph-node");
    e.dataset.id = n.node_id;
    el("title", {}, e).textContent = label(n);
    e.addEventListener("click", function (ev) { select(n.node_id, ev.shiftKey); });
    nodeEls[n.node_id] = e;
  });
  var panel = document.getElementById("interp-graph-panel"), picked = [];
  function listEdges(parent, title, list, end) {
    h("h3", title, parent);
    var sorted = list.slice().sort(byWeight);
    var ul = h("ul", null, parent, "interp-graph-list");
    sorted.slice(0, 12).forEach(function (l) {
      var li = h("li", null, ul);
      h("span", fmt(l.weight), li, l.weight > 0 ? "interp-pos" : "interp-neg");
      h("span", " " + label(byId[l[end]]), li);
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
      return byId[l.source].feature_type === "cross layer transcoder"; });
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
  function show(n) {
    panel.textContent = "";
    h("h2", label(n), panel);
    var facts = h("p", null, panel);
    facts.textContent = "kind: " + n.feature_type + "\nactivation: " + fmt(n.activation) +
      "\ninfluence: " + fmt(n.influence) + "\nnode id: " + n.node_id;
    var isFeature = n.feature_type === "cross layer transcoder";
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
    edgeEls.forEach(function (e) {
      var on = e.dataset.source === id || e.dataset.target === id;
      e.setAttribute("stroke-opacity", on ? 0.9 : 0.12);
    });
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
  window.interpGraph = {supernodes: supers, select: select,
                        json: function () { return JSON.stringify(g); }};
  document.body.dataset.ready = "1";
})();
""".strip()
