// src/verify/report_page.js — draws the HTML report of report_html.cpp from its two JSON
// documents: #oasis-data (report_json) and #oasis-maps (per tensor: step, axes, error map).
// On success the body's data-oasis-status is "ok" and the title ends in the verdict; a script
// error is written into #oasis-errors, data-oasis-status becomes "error" and the title says so.
"use strict";
(function () {
  const body = document.body;
  function fail(msg) {
    document.getElementById("oasis-errors").textContent += "script error: " + msg + "\n";
    body.setAttribute("data-oasis-status", "error");
    document.title = "oasis report: script error";
  }
  window.addEventListener("error", (e) => fail(e.message + " (line " + e.lineno + ")"));

  const SVG = "http://www.w3.org/2000/svg";
  function el(tag, attrs, ...kids) {
    const e = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    for (const k of kids) if (k !== null && k !== undefined) e.append(k);
    return e;
  }
  // a JSON number of the report: null is a non-finite value JSON cannot hold ("inf" for errors)
  function fmt(v, digits) {
    if (v === null) return "inf";
    if (typeof v === "string") return v;
    if (v === 0) return "0";
    const a = Math.abs(v);
    return a >= 1e-3 && a < 1e6 ? String(+v.toPrecision(digits || 4)) : v.toExponential((digits || 4) - 1);
  }
  const verdictOf = (t) => (t.informative ? "INFO" : t.verdict);

  // ---- colours of err/bound: blues below the bound, orange to dark red above it ----------------
  function mix(a, b, f) {
    const p = (s) => [1, 3, 5].map((i) => parseInt(s.substr(i, 2), 16));
    const x = p(a), y = p(b);
    return x.map((c, i) => Math.round(c + (y[i] - c) * f));
  }
  const NONE = [230, 232, 235], NAN = [192, 0, 192], INF = [40, 0, 10];
  function rgb(r) {
    if (Number.isNaN(r)) return NAN;
    if (r < 0) return NONE;
    if (r === 0) return [255, 255, 255];
    if (r === Infinity) return INF;
    const t = Math.log2(r);
    if (t < 0) {
      const f = Math.min(Math.max((t + 24) / 24, 0), 1);
      return f < 0.5 ? mix("#f4f8fc", "#92c5de", f * 2) : mix("#92c5de", "#2166ac", f * 2 - 1);
    }
    const f = Math.min(t / 12, 1);
    return f < 0.5 ? mix("#fdae61", "#d73027", f * 2) : mix("#d73027", "#67001f", f * 2 - 1);
  }
  const css = (c) => "rgb(" + c.join(",") + ")";

  // ---- error maps ----------------------------------------------------------------------------
  // cells: one hex byte per block; 00 none checked, 01 exact, fe infinite, ff NaN, else 2^((q-160)/4)
  function decode(map) {
    const n = map.cells.length / 2, v = new Float64Array(n);
    for (let i = 0; i < n; ++i) {
      const q = parseInt(map.cells.substr(2 * i, 2), 16);
      v[i] = q === 0 ? -1 : q === 1 ? 0 : q === 0xfe ? Infinity : q === 0xff ? NaN : Math.pow(2, (q - 160) / 4);
    }
    return v;
  }
  // the worse of two cells: NaN, then the larger; -1 (none checked) only when both are
  const worse = (a, b) => (Number.isNaN(a) || Number.isNaN(b) ? NaN : Math.max(a, b));

  // Projects the blocks onto (row axes) x (column axes), the worst over the other axes.
  function project(map, values, rowAxes, colAxes) {
    const dims = map.blocks, rank = dims.length;
    const size = (axes) => axes.reduce((p, a) => p * dims[a], 1);
    const R = size(rowAxes), C = size(colAxes), g = new Float64Array(R * C).fill(-1);
    const ix = new Array(rank).fill(0);
    for (let c = 0; c < values.length; ++c) {
      let r = 0, k = 0;
      for (const a of rowAxes) r = r * dims[a] + ix[a];
      for (const a of colAxes) k = k * dims[a] + ix[a];
      g[r * C + k] = worse(g[r * C + k], values[c]);
      for (let d = rank - 1; d >= 0; --d) { if (++ix[d] < dims[d]) break; ix[d] = 0; }
    }
    return { R, C, g, rowBlock: rowAxes.length === 1 ? map.block[rowAxes[0]] : 0,
             colBlock: colAxes.length === 1 ? map.block[colAxes[0]] : 0 };
  }
  // at most `max` rows and columns on screen: pool by the worst
  function pool(p, max) {
    const fr = Math.ceil(p.R / max), fc = Math.ceil(p.C / max);
    if (fr === 1 && fc === 1) return Object.assign(p, { fr: 1, fc: 1 });
    const R = Math.ceil(p.R / fr), C = Math.ceil(p.C / fc), g = new Float64Array(R * C).fill(-1);
    for (let r = 0; r < p.R; ++r)
      for (let c = 0; c < p.C; ++c) {
        const i = Math.floor(r / fr) * C + Math.floor(c / fc);
        g[i] = worse(g[i], p.g[r * p.C + c]);
      }
    return Object.assign({}, p, { R, C, g, fr, fc });
  }

  const tip = el("div", { id: "oasis-tip" });
  function heatmap(p, yName, xName, caption) {
    const q = pool(p, 360);
    const cv = el("canvas", { class: "oasis-heatmap", width: q.C, height: q.R });
    const ctx = cv.getContext("2d"), img = ctx.createImageData(q.C, q.R);
    let painted = 0, over = 0;  // cells with a checked element; cells outside the bound (or NaN)
    for (let i = 0; i < q.R * q.C; ++i) {
      const c = rgb(q.g[i]);
      img.data.set([c[0], c[1], c[2], 255], 4 * i);
      if (q.g[i] >= 0 || Number.isNaN(q.g[i])) ++painted;
      if (q.g[i] > 1 || Number.isNaN(q.g[i])) ++over;
    }
    ctx.putImageData(img, 0, 0);
    const cw = Math.max(1, Math.min(24, Math.floor(560 / q.C))), ch = Math.max(1, Math.min(24, Math.floor(300 / q.R)));
    cv.style.width = q.C * cw + "px";
    cv.style.height = Math.max(q.R * ch, 8) + "px";
    cv.setAttribute("data-cells", String(painted));
    cv.setAttribute("data-over", String(over));
    const span = (i, f, blk) => { // element range of screen cell i along one axis
      if (!blk) return "blocks " + i * f + "-" + ((i + 1) * f - 1);
      const lo = i * f * blk, hi = (i + 1) * f * blk - 1;
      return lo === hi ? String(lo) : lo + "-" + hi;
    };
    cv.addEventListener("mousemove", (e) => {
      const b = cv.getBoundingClientRect();
      const c = Math.floor(((e.clientX - b.left) / b.width) * q.C), r = Math.floor(((e.clientY - b.top) / b.height) * q.R);
      if (r < 0 || c < 0 || r >= q.R || c >= q.C) return;
      const v = q.g[r * q.C + c];
      tip.textContent = yName + " " + span(r, q.fr, q.rowBlock) + ", " + xName + " " + span(c, q.fc, q.colBlock) + ": " +
        (v < 0 ? "not checked" : Number.isNaN(v) ? "NaN" : "err/bound \u2248 " + fmt(v, 2));
      Object.assign(tip.style, { display: "block", left: e.clientX + 12 + "px", top: e.clientY + 12 + "px" });
    });
    cv.addEventListener("mouseleave", () => { tip.style.display = "none"; });
    const note = q.fr > 1 || q.fc > 1 || p.rowBlock > 1 || p.colBlock > 1 ? " Each cell is the worst of its block." : "";
    return el("div", { class: "fig" }, el("h3", {}, yName.replace(/ \(.*/, "") + " \u00d7 " + xName.replace(/ \(.*/, "")), cv,
              el("div", { class: "cap" }, caption + " Vertical: " + yName + ", horizontal: " + xName + "." + note));
  }

  function legend() {
    const stops = [-24, -16, -8, -4, -1, 0, 1, 3, 6, 12];
    const bar = el("span", {});
    for (const t of stops) bar.append(el("span", { style: "display:inline-block;width:22px;height:12px;background:" +
      css(rgb(Math.pow(2, t))) + (t === 0 ? ";border-left:2px solid #000" : ""), title: "err/bound 2^" + t }));
    return el("div", { class: "legend" }, "err/bound: 2^-24", bar, "2^12 (black edge: the bound, 1);",
              el("span", { style: "background:" + css(NONE) + ";padding:0 6px" }, "not checked"),
              el("span", { style: "background:" + css(NAN) + ";color:#fff;padding:0 6px" }, "NaN"));
  }

  // ---- histogram of err/bound with the bound line -----------------------------------------------
  function histogram(map) {
    const lo = map.hist_lo, h = map.hist, n = h.length;
    let first = n, last = -1, top = 0;
    h.forEach((c, i) => { if (c > 0) { first = Math.min(first, i); last = Math.max(last, i); top = Math.max(top, c); } });
    const one = 1 - lo;  // the bin [2^0, 2^1)
    first = Math.max(0, Math.min(first, one) - 1);
    last = Math.min(n - 1, Math.max(last, one) + 1);
    const W = 420, H = 170, L = 36, B = 34, bw = (W - L - 8) / (last - first + 1);
    const svg = el("svg:svg", { width: W, height: H, class: "oasis-histogram" });
    const x = (i) => L + (i - first) * bw;
    for (let i = first; i <= last; ++i) {
      if (!h[i]) continue;
      const hh = ((H - B - 10) * Math.log10(1 + h[i])) / Math.log10(1 + top);
      const below = i < one;
      svg.append(el("svg:rect", { x: x(i) + 1, y: H - B - hh, width: Math.max(bw - 2, 1), height: hh,
                                  fill: below ? "#4393c3" : "#d73027" },
                    el("svg:title", {}, h[i] + " elements, err/bound " +
                      (i === 0 ? "< 2^" + lo : i === n - 1 ? ">= 2^" + (lo + n - 2) : "in [2^" + (lo + i - 1) + ", 2^" + (lo + i) + ")"))));
    }
    svg.append(el("svg:line", { x1: L, y1: H - B, x2: W - 4, y2: H - B, stroke: "#57606a" }));
    const xb = x(one);
    svg.append(el("svg:line", { x1: xb, y1: 4, x2: xb, y2: H - B + 4, stroke: "#000", "stroke-width": 2, "stroke-dasharray": "5,3" }));
    svg.append(el("svg:text", { x: xb + 4, y: 14, "font-size": 11 }, "bound"));
    const step = Math.max(1, Math.ceil((last - first + 1) / 8));
    for (let i = first; i <= last; i += step) {
      const label = i === 0 ? "<2^" + lo : "2^" + (lo + i - 1);
      svg.append(el("svg:text", { x: x(i), y: H - B + 16, "font-size": 10, fill: "#57606a" }, label));
    }
    svg.append(el("svg:text", { x: L, y: H - 4, "font-size": 11, fill: "#57606a" }, "err/bound (log2 bins); bar height: log count"));
    const nan = map.nan ? " " + map.nan + " NaN elements are not in the histogram." : "";
    return el("div", { class: "fig" }, el("h3", {}, "histogram of err/bound"), svg,
              el("div", { class: "cap" }, "Elements per binade of err/bound; right of the dashed line they are outside the bound." + nan));
  }

  function worstTable(t, map) {
    const tb = el("table", {}, el("tr", {}, ...["element", "got", "reference", "|err|", "bound", "err/bound"].map(
      (s, i) => el("th", { class: i ? "" : "l" }, s))));
    for (const w of map.worst)
      tb.append(el("tr", {}, el("td", { class: "l mono" }, t.name + "[" + w.index.join(", ") + "]"),
                   ...[w.got, w.ref, w.err, w.bound, w.ratio].map((v, i) => el("td", { class: "mono" }, fmt(v, i < 2 ? 9 : 4)))));
    return el("div", {}, el("h3", {}, "worst elements"), tb);
  }

  // ---- one tensor --------------------------------------------------------------------------
  function margin(t) {
    if (t.worst_ratio === null) return "err/bound: infinite or NaN";
    if (t.worst_ratio === 0) return "worst err/bound 0: every checked element equals its reference";
    const r = t.worst_ratio;
    return "worst err/bound " + fmt(r) + (r <= 1 ? " (the bound is " + fmt(1 / r, 3) + "\u00d7 the largest error)"
                                                 : " (" + fmt(r, 3) + "\u00d7 over the bound)");
  }
  function tensorSection(t, x, i) {
    const v = verdictOf(t);
    const sec = el("section", { class: "tensor", id: "t" + i },
      el("h2", {}, el("span", { class: "mono" }, t.name + " [" + t.shape.join(", ") + "] " + t.dtype + " "), el("span", { class: "badge " + v }, v)),
      el("div", { class: "meta" }, t.checked + " of " + t.elements + " elements checked; " + (t.bound ? "bound: " + t.bound + "; " : "") +
         t.violations + " outside the bound, " + t.violations_certain + " outside the certain bound" +
         (t.undecided ? ", " + t.undecided + " undecided" : "")),
      el("div", { class: "meta" }, margin(t)));
    if (x.step) sec.append(el("div", { class: "meta" }, "checked against: " + x.step));
    if (t.problem) sec.append(el("div", { class: "meta" }, "problem: " + t.problem));
    const m = x.map;
    if (!m) {
      sec.append(el("p", { class: "meta" }, "No element map: the tensor was judged as a whole" +
                    (t.problem ? "." : " (the end-to-end verdict of the model level).")));
    } else {
      const vals = decode(m), rank = m.blocks.length, figs = el("div", { class: "figs" });
      const ax = (a) => (x.axes.length ? x.axes[a] : "axis " + a);
      const range = (axes) => " (0-" + (axes.reduce((p, a) => p * t.shape[a], 1) - 1) + ")";
      const h = x.axes.indexOf("H");
      if (h >= 0 && h + 1 < rank && /^T/.test(x.axes[h + 1]))
        figs.append(heatmap(project(m, vals, [h], [h + 1]), "head " + ax(h) + range([h]), "row " + ax(h + 1) + range([h + 1]),
                            "err/bound over (head, row), the worst over the other axes."));
      const rows = [...Array(Math.max(rank - 1, 0)).keys()], cols = rank ? [rank - 1] : [];
      const rowName = rows.length ? rows.map(ax).join("\u00b7") + range(rows) : "-";
      figs.append(heatmap(project(m, vals, rows, cols), "rows " + rowName, "columns " + (rank ? ax(rank - 1) + range(cols) : "-"),
                          "err/bound over rows \u00d7 columns (the leading axes flattened, row-major)."));
      figs.append(histogram(m));
      sec.append(figs, legend(), worstTable(t, m));
    }
    if (t.first_mismatches.length)
      sec.append(el("h3", {}, "first mismatches (by index)"), el("pre", { class: "mono" }, t.first_mismatches.join("\n")));
    return sec;
  }

  // ---- the model's steps in forward order, the first wrong one marked -----------------------------
  const ROUTER = ["sources", "psi", "g_old", "g", "dpsi", "alpha", "alpha_null", "routed"];
  function modelDiagram(doc, maps, firstWrong) {
    const groups = [];
    doc.tensors.forEach((t, i) => {
      const dot = t.name.lastIndexOf("."), prefix = dot < 0 ? t.name : t.name.slice(0, dot);
      const field = dot < 0 ? t.name : t.name.slice(dot + 1);
      const lane = dot >= 0 && ROUTER.includes(field) ? prefix + " router" : prefix;
      if (!groups.length || groups[groups.length - 1].lane !== lane) groups.push({ lane, items: [] });
      groups[groups.length - 1].items.push({ t, i, field });
    });
    const BW = 86, BH = 38, GAP = 6, LW = 170, PER = 9, RH = BH + 22;
    let rows = 0;
    for (const g of groups) rows += Math.ceil(g.items.length / PER);
    const W = LW + PER * (BW + GAP) + 10, H = rows * RH + 10;
    const svg = el("svg:svg", { width: W, height: H, class: "oasis-diagram" });
    let y = 6;
    groups.forEach((g, gi) => {
      svg.append(el("svg:text", { x: 4, y: y + BH / 2 + 4, "font-size": 12, fill: "#24292f" }, g.lane));
      g.items.forEach((it, k) => {
        const bx = LW + (k % PER) * (BW + GAP), by = y + Math.floor(k / PER) * RH;
        const t = it.t, r = t.worst_ratio === null ? Infinity : t.worst_ratio;
        const fill = t.informative ? "#d0d7de" : t.passed ? css(rgb(Math.min(r, 0.999))) : css(rgb(Math.max(r, 1)));
        const dark = !t.passed && !t.informative || r > 0.05;
        const a = el("svg:a", { href: "#t" + it.i });
        a.append(el("svg:rect", { x: bx, y: by, width: BW, height: BH, rx: 4, fill,
                                  stroke: it.i === firstWrong ? "#000" : "#8c959f", "stroke-width": it.i === firstWrong ? 3 : 1 }),
                 el("svg:text", { x: bx + 5, y: by + 15, "font-size": 11, fill: dark ? "#fff" : "#1b1f24" }, it.field),
                 el("svg:text", { x: bx + 5, y: by + 30, "font-size": 10, fill: dark ? "#fff" : "#1b1f24" },
                    t.informative ? "info" : fmt(t.worst_ratio, 2)),
                 el("svg:title", {}, t.name + ": " + verdictOf(t) + ", err/bound " + fmt(t.worst_ratio) +
                    (maps[it.i].step ? "\nchecked against " + maps[it.i].step : "")));
        svg.append(a);
        if (it.i === firstWrong)
          svg.append(el("svg:text", { x: bx, y: by + BH + 13, "font-size": 11, "font-weight": "bold", fill: "#82071e" }, "\u25b2 first wrong step"));
      });
      const lines = Math.ceil(g.items.length / PER);
      if (gi + 1 < groups.length)
        svg.append(el("svg:line", { x1: LW - 12, y1: y + BH, x2: LW - 12, y2: y + lines * RH, stroke: "#8c959f", "marker-end": "url(#arrow)" }));
      y += lines * RH;
    });
    svg.prepend(el("svg:defs", {}, el("svg:marker", { id: "arrow", markerWidth: 8, markerHeight: 8, refX: 4, refY: 6, orient: "auto" },
      el("svg:path", { d: "M0,0 L8,0 L4,8 z", fill: "#8c959f", transform: "rotate(-90 4 4)" }))));
    return el("div", { class: "fig" }, svg, el("div", { class: "cap" },
      "The checked tensors in forward order, one lane per sublayer (its router's tensors in a lane of their own); " +
      "each box shows the tensor's worst err/bound, coloured as the heat maps. Click a box for its section."));
  }

  function summary(doc) {
    const tb = el("table", {}, el("tr", {}, ...["tensor", "dtype", "shape", "checked", "max |err|", "err/bound", "err/certain", "outside", "verdict"]
      .map((s, i) => el("th", { class: i < 3 ? "l" : "" }, s))));
    doc.tensors.forEach((t, i) => tb.append(el("tr", {},
      el("td", { class: "l mono" }, el("a", { href: "#t" + i }, t.name)), el("td", { class: "l" }, t.dtype),
      el("td", { class: "l mono" }, "[" + t.shape.join(", ") + "]"), el("td", {}, String(t.checked)),
      el("td", { class: "mono" }, fmt(t.max_abs)), el("td", { class: "mono" }, fmt(t.worst_ratio)),
      el("td", { class: "mono" }, fmt(t.worst_ratio_certain)), el("td", {}, String(t.violations)),
      el("td", { class: "l" }, el("span", { class: "badge " + verdictOf(t) }, verdictOf(t))))));
    return tb;
  }

  try {
    const doc = JSON.parse(document.getElementById("oasis-data").textContent);
    const maps = JSON.parse(document.getElementById("oasis-maps").textContent);
    const main = document.getElementById("oasis-report");
    const firstWrong = doc.tensors.findIndex((t) => !t.informative && t.passed === false);
    main.append(el("h1", {}, "oasis-verify compare: op " + doc.op + " ", el("span", { class: "badge " + doc.verdict }, doc.verdict)),
                el("div", { class: "meta" }, "policy: " + doc.policy + "; oracle: " + doc.oracle));
    if (doc.sample)
      main.append(el("div", { class: "meta" }, "sample: " + doc.sample.rows + " of " + doc.sample.total + " rows " + doc.sample.row +
                     " checked (seed " + doc.sample.seed + "); unchecked rows are grey in the heat maps"));
    if (firstWrong >= 0)
      main.append(el("div", { class: "meta" }, "first wrong tensor" + (doc.op === "model" ? " (forward order): " : ": "),
                     el("a", { href: "#t" + firstWrong, class: "mono" }, doc.tensors[firstWrong].name)));
    if (doc.notes.length) main.append(el("ul", { class: "notes" }, ...doc.notes.map((n) => el("li", {}, n))));
    if (doc.op === "model") main.append(el("h2", {}, "steps"), modelDiagram(doc, maps, firstWrong));
    main.append(el("h2", {}, "tensors"), summary(doc));
    doc.tensors.forEach((t, i) => main.append(tensorSection(t, maps[i], i)));
    body.append(tip);
    if (body.getAttribute("data-oasis-status") !== "error") {
      body.setAttribute("data-oasis-status", "ok");
      document.title = "oasis report: " + doc.op + " " + doc.verdict;
    }
  } catch (e) {
    fail(e && e.stack ? e.stack : String(e));
  }
})();
