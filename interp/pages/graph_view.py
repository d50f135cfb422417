"""The drawing half of the graph page's script (:mod:`interp.pages.graph_script` joins it to
the panel half): fixed text, no data ever spliced in.

It lays the graph out (rows by layer, logits on top and tokens at the bottom; columns by
position, each as wide as its busiest cell), draws it as SVG built with DOM calls (every
token string is ``textContent``), keeps the row labels in a column that stays at the left,
zooms the positions axis (ctrl + wheel, or the buttons) and pans (drag, scroll), and filters
nodes by layer and position range and edges by ``|weight|``, saying how many edges it hides
and why. An edge with head loadings (``interp graph --attention``) is clickable: it lists its
heads in the panel. Nodes keep their size at every zoom; edges stretch with it (``vector-effect``).
"""

from __future__ import annotations

__all__: list[str] = []  # private to interp.pages.graph_script

VIEW_JS = r"""
  var NS = "http://www.w3.org/2000/svg";
  var data = JSON.parse(document.getElementById("interp-graph-data").textContent);
  var g = data.graph, details = data.details || {};
  var nodes = g.nodes, nLayers = data.n_layers, maxDrawn = data.max_drawn_links;
  function byWeight(a, b) { return Math.abs(b.weight) - Math.abs(a.weight); }
  var links = g.links.slice().sort(byWeight);
  var byId = {}, ins = {}, outs = {};
  nodes.forEach(function (n) { byId[n.node_id] = n; ins[n.node_id] = []; outs[n.node_id] = []; });
  links.forEach(function (l) { outs[l.source].push(l); ins[l.target].push(l); });
  var FEATURE = "cross layer transcoder";  // circuit-tracer's feature_type of every feature
  var KIND = {"cross layer transcoder": data.feature_name, "mlp reconstruction error": "error",
              "embedding": "token", "logit": "logit"};
  var COLORS = {"cross layer transcoder": "#f59e0b", "mlp reconstruction error": "#9ca3af",
                "embedding": "#10b981", "logit": "#8b5cf6"};
  var SHOWN = {" ": "\u00b7", "\n": "\u23ce", "\t": "\u21e5"};
  function shown(t) { return String(t).replace(/[ \n\t]/g, function (c) { return SHOWN[c]; }); }
  function cut(t, n) { t = shown(t); return t.length > n ? t.slice(0, n - 1) + "\u2026" : t; }
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
  function fmt(x) { return x === null || x === undefined ? "-" : Number(x).toPrecision(4); }
  var tokens = g.metadata.prompt_tokens, nPos = tokens.length;
  function layerOf(n) { return parseInt(n.layer, 10); }
  function row(n) {  // drawing row from the top: logits 0, layers, tokens last
    if (n.feature_type === "logit") return 0;
    if (n.feature_type === "embedding") return nLayers + 1;
    return nLayers - layerOf(n);
  }
  function label(n) {
    var t = n.feature_type;
    if (t === "embedding") return "token " + shown(tokens[n.ctx_idx]) + " @" + n.ctx_idx;
    if (t === "logit") return n.clerp;
    if (t === "mlp reconstruction error") return "error L" + n.layer + " @" + n.ctx_idx;
    return "L" + n.layer + " F" + n.node_id.split("_")[1] + " @" + n.ctx_idx;
  }
  function logitText(n) {  // 'Output "x" (p=0.123)' -> '"x" 0.123'
    var m = /^Output "([\s\S]*)" \(p=([0-9.e-]+)\)$/.exec(n.clerp || "");
    return m ? "\u201c" + cut(m[1], 18) + "\u201d " + m[2] : cut(n.clerp || n.node_id, 24);
  }
  // -- layout, in world units (zoom 1) --------------------------------------------------
  // rows share about 520 px (30 to 52 each): a 12-layer graph fits a laptop screen whole
  var ROW_H = Math.max(30, Math.min(52, Math.floor(520 / (nLayers + 1))));
  var GAP = 15, LOGIT_GAP = 18, MIN_COL = 24, TOKEN_ROOM = 84, CHAR_W = 6.7;  // 11px mono
  var longest = 0;  // the logit row holds its labels, drawn up at 60 degrees
  nodes.forEach(function (n) {
    if (n.feature_type === "logit") longest = Math.max(longest, logitText(n).length); });
  var LOGIT_ROW = Math.ceil(ROW_H / 2 + 18 + longest * CHAR_W * 0.87);
  var LABEL_W = 64, PAD = 12, TAIL = 110;  // TAIL: room right of the last column (its labels)
  var nRows = nLayers + 2, H = LOGIT_ROW + (nRows - 1) * ROW_H + TOKEN_ROOM;
  function rowTop(r) { return r === 0 ? 0 : LOGIT_ROW + (r - 1) * ROW_H; }
  function rowY(r) { return r === 0 ? LOGIT_ROW - ROW_H / 2 : rowTop(r) + ROW_H / 2; }
  var cells = {}, colW = [], colX = [], W = 0;
  nodes.forEach(function (n) {
    var key = row(n) + ":" + n.ctx_idx;
    (cells[key] = cells[key] || []).push(n);
  });
  for (var p = 0; p < nPos; p++) {
    var wide = MIN_COL;
    for (var r = 0; r < nRows; r++) {
      var k = (cells[r + ":" + p] || []).length;
      wide = Math.max(wide, (r === 0 ? LOGIT_GAP : GAP) * k + 10);
    }
    colX.push(W); colW.push(wide); W += wide;
  }
  var wx = {}, wy = {};  // each node's centre: world x, and y
  Object.keys(cells).forEach(function (key) {
    var list = cells[key], r = +key.split(":")[0], p = +key.split(":")[1];
    var gap = r === 0 ? LOGIT_GAP : GAP;
    list.forEach(function (n, i) {
      wx[n.node_id] = colX[p] + colW[p] / 2 + (i - (list.length - 1) / 2) * gap;
      wy[n.node_id] = rowY(r);
    });
  });
  // -- elements ---------------------------------------------------------------------------
  var box = document.getElementById("interp-graph");
  var inner = h("div", null, box, "interp-graph-inner");
  var rowSvg = el("svg", {width: LABEL_W, height: H, class: "interp-graph-rows"}, inner);
  var svg = el("svg", {height: H, class: "interp-graph-svg", role: "img",
                       "aria-label": "attribution graph"}, inner);
  var bands = el("g", {}, svg), edgeLayer = el("g", {}, svg), nodeLayer = el("g", {}, svg);
  var textLayer = el("g", {}, svg), bandEls = [];
  for (var r2 = 0; r2 < nRows; r2++) {
    var top = rowTop(r2), high = r2 === 0 ? LOGIT_ROW : ROW_H;
    var band = r2 % 2 ? "interp-graph-band" : "interp-graph-band-alt";
    bandEls.push(el("rect", {x: 0, y: top, height: high, class: band}, bands));
    el("rect", {x: 0, y: top, width: LABEL_W, height: high, class: band}, rowSvg);
    var name = r2 === 0 ? "logits" : r2 === nRows - 1 ? "tokens" : "L" + (nLayers - r2);
    el("text", {x: 6, y: rowY(r2) + 4, class: "interp-graph-row"}, rowSvg).textContent = name;
  }
  var tokenEls = tokens.map(function (tok, p) {
    var t = el("text", {class: "interp-graph-token"}, textLayer);
    t.textContent = cut(tok, 14);
    el("title", {}, t).textContent = "position " + p + ": " + shown(tok);
    return t;
  });
  var nodeEls = {}, logitEls = [];
  nodes.forEach(function (n) {
    var e;
    if (n.feature_type === FEATURE) e = el("circle", {cy: wy[n.node_id], r: 6}, nodeLayer);
    else e = el("rect", {y: wy[n.node_id] - 6, width: 12, height: 12}, nodeLayer);
    e.setAttribute("fill", COLORS[n.feature_type] || "#6b7280");
    e.setAttribute("class", "interp-graph-node");
    e.dataset.id = n.node_id;
    nodeEls[n.node_id] = e;
    if (n.feature_type === "logit") {
      var t = el("text", {class: "interp-graph-logit-label"}, textLayer);
      t.textContent = logitText(n);
      t.dataset.id = n.node_id;
      logitEls.push(t);
    }
  });
  // one listener each for every node (not one per node): clicks select, hovering names it
  var tip = h("div", null, document.body, "interp-graph-tip");
  function nodeOf(ev) { return ev.target.classList.contains("interp-graph-node") ?
                          byId[ev.target.dataset.id] : null; }
  nodeLayer.addEventListener("click", function (ev) {
    var n = nodeOf(ev);
    if (n) select(n.node_id, ev.shiftKey);
  });
  nodeLayer.addEventListener("mouseover", function (ev) {
    var n = nodeOf(ev);
    if (!n) return;
    tip.textContent = label(n) + (n.feature_type === FEATURE ? "  act " + fmt(n.activation) : "");
    tip.style.left = (ev.pageX + 12) + "px";
    tip.style.top = (ev.pageY + 12) + "px";
    tip.style.display = "block";
  });
  nodeLayer.addEventListener("mouseout", function () { tip.style.display = "none"; });
  // -- zoom and pan (positions axis) ------------------------------------------------------
  var zoom = 1;
  function sx(x) { return PAD + x * zoom; }
  function fitZoom() { return Math.max(box.clientWidth - LABEL_W - 2 * PAD - TAIL, 50) / W; }
  var MIN_ZOOM = Math.min(1, fitZoom()) / 2, MAX_ZOOM = 8;
  function place() {
    var width = Math.max(2 * PAD + W * zoom + TAIL, box.clientWidth - LABEL_W - 2);
    svg.setAttribute("width", width.toFixed(0));
    bandEls.forEach(function (b) { b.setAttribute("width", width.toFixed(0)); });
    edgeLayer.setAttribute("transform", "translate(" + PAD + " 0) scale(" + zoom + " 1)");
    nodes.forEach(function (n) {
      var e = nodeEls[n.node_id], x = sx(wx[n.node_id]);
      if (e.tagName === "circle") e.setAttribute("cx", x.toFixed(1));
      else e.setAttribute("x", (x - 6).toFixed(1));
    });
    var last = -1e9, y = H - TOKEN_ROOM + 10;
    tokenEls.forEach(function (t, p) {
      var x = sx(colX[p] + colW[p] / 2), show = x - last >= 13;
      if (show) last = x;
      t.setAttribute("transform", "translate(" + (x - 3).toFixed(1) + " " + y + ") rotate(45)");
      t.style.display = show ? "" : "none";
    });
    logitEls.forEach(function (t) {
      var id = t.dataset.id, x = sx(wx[id]), y = wy[id] - 10;
      t.setAttribute("transform", "translate(" + x.toFixed(1) + " " + y + ") rotate(-60)");
    });
  }
  // -- overview: where the nodes are, along every position; the part in view is framed ----
  var ovBox = document.getElementById("interp-graph-overview"), OV_H = 26, frame = null;
  var ov = el("svg", {height: OV_H, class: "interp-graph-overview", role: "img",
                      "aria-label": "overview of the positions: click or drag to go"}, ovBox);
  var perPos = {};
  nodes.forEach(function (n) {
    if (n.feature_type !== "embedding") perPos[n.ctx_idx] = (perPos[n.ctx_idx] || 0) + 1; });
  function drawOverview() {
    var w = ovBox.clientWidth, most = 1;
    ov.setAttribute("width", w);
    ov.textContent = "";
    Object.keys(perPos).forEach(function (p) { most = Math.max(most, perPos[p]); });
    Object.keys(perPos).forEach(function (p) {
      var x = (colX[p] + colW[p] / 2) / W * w, high = 3 + (OV_H - 5) * perPos[p] / most;
      el("rect", {x: (x - 1).toFixed(1), y: (OV_H - high).toFixed(1), width: 2, height: high,
                  class: "interp-graph-overview-bar"}, ov);
    });
    frame = el("rect", {y: 0.5, height: OV_H - 1, class: "interp-graph-overview-frame"}, ov);
    showFrame();
  }
  function showFrame() {
    if (!frame) return;
    var w = ovBox.clientWidth, view = box.clientWidth - LABEL_W;
    var a = Math.max(0, (box.scrollLeft - PAD) / zoom), b = Math.min(W, a + view / zoom);
    frame.setAttribute("x", (a / W * w).toFixed(1));
    frame.setAttribute("width", Math.max(2, (b - a) / W * w).toFixed(1));
    ovBox.style.visibility = b - a >= W - 1 ? "hidden" : "";  // all in view: nothing to find
  }
  var ovDrag = false;
  function go(ev) {
    var world = (ev.clientX - ov.getBoundingClientRect().left) / ovBox.clientWidth * W;
    box.scrollLeft = Math.max(0, world * zoom + PAD - (box.clientWidth - LABEL_W) / 2);
    showFrame();
  }
  ov.addEventListener("mousedown", function (ev) { ovDrag = true; go(ev); ev.preventDefault(); });
  window.addEventListener("mousemove", function (ev) { if (ovDrag) go(ev); });
  window.addEventListener("mouseup", function () { ovDrag = false; });
  box.addEventListener("scroll", showFrame);
  window.addEventListener("resize", drawOverview);
  function zoomTo(z, anchor) {  // anchor: a point of the box (px from its left) kept in place
    z = Math.min(MAX_ZOOM, Math.max(MIN_ZOOM, z));
    if (anchor === undefined) anchor = (box.clientWidth + LABEL_W) / 2;
    var world = (box.scrollLeft + anchor - LABEL_W - PAD) / zoom;
    zoom = z;
    place();
    box.scrollLeft = Math.max(0, world * zoom + PAD + LABEL_W - anchor);
    document.getElementById("interp-zoom-level").textContent = Math.round(zoom * 100) + "%";
    showFrame();
  }
  box.addEventListener("wheel", function (ev) {
    if (!ev.ctrlKey) return;  // plain wheel scrolls; ctrl + wheel (and pinch) zooms
    ev.preventDefault();
    zoomTo(zoom * Math.exp(-ev.deltaY * 0.002), ev.clientX - box.getBoundingClientRect().left);
  }, {passive: false});
  var drag = null;
  box.addEventListener("mousedown", function (ev) {
    if (ev.button !== 0 || ev.target.classList.contains("interp-graph-node")) return;
    drag = [ev.clientX, ev.clientY, box.scrollLeft, box.scrollTop];
    box.classList.add("interp-dragging");
    ev.preventDefault();
  });
  window.addEventListener("mousemove", function (ev) {
    if (!drag) return;
    box.scrollLeft = drag[2] - (ev.clientX - drag[0]);
    box.scrollTop = drag[3] - (ev.clientY - drag[1]);
  });
  window.addEventListener("mouseup", function () {
    drag = null; box.classList.remove("interp-dragging"); });
  function button(id, fn) { document.getElementById(id).addEventListener("click", fn); }
  button("interp-zoom-in", function () { zoomTo(zoom * 1.5); });
  button("interp-zoom-out", function () { zoomTo(zoom / 1.5); });
  button("interp-zoom-fit", function () { zoomTo(fitZoom()); box.scrollLeft = 0; });
  button("interp-zoom-one", function () { zoomTo(1); });
  // -- filters: layers, positions, |weight| ----------------------------------------------
  var maxW = links.length ? Math.abs(links[0].weight) : 0;
  var f = {layerLo: 0, layerHi: nLayers - 1, posLo: 0, posHi: nPos - 1, minW: 0};
  function visible(n) {
    if (n.feature_type === "logit") return true;  // the targets: always shown
    if (n.ctx_idx < f.posLo || n.ctx_idx > f.posHi) return false;
    if (n.feature_type === "embedding") return true;
    var layer = layerOf(n);
    return layer >= f.layerLo && layer <= f.layerHi;
  }
  var edgeEls = [], counts = {};
  function drawEdges() {
    edgeLayer.textContent = "";
    edgeEls = [];
    counts = {shown: 0, weight: 0, filter: 0, cap: 0};
    var seen = {};
    nodes.forEach(function (n) {
      var on = visible(n), style = nodeEls[n.node_id].style;
      seen[n.node_id] = on;
      if ((style.display !== "none") !== on) style.display = on ? "" : "none";
    });
    links.forEach(function (l) {
      if (Math.abs(l.weight) < f.minW) { counts.weight++; return; }
      if (!seen[l.source] || !seen[l.target]) { counts.filter++; return; }
      if (edgeEls.length >= maxDrawn) { counts.cap++; return; }
      var e = el("line", {x1: wx[l.source], y1: wy[l.source], x2: wx[l.target], y2: wy[l.target],
        stroke: l.weight > 0 ? "#2563eb" : "#dc2626",
        "stroke-width": (0.5 + 4 * Math.abs(l.weight) / (maxW || 1)).toFixed(2),
        class: "interp-graph-edge"}, edgeLayer);
      e.dataset.source = l.source; e.dataset.target = l.target;
      if (carried(l)) {  // --attention: a click lists the heads carrying it (graph_script.py)
        e.classList.add("interp-clickable");
        el("title", {}, e).textContent = "click: the heads carrying this edge";
        e.addEventListener("click", function () { showEdge(l); });
      }
      edgeEls.push(e);
    });
    counts.shown = edgeEls.length;
    var hidden = links.length - counts.shown, why = [];
    if (counts.weight) why.push(counts.weight.toLocaleString("en") + " below |weight| " +
                                fmt(f.minW));
    if (counts.filter) why.push(counts.filter.toLocaleString("en") +
                                " at a layer or position filtered out");
    if (counts.cap) why.push(counts.cap.toLocaleString("en") + " past the " +
                             maxDrawn.toLocaleString("en") + " strongest drawn");
    document.getElementById("interp-graph-status").textContent =
      "Drawing " + counts.shown.toLocaleString("en") + " of " + links.length.toLocaleString("en") +
      " edges; " + (hidden ? hidden.toLocaleString("en") + " hidden (" + why.join(", ") + ")."
                           : "none hidden.");
    if (picked.length) highlight(picked[picked.length - 1]);
  }
  function control(id) { return document.getElementById(id); }
  for (var lay = 0; lay < nLayers; lay++) {
    ["interp-layer-lo", "interp-layer-hi"].forEach(function (id) {
      var o = h("option", "L" + lay, control(id));
      o.value = String(lay);
    });
  }
  control("interp-layer-hi").value = String(nLayers - 1);
  control("interp-pos-lo").max = control("interp-pos-hi").max = String(nPos - 1);
  control("interp-pos-hi").value = String(nPos - 1);
  function readFilters() {
    var a = +control("interp-layer-lo").value, b = +control("interp-layer-hi").value;
    f.layerLo = Math.min(a, b); f.layerHi = Math.max(a, b);
    var lo = parseInt(control("interp-pos-lo").value, 10);
    var hi = parseInt(control("interp-pos-hi").value, 10);
    f.posLo = isNaN(lo) ? 0 : Math.max(0, lo);
    f.posHi = isNaN(hi) ? nPos - 1 : Math.min(nPos - 1, hi);
    var s = +control("interp-weight").value;  // 0..100: 0, then 1e-4 max|w| .. max|w|
    f.minW = s === 0 ? 0 : maxW * Math.pow(10, (s - 100) / 25);
    control("interp-weight-value").textContent = "\u2265 " + fmt(f.minW);
    drawEdges();
  }
  ["interp-layer-lo", "interp-layer-hi", "interp-pos-lo", "interp-pos-hi", "interp-weight"]
    .forEach(function (id) { control(id).addEventListener("input", readFilters); });
  button("interp-filter-reset", function () {
    control("interp-layer-lo").value = "0"; control("interp-layer-hi").value = String(nLayers - 1);
    control("interp-pos-lo").value = "0"; control("interp-pos-hi").value = String(nPos - 1);
    control("interp-weight").value = "0";
    readFilters();
  });
"""
