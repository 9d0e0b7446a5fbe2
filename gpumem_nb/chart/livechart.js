// gpumem_nb's live chart: step lines, cell marks, hover, zoom, pan and the controls, as SVG.
//
// The anywidget front end of gpumem_nb/livechart.py. No build step and no library: this file is
// sent as is, once per widget, a few KB instead of plotly's 5 MB bundle.
//
// The model holds plain JSON (see livechart.py):
//   series   [{key, name, color, width, dash, hidden, legend}]   drawn in this order, later on
//            top; listed in the legend by `legend`
//   history  {key: [xs, ys]}   the long, downsampled past (resent every few seconds)
//   recent   {key: [xs, ys]}   the points since history's last one (resent each tick)
//   extra    {key: [xs, ys]}   a line another feature sends whole (the cluster's)
//   marks    [[x, label]]      cell starts: a dotted line each, labels thinned so none overlap
//   meta     {x_title, y_title, title, note, total, busy, devices, device}
//            total: a dashed line, in GiB, or null; busy: a cell is running; devices:
//            [[label, value]] to choose from (null: one GPU); device: the value shown
//   paused   the view holds still (set here first: the kernel hears of it after a cell)
//   parts    {box, header, banner}: model ids of the chart's output and the HTML beside it
// x is in seconds, y in GiB; null is a gap. Zoom, pan, hidden series and the hover live in
// the view, so every update keeps them; a click on Pause freezes it at once.
//
// Two things answer in the page because the kernel cannot while a cell runs (the browser's
// messages to it wait behind the cell; its own messages to the page still flow):
// - the controls: Pause freezes the view, Clean up and the device say they are queued; the
//   kernel answers each request with {kind: "done", id} once it has handled it;
// - saving: when the page saves the notebook, the chart's output is saved with its picture in
//   the notebook's widget state, so a notebook saved while the chart was live and reopened
//   after its kernel has gone shows the picture, not "Error displaying widget: model not
//   found" (see initialize below and docs/chart.md).

const SVG = "http://www.w3.org/2000/svg";
const HEIGHT = 300;
const M = { left: 52, right: 16, top: 18, bottom: 40 }; // the plot's margins, px
const LABEL_FONT_PX = 10;
const VIEW_MIME = "application/vnd.jupyter.widget-view+json";
const STATE_MIME = "application/vnd.jupyter.widget-state+json";
// Marks the saved picture's entry in the notebook's widget state, so a later save can find it.
const SAVED_KEY = "gpumem_nb_saved";
// One save hook per notebook, shared by every chart in it (each chart's module is its own).
const SAVERS = Symbol.for("gpumem_nb.chart_savers");
const PICTURE_W = 800;

function el(tag, attrs, parent) {
  const node = tag.startsWith("svg:")
    ? document.createElementNS(SVG, tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function text(tag, attrs, parent, content) {
  const node = el(tag, attrs, parent);
  node.textContent = content;
  return node;
}

// Ticks at a round step (1, 2, 2.5 or 5 times a power of ten), about `target` of them, and at
// least two: one tick alone does not say what a pixel is worth.
function ticks(lo, hi, target) {
  let out = [];
  for (let want = target; want <= 64; want *= 2) {
    const raw = Math.max(hi - lo, 1e-12) / want;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw * 0.999);
    out = [];
    for (let k = Math.ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k++) {
      out.push(Math.round(k * step * 1e10) / 1e10);
    }
    if (out.length >= 2) break;
  }
  return out;
}

// Indices of the labels to keep so kept ones are at least `gap` px apart; the newest (rightmost)
// always wins. The same rule as svgchart.thin_labels.
function thin(xs, gap) {
  const order = xs.map((_, i) => i).sort((a, b) => xs[a] - xs[b]);
  const kept = [];
  for (const i of order) {
    if (!kept.length || xs[i] - xs[kept[kept.length - 1]] >= gap) kept.push(i);
  }
  const newest = order[order.length - 1];
  if (order.length && kept[kept.length - 1] !== newest) {
    if (xs[newest] - xs[kept[kept.length - 1]] < gap) kept.pop();
    kept.push(newest);
  }
  return kept;
}

function gib(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "—";
  return v >= 1 ? `${v.toFixed(2)} GiB` : `${(v * 1024).toFixed(1)} MiB`;
}

// The last index with xs[i] <= t, or -1.
function lastAtOrBefore(xs, t) {
  let lo = 0, hi = xs.length - 1, found = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] <= t) { found = mid; lo = mid + 1; } else hi = mid - 1;
  }
  return found;
}

// A series key is the user's (add_series): read only an object's own entries, never what
// its prototype has ("constructor", "toString", "__proto__").
function own(obj, key) {
  return obj && Object.prototype.hasOwnProperty.call(obj, key) ? obj[key] : undefined;
}

function points(model, key) {
  const whole = own(model.get("extra"), key);
  if (whole) return { xs: whole[0], ys: whole[1] };
  const h = own(model.get("history"), key) || [[], []];
  const r = own(model.get("recent"), key) || [[], []];
  return { xs: h[0].concat(r[0]), ys: h[1].concat(r[1]) };
}

// What the model says to draw: every series with its points (hidden: the series' default).
function modelData(model) {
  const specs = model.get("series") || [];
  return {
    lines: specs.map((s) => ({ ...s, ...points(model, s.key), hidden: !!s.hidden })),
    marks: model.get("marks") || [],
  };
}

// A line with at least one reading: only these are listed (no GPU: host RAM alone, as the
// picture lists it, not four GPU lines that cannot be drawn).
function hasData(d) {
  return d.ys.some((y) => y !== null && y !== undefined && !Number.isNaN(y));
}

// The y axis' unit for data that reach `top` GiB: the largest unit the top is at least one of,
// as the picture chooses it (svgchart.byte_axis), so the live chart and its picture agree.
function yUnit(top) {
  for (const [unit, name] of [[1, "GiB"], [1 / 1024, "MiB"], [1 / 1048576, "KiB"]]) {
    if (top >= unit) return { unit, name };
  }
  return { unit: 1 / 1073741824, name: "B" };
}

function byLegend(lines) {
  return lines.map((d, i) => [d, i])
    .sort((a, b) => (a[0].legend ?? 0) - (b[0].legend ?? 0) || a[1] - b[1]).map((p) => p[0]);
}

// Data to pixels. `geom` is {w, h, m: margins}; `zoom` a [t0, t1] or null.
function frameOf(lines, marks, total, geom, zoom) {
  const { w, h, m } = geom;
  const pw = w - m.left - m.right, ph = h - m.top - m.bottom;
  let x0 = Infinity, x1 = -Infinity;
  for (const d of lines) for (const x of d.xs) { if (x < x0) x0 = x; if (x > x1) x1 = x; }
  for (const [x] of marks) { if (x < x0) x0 = x; if (x > x1) x1 = x; }
  if (!Number.isFinite(x0)) { x0 = 0; x1 = 1; }
  // The data starts a moment after 0 (the first reading after the load): the axis starts
  // at 0, so its first tick is there.
  if (!zoom && x0 > 0 && x0 < (x1 - x0) * 0.02) x0 = 0;
  if (zoom) [x0, x1] = zoom;
  if (x1 - x0 < 1e-6) { x0 -= 0.5; x1 += 0.5; }
  // y follows the data in view, never the device total (a 141 GiB axis flattens a few GiB).
  let top = 0;
  for (const d of lines) {
    if (d.hidden) continue;
    for (let i = 0; i < d.xs.length; i++) {
      const y = d.ys[i];
      const inView = d.xs[i] >= x0 && d.xs[i] <= x1
        || (i + 1 < d.xs.length && d.xs[i] < x0 && d.xs[i + 1] > x0);
      if (y !== null && inView && y > top) top = y;
    }
  }
  const { unit, name: unitName } = yUnit(top);
  top = Math.max(top, unit) * 1.15;
  let y1 = top * 1.08;
  if (total && total <= top) y1 = Math.max(y1, total * 1.02);
  return {
    x0, x1, y1, w, h, m, pw, ph, unit, unitName,
    px: (t) => m.left + ((t - x0) / (x1 - x0)) * pw,
    py: (v) => m.top + ph - (v / y1) * ph,
    t: (px) => x0 + ((px - m.left) / pw) * (x1 - x0),
  };
}

// A step line (held until the next reading); a null lifts the pen. Points outside the view
// are clipped by the plot's clip path; one before it keeps the line continuous.
function stepPath(d, f) {
  let out = "", pen = false;
  for (let i = 0; i < d.xs.length; i++) {
    const y = d.ys[i];
    if (y === null || y === undefined) { pen = false; continue; }
    const X = f.px(d.xs[i]).toFixed(1), Y = f.py(y).toFixed(1);
    out += pen ? `H${X}V${Y}` : `M${X} ${Y}`;
    pen = true;
  }
  return out;
}

// The same line in whole pixels, each pixel column's readings kept as their lowest, highest
// and last (a spike survives, the path stays a few KB): for the saved picture.
function compactStepPath(d, f) {
  let out = "", pen = false, cx = 0, cy = 0, col = null;
  const flush = () => {
    if (!col) return;
    for (const y of [col.lo, col.hi, col.last]) if (y !== cy) { out += `V${y}`; cy = y; }
    col = null;
  };
  for (let i = 0; i < d.xs.length; i++) {
    const v = d.ys[i];
    if (v === null || v === undefined) { flush(); pen = false; continue; }
    const X = Math.round(f.px(d.xs[i])), Y = Math.round(f.py(v));
    if (!pen) { flush(); out += `M${X} ${Y}`; cx = X; cy = Y; pen = true; continue; }
    if (X !== cx) { flush(); out += `H${X}`; cx = X; }
    if (!col) col = { lo: Y, hi: Y, last: Y };
    col.lo = Math.min(col.lo, Y); col.hi = Math.max(col.hi, Y); col.last = Y;
  }
  flush();
  return out;
}

// Grid, ticks, axis titles, the total, the cell marks and the lines, into `svg`.
function paint(svg, lines, marks, meta, f, compact) {
  const { m } = f;
  const clipId = `gl-clip-${Math.random().toString(36).slice(2)}`;
  const defs = el("svg:defs", {}, svg);
  el("svg:rect", { x: m.left, y: m.top - 1, width: f.pw, height: f.ph + 2 },
    el("svg:clipPath", { id: clipId }, defs));

  const grid = [], labels = el("svg:g", { class: "gl-ticks" }, svg);
  for (const v of ticks(0, f.y1 / f.unit, 5)) {
    const y = f.py(v * f.unit);
    grid.push(`M${m.left} ${y.toFixed(1)}h${f.pw}`);
    text("svg:text", { x: m.left - 6, y: y + 4, "text-anchor": "end" }, labels, `${v}`);
  }
  for (const t of ticks(f.x0, f.x1, Math.max(2, Math.round(f.pw / 90)))) {
    const x = f.px(t);
    grid.push(`M${x.toFixed(1)} ${m.top}v${f.ph}`);
    text("svg:text", { x: x.toFixed(1), y: m.top + f.ph + 14, "text-anchor": "middle" },
      labels, `${t}`);
  }
  el("svg:path", { class: "gl-grid", d: grid.join("") }, svg);
  el("svg:path", { class: "gl-axis", d: `M${m.left} ${m.top}v${f.ph}h${f.pw}` }, svg);
  text("svg:text", {
    class: "gl-axis-title", x: m.left + f.pw / 2, y: m.top + f.ph + 34, "text-anchor": "middle",
  }, svg, meta.x_title || "");
  const yMid = m.top + f.ph / 2;
  text("svg:text", {
    class: "gl-axis-title", x: 12, y: yMid, "text-anchor": "middle",
    transform: `rotate(-90 12 ${yMid})`,
  }, svg, !meta.y_title || meta.y_title === "GiB" ? f.unitName : meta.y_title);

  const inner = el("svg:g", { "clip-path": `url(#${clipId})` }, svg);
  if (meta.total && meta.total <= f.y1) {
    el("svg:path", {
      class: "gl-total", d: `M${m.left} ${f.py(meta.total).toFixed(1)}h${f.pw}`,
    }, inner);
  }
  // Cell marks: a dotted line each; labels above the plot, thinned so none overlap.
  const shown = marks.filter(([x]) => x >= f.x0 && x <= f.x1);
  if (shown.length) {
    const xs = shown.map(([x]) => f.px(x));
    el("svg:path", {
      class: "gl-marks", d: xs.map((x) => `M${x.toFixed(1)} ${m.top}v${f.ph}`).join(""),
    }, inner);
    const widest = Math.max(...shown.map(([, s]) => s.length)) * LABEL_FONT_PX * 0.62 + 4;
    const g = el("svg:g", { class: "gl-mark-labels", "text-anchor": "middle" }, svg);
    for (const i of thin(xs, widest)) {
      text("svg:text", { x: xs[i].toFixed(1), y: m.top - 5 }, g, shown[i][1]);
    }
  }
  for (const d of lines) {
    if (d.hidden) continue;
    const path = el("svg:path", {
      class: "gl-series", "data-key": d.key, d: compact ? compactStepPath(d, f) : stepPath(d, f),
      "stroke-width": d.width, "stroke-dasharray": d.dash || "none",
    }, inner);
    path.style.stroke = d.color; // a CSS value: a colour that is not one draws nothing
  }
}

// -- the picture saved with the notebook ------------------------------------------------------
// Colours of its own: an <img> shows it apart from the page's stylesheet. Dark ones where the
// element showing it is dark (JupyterLab's dark theme sets color-scheme: dark; chromium passes
// that to the image as prefers-color-scheme), as svgchart.py's picture does.
const PICTURE_CSS = `text{font-family:sans-serif;font-size:11px;fill:#333}
.gl-ticks text{fill:#444}.gl-mark-labels text{fill:#555;font-size:10px}
.gl-grid{stroke:#e5e5e5;fill:none}.gl-axis{stroke:#999;fill:none}
.gl-marks{stroke:#000;stroke-opacity:.25;stroke-dasharray:1 3;fill:none}
.gl-total{stroke:#d62728;stroke-dasharray:6 3;fill:none}.gl-series{fill:none;stroke-linejoin:round}
.gl-title{font-weight:bold}.gl-note{fill:#d62728}
@media (prefers-color-scheme: dark){.gl-bg{fill:#111}text,.gl-ticks text{fill:rgba(255,255,255,.87)}
.gl-mark-labels text{fill:#bbb}.gl-grid{stroke:#424242}.gl-marks{stroke:#fff}.gl-note{fill:#f44336}}`;

function widthOf(s, px) { return s.length * px * 0.62; }

// The chart as a standalone SVG document: its whole data, unzoomed, with a legend.
function pictureSvg(model) {
  const meta = model.get("meta") || {};
  const { lines, marks } = modelData(model);
  // No xmlns attribute: XMLSerializer declares the namespace itself (a second one would make
  // the document invalid, and the image blank).
  const svg = el("svg:svg", { width: PICTURE_W, role: "img" });
  el("svg:style", {}, svg).textContent = PICTURE_CSS;
  const bg = el("svg:rect", { class: "gl-bg", width: PICTURE_W, fill: "#fff" }, svg);
  const title = meta.title || "gpumem_nb chart";
  const note = meta.note || "";
  const twoLines = note && 52 + widthOf(title, 12) + 16 + widthOf(note, 11) > PICTURE_W - 16;
  text("svg:text", { class: "gl-title", x: 52, y: 14 }, svg, title);
  if (note) {
    text("svg:text", { class: "gl-note", x: PICTURE_W - 16, y: twoLines ? 30 : 14,
      "text-anchor": "end" }, svg, note);
  }
  const band = twoLines ? 36 : 20;
  const f = frameOf(lines, marks, meta.total, {
    w: PICTURE_W, h: band + 18 + 220 + 40, m: { left: 52, right: 16, top: band + 18, bottom: 40 },
  }, null);
  paint(svg, lines, marks, meta, f, true);
  // The legend, in the picture's order, wrapping.
  let x = 52, y = f.h + 10;
  for (const d of byLegend(lines).filter((l) => !l.hidden && hasData(l))) {
    const name = d.name.length > 60 ? `${d.name.slice(0, 59)}…` : d.name;
    const w = 28 + widthOf(name, 11) + 14;
    if (x + w > PICTURE_W - 16 && x > 52) { x = 52; y += 18; }
    const swatch = el("svg:path", { d: `M${x} ${y}h22`, "stroke-width": Math.min(d.width, 4),
      "stroke-dasharray": d.dash || "none" }, svg);
    swatch.style.stroke = d.color;
    text("svg:text", { x: x + 28, y: y + 4 }, svg, name);
    x += Math.round(w);
  }
  const height = y + 14;
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${PICTURE_W} ${height}`);
  bg.setAttribute("height", height);
  return { svg: new XMLSerializer().serializeToString(svg), alt: describe(lines, meta) };
}

function describe(lines, meta) {
  const latest = [];
  let at = null;
  for (const d of byLegend(lines)) {
    if (d.hidden) continue;
    for (let i = d.ys.length - 1; i >= 0; i--) {
      if (d.ys[i] === null) continue;
      latest.push(`${d.name} ${gib(d.ys[i])}`);
      at = Math.max(at ?? d.xs[i], d.xs[i]);
      break;
    }
  }
  const head = `gpumem_nb chart (saved with the notebook)${meta.title ? `, ${meta.title}` : ""}`;
  return latest.length ? `${head}: ${latest.join(", ")} at ${Math.round(at)} s` : head;
}

function base64(textValue) {
  const bytes = new TextEncoder().encode(textValue);
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(bin);
}

// The saved stand-in for the chart's output: ipywidgets' own HTML widget, which needs none of
// this code to show (JupyterLab, Notebook 7, nbconvert's HTML with its widget script), holding
// the header and banner as they were and the picture.
// ipywidgets marks the view of a model without a kernel (every saved one, once reopened) with a
// red broken-link icon; beside a picture that says it was saved, it reads as breakage.
const NO_ICON = "<style>.jupyter-widgets.jupyter-widgets-disconnected:has(.gpumem-saved,"
  + ".gpumem-saved-replay)::before{display:none}</style>";

function snapshot(model, parts) {
  const ids = model.get("parts") || {};
  if (!ids.box) return null;
  const version = (parts.header && parts.header.get("_model_module_version")) || "2.0.0";
  const module = "@jupyter-widgets/controls";
  const saved = (value) => [ids.box, {
    model_name: "HTMLModel", model_module: module, model_module_version: version,
    state: {
      _model_name: "HTMLModel", _model_module: module, _model_module_version: version,
      _view_name: "HTMLView", _view_module: module, _view_module_version: version,
      value, [SAVED_KEY]: true,
    },
  }];
  // A replay: its picture is the kernel's, in the output after this one (the whole recording,
  // marked where the replay stood, with the table there), which this page only has the played
  // part of. Saved as nothing to show, so that picture shows in JupyterLab as in nbconvert.
  if ((model.get("meta") || {}).replay) {
    return saved(`${NO_ICON}<div class="gpumem-saved-replay"></div>`);
  }
  const { svg, alt } = pictureSvg(model);
  const img = document.createElement("img");
  img.src = `data:image/svg+xml;base64,${base64(svg)}`;
  img.alt = alt;
  img.setAttribute("style", "max-width:100%;height:auto"); // a narrow output scales it down
  const note = document.createElement("div");
  note.setAttribute("style", "color:var(--jp-ui-font-color2,#555);font-size:11px");
  note.textContent = "The chart as it was when the notebook was saved; the kernel that drew it "
    + "has ended since. %gpumem watch draws a live one.";
  // ipywidgets' HTML widget is a flex row whose content cannot shrink below what it holds:
  // a box of no width of its own, at least as wide as the output, lets the header table
  // scroll inside it and the picture scale down in a narrow output.
  // gpumem-saved: the picture the kernel keeps in an output of its own, after this one (for
  // nbconvert's HTML offline), hides itself beside this one (widget.py's PICTURE_STYLE).
  const html = NO_ICON + '<div class="gpumem-saved" style="width:0;min-width:100%">'
    + [parts.header, parts.banner].map((m) => (m && m.get("value")) || "").join("")
    + img.outerHTML + note.outerHTML + "</div>";
  return saved(html);
}

// The model ids the notebook's outputs show as widgets; null where the notebook model is not
// JupyterLab's (then every chart is saved).
function shownIds(nb) {
  const cells = nb.cells;
  if (!cells || typeof cells.length !== "number" || typeof cells.get !== "function") return null;
  const ids = new Set();
  for (let i = 0; i < cells.length; i++) {
    const outputs = cells.get(i).outputs;
    if (!outputs || typeof outputs.get !== "function") continue;
    for (let j = 0; j < outputs.length; j++) {
      const view = (outputs.get(j).data || {})[VIEW_MIME];
      if (view && typeof view.model_id === "string") ids.add(view.model_id);
    }
  }
  return ids;
}

// On every save (JupyterLab's "started", before the notebook is serialised): each chart an
// output shows is saved as its picture; a picture saved earlier stays while an output shows
// it, and goes with the last output that did.
function saveCharts(ctx, savers) {
  try {
    const nb = ctx.model;
    const shown = shownIds(nb);
    const md = nb.getMetadata("widgets") || {};
    const old = md[STATE_MIME] || {};
    const state = { ...(old.state || {}) };
    for (const [id, entry] of Object.entries(savers.kept)) {
      if (!(id in state)) state[id] = entry; // dropped by a save of ipywidgets' own
    }
    for (const [id, entry] of Object.entries(state)) {
      if (entry && entry.state && entry.state[SAVED_KEY] && shown && !shown.has(id)) {
        delete state[id];
      }
    }
    for (const saver of savers.charts) {
      const snap = saver.snapshot();
      if (snap && (!shown || shown.has(snap[0]))) state[snap[0]] = snap[1];
    }
    savers.kept = Object.fromEntries(Object.entries(state)
      .filter(([, e]) => e && e.state && e.state[SAVED_KEY]));
    const before = JSON.stringify(old.state || {});
    if (JSON.stringify(state) === before) return;
    if (!Object.keys(state).length && typeof nb.deleteMetadata === "function"
        && Object.keys(md).length === 1) {
      nb.deleteMetadata("widgets");
      return;
    }
    nb.setMetadata("widgets", {
      ...md, [STATE_MIME]: { version_major: 2, version_minor: 0, ...old, state },
    });
  } catch (e) {
    console.warn("gpumem_nb: the chart's picture was not saved with the notebook", e);
  }
}

// anywidget calls this once per model, in the page. In JupyterLab and Notebook 7 the widget
// manager is the notebook's (jupyterlab_widgets' WidgetManager), whose `context` is the
// notebook's document context: its saveState signal says "started" before each save. Other
// frontends have none, and nothing is saved there.
function initialize({ model }) {
  const manager = model.widget_manager;
  const ctx = manager && manager.context;
  if (!ctx || !ctx.saveState || typeof ctx.saveState.connect !== "function" || !ctx.model
      || typeof ctx.model.setMetadata !== "function") return undefined;
  let savers = ctx[SAVERS];
  if (!savers) {
    // The pictures saved earlier, as this page found them: a save of ipywidgets' own (its
    // setting on) keeps only the widgets a kernel holds, and would drop them.
    const found = ((ctx.model.getMetadata("widgets") || {})[STATE_MIME] || {}).state || {};
    const kept = Object.fromEntries(Object.entries(found)
      .filter(([, e]) => e && e.state && e.state[SAVED_KEY]));
    savers = ctx[SAVERS] = { charts: new Set(), kept };
    ctx.saveState.connect((_, state) => { if (state === "started") saveCharts(ctx, savers); });
  }
  const parts = {};
  const resolve = () => {
    const ids = model.get("parts") || {};
    for (const k of ["header", "banner"]) {
      if (ids[k] && !parts[k]) manager.get_model(ids[k]).then((m) => { parts[k] = m; }, () => {});
    }
  };
  resolve();
  model.on("change:parts", resolve);
  const saver = { snapshot: () => snapshot(model, parts) };
  savers.charts.add(saver);
  return () => { savers.charts.delete(saver); };
}

// The notebook's session (JupyterLab, Notebook 7), for the kernel's status; null elsewhere.
function sessionOf(model) {
  const manager = model.widget_manager;
  const ctx = manager && manager.context;
  const session = ctx && ctx.sessionContext;
  return session && session.statusChanged && typeof session.statusChanged.connect === "function"
    ? session : null;
}
// Kernel states after which this chart's kernel, and so its comm, is gone for good.
const GONE = new Set(["restarting", "autorestarting", "dead", "terminating"]);
const GONE_NOTE = "The kernel restarted or stopped: this chart is frozen as it was, and its "
  + "controls do nothing now. Run %gpumem watch again for a live chart.";

// -- the live view ----------------------------------------------------------------------------
function requestId() {
  return `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
}

function render({ model, el: host }) {
  const root = el("div", { class: "gpumem-live" }, host);
  const top = el("div", { class: "gl-top" }, root);
  const title = el("span", { class: "gl-title" }, top);
  const pausedNote = el("span", { class: "gl-paused", hidden: "" }, top);
  const note = el("span", { class: "gl-note" }, top);
  const plot = el("div", { class: "gl-plot" }, root);
  const svg = el("svg:svg", { height: HEIGHT, class: "gl-svg" }, plot);
  const tip = el("div", { class: "gl-tip", hidden: "" }, plot);
  const legend = el("div", { class: "gl-legend" }, root);
  const controls = el("div", { class: "gl-controls" }, root);
  const device = el("label", { class: "gl-device", hidden: "" }, controls);
  text("span", {}, device, "device");
  const select = el("select", { class: "gl-device-select" }, device);
  const devicePending = el("span", { class: "gl-pending" }, device);
  const pause = el("button", { class: "gl-button gl-pause", type: "button" }, controls);
  const cleanup = el("button", {
    class: "gl-button gl-cleanup", type: "button",
    title: "Drop the stored exception, gc.collect(), empty_cache(); never deletes your variables",
  }, controls);

  const view = {
    width: 0,
    zoom: null, // [t0, t1] while zoomed: updates keep it
    hidden: new Map(), // key -> bool, from a legend click (else the series' own default)
    mouse: null, // the last pointer position over the plot, px
    drag: null,
    frame: null,
    draws: 0,
    lines: [],
    frozen: null, // while paused: the lines and marks as they were
    pending: { cleanup: null, device: null }, // requests the kernel has not answered yet
    options: "",
    // The kernel restarted or stopped. JupyterLab drops the chart's comm before the kernel
    // hears of it, so the kernel cannot turn the chart into its picture: the page says so
    // and disables the controls (before, a restart mid-replay left Pause and Clean up
    // looking clickable on a chart nothing would update again).
    gone: false,
  };

  const isHidden = (s) => (view.hidden.has(s.key) ? view.hidden.get(s.key) : !!s.hidden);

  function shownData() {
    const { lines, marks } = view.frozen || modelData(model);
    return { lines: lines.map((d) => ({ ...d, hidden: isHidden(d) })), marks };
  }

  function draw() {
    view.frame = null;
    const meta = model.get("meta") || {};
    const { lines, marks } = shownData();
    view.lines = lines;
    const f = frameOf(lines, marks, meta.total,
      { w: Math.max(view.width, 200), h: HEIGHT, m: M }, view.zoom);
    view.frame = f;
    title.textContent = meta.title || "";
    note.textContent = view.gone ? GONE_NOTE : meta.note || "";
    root.classList.toggle("gl-gone", view.gone);
    pausedNote.hidden = !view.frozen || view.gone;
    pausedNote.textContent = "paused: the lines hold still";
    svg.setAttribute("width", f.w);
    svg.setAttribute("viewBox", `0 0 ${f.w} ${HEIGHT}`);
    svg.replaceChildren();
    paint(svg, lines, marks, meta, f, false);
    if (view.drag && view.drag.mode === "zoom") {
      const a = Math.min(view.drag.x0, view.drag.x), b = Math.max(view.drag.x0, view.drag.x);
      el("svg:rect", { class: "gl-zoombox", x: a, y: M.top, width: b - a, height: f.ph }, svg);
    }
    drawLegend(lines);
    drawControls(meta);
    drawHover();
    view.draws += 1;
  }

  function drawLegend(lines) {
    legend.replaceChildren();
    for (const d of byLegend(lines).filter(hasData)) {
      const item = el("button", {
        class: "gl-item" + (d.hidden ? " gl-off" : ""), type: "button", "data-key": d.key,
        title: `${d.name}: ${d.hidden ? "show this line" : "hide this line"}`,
      }, legend);
      const sw = el("svg:svg", { width: 22, height: 10, class: "gl-swatch" }, item);
      const swatch = el("svg:path", {
        d: "M1 5h20", "stroke-width": Math.min(d.width, 4), "stroke-dasharray": d.dash || "none",
      }, sw);
      swatch.style.stroke = d.color;
      // <bdi>: a right-to-left name stays inside its own item.
      text("bdi", { class: "gl-name" }, item, d.name);
      item.addEventListener("click", () => {
        view.hidden.set(d.key, !d.hidden);
        schedule();
      });
    }
    if (view.zoom) {
      const reset = text("button", { class: "gl-reset", type: "button" }, legend, "reset zoom");
      reset.title = "follow the newest data again (or double-click the plot)";
      reset.addEventListener("click", () => { view.zoom = null; schedule(); });
    }
  }

  function drawControls(meta) {
    const devices = meta.devices || null;
    device.hidden = !devices;
    const options = JSON.stringify(devices);
    if (devices && options !== view.options) {
      view.options = options;
      select.replaceChildren(...devices.map(([label, value]) => {
        const o = el("option", { value: String(value) });
        o.textContent = label;
        return o;
      }));
    }
    select.disabled = view.gone;
    pause.disabled = view.gone;
    const want = view.pending.device ? view.pending.device.value : meta.device;
    if (devices && select.value !== String(want)) select.value = String(want);
    devicePending.textContent = !view.pending.device ? ""
      : meta.busy ? "queued until the cell ends" : "switching…";
    select.classList.toggle("gl-is-pending", !!view.pending.device);

    const paused = !!model.get("paused");
    pause.textContent = paused ? "Resume" : "Pause";
    pause.title = paused ? "follow the GPU again" : "hold the lines still (the readings go on)";
    pause.setAttribute("aria-pressed", String(paused));

    cleanup.textContent = !view.pending.cleanup ? "Clean up"
      : meta.busy ? "Clean up: queued until the cell ends" : "Cleaning up…";
    cleanup.disabled = view.gone || !!view.pending.cleanup;
    cleanup.classList.toggle("gl-is-pending", !!view.pending.cleanup);
  }

  function drawHover() {
    const f = view.frame;
    if (!f || !view.mouse || view.drag) { tip.hidden = true; return; }
    const [mx] = view.mouse;
    if (mx < M.left || mx > M.left + f.pw) { tip.hidden = true; return; }
    const t = f.t(mx);
    // Built as nodes, never as HTML: a series' name and colour are data.
    const rows = [];
    for (const d of byLegend(view.lines)) {
      if (d.hidden) continue;
      const i = lastAtOrBefore(d.xs, t);
      if (i < 0) continue;
      const row = el("div", { class: "gl-tip-row" });
      const dot = el("span", { class: "gl-dot" }, row);
      dot.style.background = d.color;
      text("bdi", {}, row, d.name);
      row.append(": ");
      text("b", {}, row, gib(d.ys[i]));
      rows.push(row);
    }
    if (!rows.length) { tip.hidden = true; return; }
    el("svg:path", { class: "gl-hover", d: `M${mx} ${M.top}v${f.ph}` }, svg);
    const head = text("div", { class: "gl-tip-t" }, null, `${t.toFixed(1)} s`);
    tip.replaceChildren(head, ...rows);
    tip.style.maxWidth = `${Math.max(f.w - 8, 120)}px`;
    tip.hidden = false;
    // Right of the pointer, else left of it, and always inside the chart.
    const width = tip.offsetWidth;
    let left = mx + 14 + width > f.w ? mx - 14 - width : mx + 14;
    left = Math.max(0, Math.min(left, f.w - width));
    tip.style.left = `${left}px`;
    tip.style.top = `${M.top + 4}px`;
  }

  let pending = false;
  function schedule() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; draw(); });
  }

  // -- the controls: each answers here first ------------------------------------------------
  function onPaused() {
    const paused = !!model.get("paused");
    if (paused && !view.frozen) view.frozen = modelData(model);
    if (!paused) view.frozen = null;
    schedule();
  }
  pause.addEventListener("click", () => {
    if (view.gone) return;
    model.set("paused", !model.get("paused"));
    model.save_changes(); // reaches the kernel once a running cell ends
  });
  cleanup.addEventListener("click", () => {
    if (view.gone || view.pending.cleanup) return;
    view.pending.cleanup = requestId();
    model.send({ kind: "cleanup", id: view.pending.cleanup });
    schedule();
  });
  select.addEventListener("change", () => {
    if (view.gone) return;
    const value = Number(select.value);
    if (model.get("paused")) { // a device picked is a device to follow: the lines move again
      model.set("paused", false);
      model.save_changes();
    }
    view.pending.device = { id: requestId(), value };
    model.send({ kind: "device", id: view.pending.device.id, value });
    schedule();
  });
  function onMessage(msg) {
    if (!msg || msg.kind !== "done") return;
    if (view.pending.cleanup === msg.id) view.pending.cleanup = null;
    if (view.pending.device && view.pending.device.id === msg.id) view.pending.device = null;
    schedule();
  }

  const local = (e) => {
    const r = svg.getBoundingClientRect();
    return [e.clientX - r.left, e.clientY - r.top];
  };
  // Drag: zoom to the dragged span; shift+drag: pan; double-click: follow the data again.
  svg.addEventListener("mousedown", (e) => {
    if (!view.frame || e.button !== 0) return;
    const [x] = local(e);
    const f = view.frame;
    view.drag = { mode: e.shiftKey ? "pan" : "zoom", x0: x, x, range: [f.x0, f.x1] };
    e.preventDefault();
  });
  window.addEventListener("mousemove", onMove);
  window.addEventListener("mouseup", onUp);
  function onMove(e) {
    if (!view.drag) return;
    const [x] = local(e);
    view.drag.x = x;
    if (view.drag.mode === "pan" && view.frame) {
      const [a, b] = view.drag.range;
      const dt = ((x - view.drag.x0) / view.frame.pw) * (b - a);
      view.zoom = [a - dt, b - dt];
    }
    schedule();
  }
  function onUp() {
    const drag = view.drag;
    view.drag = null;
    if (drag && drag.mode === "zoom" && Math.abs(drag.x - drag.x0) > 5 && view.frame) {
      const f = view.frame;
      const a = f.t(Math.min(drag.x, drag.x0)), b = f.t(Math.max(drag.x, drag.x0));
      view.zoom = [a, b];
    }
    if (drag) schedule();
  }
  svg.addEventListener("dblclick", () => { view.zoom = null; schedule(); });
  plot.addEventListener("mousemove", (e) => { view.mouse = local(e); schedule(); });
  plot.addEventListener("mouseleave", () => { view.mouse = null; schedule(); });

  const resize = new ResizeObserver(() => {
    const w = Math.floor(plot.clientWidth);
    if (w > 0 && w !== view.width) { view.width = w; schedule(); }
  });
  resize.observe(plot);
  view.width = Math.floor(plot.clientWidth) || 800;

  const keys = ["series", "history", "recent", "extra", "marks", "meta"];
  for (const k of keys) model.on(`change:${k}`, schedule);
  model.on("change:paused", onPaused);
  model.on("msg:custom", onMessage);
  if (model.get("paused")) view.frozen = modelData(model);
  const session = sessionOf(model);
  const kernelAtStart = session && session.session ? session.session.kernel : null;
  function onKernel() {
    if (view.gone || !session) return;
    const kernel = session.session ? session.session.kernel : null;
    const replaced = kernelAtStart !== null && kernel !== kernelAtStart;
    if (replaced || (kernel && GONE.has(kernel.status))) {
      view.gone = true;
      view.frozen = view.frozen || modelData(model); // what it showed stays, unmoving
      view.pending = { cleanup: null, device: null };
      schedule();
    }
  }
  if (session) {
    session.statusChanged.connect(onKernel);
    if (session.kernelChanged) session.kernelChanged.connect(onKernel);
  }
  draw();

  // What the browser tests read (like plotly's graph div): what is drawn, not how.
  root.gpumemState = () => {
    const latest = Object.create(null), hidden = Object.create(null);
    let count = 0, last = -1;
    for (const d of view.lines) {
      hidden[d.name] = d.hidden;
      count += d.xs.length;
      for (let i = d.xs.length - 1; i >= 0; i--) {
        if (d.ys[i] === null) continue;
        latest[d.name] = { x: d.xs[i], y: d.ys[i] };
        last = Math.max(last, d.xs[i]);
        break;
      }
    }
    return {
      points: count, last, latest, hidden, draws: view.draws,
      zoom: view.zoom ? [...view.zoom] : null,
      xrange: view.frame ? [view.frame.x0, view.frame.x1] : null,
      paused: !!view.frozen,
      gone: view.gone,
      pending: { cleanup: !!view.pending.cleanup, device: !!view.pending.device },
    };
  };

  return () => {
    for (const k of keys) model.off(`change:${k}`, schedule);
    model.off("change:paused", onPaused);
    model.off("msg:custom", onMessage);
    if (session) {
      session.statusChanged.disconnect(onKernel);
      if (session.kernelChanged) session.kernelChanged.disconnect(onKernel);
    }
    window.removeEventListener("mousemove", onMove);
    window.removeEventListener("mouseup", onUp);
    resize.disconnect();
  };
}

export default { initialize, render };
