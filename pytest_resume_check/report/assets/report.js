// The script of the HTML report (pytest_resume_check.html inlines it into the page).
// It draws timelines from the embedded JSON (#timelines) into SVG, colouring marked inputs as the
// embedded table of entry marks says (#marks, made from pytest_resume_check.categories.TABLE); text
// goes in through textContent only, so ids and headlines are never parsed as markup. It also filters
// failing cells, opens the cell a heatmap link points at, and reports on <body data-render> whether it
// ran without an error ("ok", else "error: <message>").
(function () {
  "use strict";
  var body = document.body;
  window.addEventListener("error", function (e) {
    body.setAttribute("data-render", "error: " + (e.message || "unknown"));
  });
  var NS = "http://www.w3.org/2000/svg";
  var SQ = 16, GAP = 2, COL = SQ + 10, LEFT = 96, TOP = 62, LANE_GAP = 18;
  var KILL = "#c62828", RESUME = "#2e7d32", MUTED = "#5f6368", INK = "#1b1b1f";
  // {mark: {name, meaning, colour, dark}} of the marks an input can get ("." is unmarked).
  var MARKS = JSON.parse(document.getElementById("marks").textContent);
  var data = JSON.parse(document.getElementById("timelines").textContent);
  var drawn = {};

  function el(name, attrs, parent, text) {
    var node = document.createElementNS(NS, name);
    for (var k in attrs) { node.setAttribute(k, attrs[k]); }
    if (text !== undefined) { node.textContent = text; }
    if (parent) { parent.appendChild(node); }
    return node;
  }
  function xOf(t, step) { return LEFT + (step - t.lo) * COL; }
  // The name of run index r of a ledger row: "run 2", or the reference's rest after an early stop.
  function runLabel(t, r) { return (t.labels && t.labels[r]) || "run " + (r + 1); }
  function laneHeight(groups) {
    var per = {}, most = 1;
    groups.forEach(function (g) {
      per[g[0]] = (per[g[0]] || 0) + g[3].length + (g[5] ? 1 : 0);
      most = Math.max(most, per[g[0]]);
    });
    return most * (SQ + GAP) + 6;
  }
  function drawInput(svg, x, y, id, step, epoch, who, m) {
    var info = MARKS.hasOwnProperty(m) ? MARKS[m] : null;
    var fill = info ? info.colour : (epoch % 2 ? "#6baed6" : "#c6dbef");
    var r = el("rect", {x: x, y: y, width: SQ, height: SQ, rx: 2, fill: fill,
                        stroke: info ? fill : "#8a9bb0", "class": "in m-" + (info ? m : "ok")}, svg);
    var tip = "id " + id + " \u00b7 step " + step + " \u00b7 epoch " + epoch + " \u00b7 " + who;
    if (info) { tip += "\n" + info.name + ": " + info.meaning; }
    el("title", {}, r, tip);
    var s = String(id);
    if (s.length <= 3) {
      el("text", {x: x + SQ / 2, y: y + SQ / 2 + 3.5, "font-size": 9, "text-anchor": "middle",
                  fill: info && info.dark ? "#fff" : INK, "pointer-events": "none"}, svg, s);
    }
  }
  function drawLane(svg, t, groups, y0, label, h) {
    el("text", {x: 4, y: y0 + 13, "font-size": 12, fill: INK}, svg, label);
    el("rect", {x: LEFT - 2, y: y0 - 3, width: (t.hi - t.lo + 1) * COL + 2, height: h, fill: "#f7f8fa"}, svg);
    var used = {};
    groups.forEach(function (g) {
      var step = g[0], run = g[1], epoch = g[2], ids = g[3], marks = g[4], hidden = g[5];
      var x = xOf(t, step) + 5;
      ids.forEach(function (id, i) {
        var row = used[step] || 0; used[step] = row + 1;
        drawInput(svg, x, y0 + row * (SQ + GAP), id, step, epoch, runLabel(t, run), marks.charAt(i) || ".");
      });
      if (hidden) {
        var row = used[step] || 0; used[step] = row + 1;
        el("text", {x: x, y: y0 + row * (SQ + GAP) + 12, "font-size": 9, fill: MUTED}, svg, "+" + hidden);
      }
    });
  }
  // Steps redone after a kill: what the killed run did after the checkpoint it is resumed from.
  function drawBands(svg, t) {
    t.kills.forEach(function (k) {
      var from = t.resumed[k[0]];
      if (from === undefined || k[2] <= from) { return; }
      var a = Math.max(from + 1, t.lo), b = Math.min(k[2], t.hi);
      if (b < a) { return; }
      var band = el("rect", {x: xOf(t, a), y: 32, width: (b - a + 1) * COL, height: 8,
                             fill: "#f4b6b6", "class": "redone"}, svg);
      el("title", {}, band, "run " + (k[0] + 1) + " took steps " + (from + 1) + "-" + k[2] +
         " after its last checkpoint; the kill threw that work away and run " + (k[0] + 2) + " redid it");
    });
  }
  // Which run each step of the resumed job comes from, under its lane.
  function drawRuns(svg, t, bottom) {
    var runs = {}, shown = 0;
    t.res.forEach(function (g) { runs[g[0]] = g[1]; });
    for (var st = t.lo; st <= t.hi; st++) {
      if (runs[st] !== undefined && runs[st] !== runs[st - 1]) {
        el("text", {x: xOf(t, st) + 2, y: bottom + 12 + (shown++ % 2) * 11, "font-size": 10, fill: MUTED},
           svg, "\u2192 " + runLabel(t, runs[st]));
      }
    }
  }
  function drawLines(svg, t, bottom) {
    function vline(step, colour, dash, label, dy, tip) {
      if (step < t.lo - 1 || step > t.hi) { return; }
      var x = xOf(t, step + 1) + (dash ? 2 : -2);  // a kill and its resume often share a boundary
      var g = el("g", {"class": dash ? "kill" : "resume"}, svg);
      el("line", {x1: x, x2: x, y1: 4 + dy, y2: bottom + 2, stroke: colour, "stroke-width": 2,
                  "stroke-dasharray": dash || "none"}, g);
      el("text", {x: x + 4, y: 12 + dy, "font-size": 10, fill: colour}, g, label);
      el("title", {}, g, tip);
    }
    t.kills.forEach(function (k) {
      if (t.ran[k[0]] !== undefined && t.ran[k[0]] !== "killed") { return; }  // planned, but the run ended first
      vline(k[2], KILL, "5,3", "\u2715 kill " + (k[0] + 1), 0, "run " + (k[0] + 1) + ": " + k[3]);
    });
    t.resumed.forEach(function (step, i) {
      vline(step, RESUME, null, step ? "\u21bb from " + step : "\u21bb scratch", 12,
            "run " + (i + 2) + (step ? " resumed from the checkpoint of step " + step : " started from scratch"));
    });
    // The step whose training state first differs from the reference's: a line before its column.
    if (t.state && t.state[0] >= t.lo && t.state[0] <= t.hi) {
      var x = xOf(t, t.state[0]) + 1;
      var g = el("g", {"class": "state"}, svg);
      el("line", {x1: x, x2: x, y1: 28, y2: bottom + 2, stroke: t.state[1], "stroke-width": 3,
                  "stroke-dasharray": "1,3"}, g);
      el("text", {x: x + 4, y: 36, "font-size": 10, fill: t.state[1]}, g, "\u2260 state");
      el("title", {}, g, t.state[2]);
    }
  }
  function drawNotes(svg, t, height) {
    var notes = [];
    function range(a, b) { return a === b ? "step " + a : "steps " + a + "-" + b; }
    if (t.lo > 1) { notes.push(range(1, t.lo - 1) + " not shown"); }
    if (t.hi < t.last) { notes.push(range(t.hi + 1, t.last) + " not shown"); }
    if (!t.ref.length && !t.res.length) { notes.push("no input ledger for this verdict: see the runs above"); }
    if (notes.length) {
      el("text", {x: 4, y: height - 4, "font-size": 10, fill: MUTED}, svg, notes.join("; "));
    }
  }
  function draw(host, t) {
    // One lane per ledger, or per ledger and rank in a multi-rank cell.
    var lanes = t.lanes || [["reference", t.ref], ["resumed", t.res]];
    var heights = lanes.map(function (lane) { return laneHeight(lane[1]); });
    var total = heights.reduce(function (a, b) { return a + b + LANE_GAP; }, 0) - LANE_GAP;
    // Room on the right for the longest run label drawn under the last columns.
    var longest = (t.labels || []).reduce(function (n, s) { return Math.max(n, s.length); }, 0);
    var width = LEFT + (t.hi - t.lo + 1) * COL + Math.max(150, 6.5 * longest + 20);
    var height = TOP + total + 40;
    var svg = el("svg", {xmlns: NS, "class": "timeline", width: width, height: height,
                         viewBox: "0 0 " + width + " " + height, role: "img"});
    el("title", {}, svg, "reference and resumed " + (t.ledger ? t.ledger + " " : "") + "inputs per step");
    var bottom = TOP + total;
    drawBands(svg, t);
    for (var s = t.lo; s <= t.hi; s++) {
      el("text", {x: xOf(t, s) + COL / 2, y: TOP - 8, "font-size": 10, "text-anchor": "middle",
                  fill: MUTED}, svg, String(s));
    }
    el("text", {x: 4, y: TOP - 8, "font-size": 10, fill: MUTED}, svg, "step");
    var y = TOP;
    lanes.forEach(function (lane, i) {
      drawLane(svg, t, lane[1], y, lane[0], heights[i]);
      y += heights[i] + LANE_GAP;
    });
    drawRuns(svg, t, bottom);
    drawLines(svg, t, bottom);
    drawNotes(svg, t, height);
    host.textContent = "";
    host.appendChild(svg);
  }
  function drawIndex(i) {
    if (drawn[i] || !data[i]) { return; }
    var host = document.querySelector('div.timeline[data-t="' + i + '"]');
    if (!host) { return; }
    draw(host, data[i]);
    drawn[i] = true;
  }
  function drawAll() {
    document.querySelectorAll("details.failure, details.more").forEach(function (d) { d.open = true; });
    for (var i = 0; i < data.length; i++) { drawIndex(i); }
  }
  document.querySelectorAll("details.failure").forEach(function (d) {
    if (d.open) { drawIndex(+d.getAttribute("data-t")); }
    d.addEventListener("toggle", function () { if (d.open) { drawIndex(+d.getAttribute("data-t")); } });
  });
  function openHash() {
    if (location.hash === "#render-all") { drawAll(); return; }
    var target = location.hash ? document.getElementById(location.hash.slice(1)) : null;
    if (!target) { return; }
    for (var p = target; p; p = p.parentElement) { if (p.tagName === "DETAILS") { p.open = true; } }
    if (target.tagName === "DETAILS") { drawIndex(+target.getAttribute("data-t")); target.scrollIntoView(); }
  }
  window.addEventListener("hashchange", openHash);
  openHash();
  var filter = document.getElementById("filter");
  if (filter) {
    filter.addEventListener("input", function () {
      var q = filter.value.toLowerCase();
      document.querySelectorAll("details.more").forEach(function (d) { d.open = q.length > 0; });
      document.querySelectorAll("details.failure").forEach(function (d) {
        d.style.display = d.getAttribute("data-search").indexOf(q) >= 0 ? "" : "none";
      });
    });
  }
  var all = document.getElementById("open-all");
  if (all) {
    all.addEventListener("click", drawAll);
  }
  if (body.getAttribute("data-render") === "pending") {
    body.setAttribute("data-render", "ok");
  }
})();
