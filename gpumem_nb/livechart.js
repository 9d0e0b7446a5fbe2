// gpumem_nb's live chart: step lines, cell marks, hover, zoom and pan, drawn as SVG.
//
// The anywidget front end of gpumem_nb/livechart.py. No build step and no library: this file is
// sent as is, once per widget, a few KB instead of plotly's 5 MB bundle.
//
// The model holds plain JSON (see livechart.py):
//   series   [{key, name, color, width, dash, hidden}]   drawn in this order, later on top
//   history  {key: [xs, ys]}   the long, downsampled past (resent every few seconds)
//   recent   {key: [xs, ys]}   the points since history's last one (resent each tick)
//   extra    {key: [xs, ys]}   a line another feature sends whole (the cluster's)
//   marks    [[x, label]]      cell starts: a dotted line each, labels thinned so none overlap
//   meta     {x_title, y_title, title, note, total}   total: a dashed line, in GiB, or null
// x is in seconds, y in GiB; null is a gap. Zoom, pan, hidden series and the hover live in
// the view, so every update keeps them.

const SVG = "http://www.w3.org/2000/svg";
const HEIGHT = 300;
const M = { left: 52, right: 16, top: 18, bottom: 40 }; // the plot's margins, px
const LABEL_FONT_PX = 10;

function el(tag, attrs, parent) {
  const node = tag.startsWith("svg:")
    ? document.createElementNS(SVG, tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

// A round tick step (1, 2, 2.5 or 5 times a power of ten) giving about `target` ticks.
function ticks(lo, hi, target) {
  const raw = Math.max(hi - lo, 1e-12) / target;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw * 0.999);
  const out = [];
  for (let k = Math.ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k++) {
    out.push(Math.round(k * step * 1e10) / 1e10);
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

function points(model, key) {
  const whole = (model.get("extra") || {})[key];
  if (whole) return { xs: whole[0], ys: whole[1] };
  const h = (model.get("history") || {})[key] || [[], []];
  const r = (model.get("recent") || {})[key] || [[], []];
  const xs = h[0].concat(r[0]);
  const ys = h[1].concat(r[1]);
  return { xs, ys };
}

function render({ model, el: host }) {
  const root = el("div", { class: "gpumem-live" }, host);
  const top = el("div", { class: "gl-top" }, root);
  const title = el("span", { class: "gl-title" }, top);
  const note = el("span", { class: "gl-note" }, top);
  const plot = el("div", { class: "gl-plot" }, root);
  const svg = el("svg:svg", { height: HEIGHT, class: "gl-svg" }, plot);
  const tip = el("div", { class: "gl-tip", hidden: "" }, plot);
  const legend = el("div", { class: "gl-legend" }, root);

  const view = {
    width: 0,
    zoom: null, // [t0, t1] while zoomed: updates keep it
    hidden: {}, // key -> bool, from a legend click (else the series' own default)
    mouse: null, // the last pointer position over the plot, px
    drag: null,
    frame: null,
    draws: 0,
    data: [],
  };

  const isHidden = (s) => (s.key in view.hidden ? view.hidden[s.key] : !!s.hidden);

  function frameOf(data, marks) {
    const w = Math.max(view.width, 200);
    const pw = w - M.left - M.right, ph = HEIGHT - M.top - M.bottom;
    let x0 = Infinity, x1 = -Infinity;
    for (const d of data) for (const x of d.xs) { if (x < x0) x0 = x; if (x > x1) x1 = x; }
    for (const [x] of marks) { if (x < x0) x0 = x; if (x > x1) x1 = x; }
    if (!Number.isFinite(x0)) { x0 = 0; x1 = 1; }
    if (view.zoom) [x0, x1] = view.zoom;
    if (x1 - x0 < 1e-6) { x0 -= 0.5; x1 += 0.5; }
    // y follows the data in view, never the device total (a 141 GiB axis flattens a few GiB).
    let top = 0;
    for (const d of data) {
      if (d.hidden) continue;
      for (let i = 0; i < d.xs.length; i++) {
        const y = d.ys[i];
        const inView = d.xs[i] >= x0 && d.xs[i] <= x1
          || (i + 1 < d.xs.length && d.xs[i] < x0 && d.xs[i + 1] > x0);
        if (y !== null && inView && y > top) top = y;
      }
    }
    top = Math.max(top, 0.01) * 1.15;
    const total = model.get("meta").total;
    let y1 = top * 1.08;
    if (total && total <= top) y1 = Math.max(y1, total * 1.02);
    return {
      x0, x1, y1, w, pw, ph,
      px: (t) => M.left + ((t - x0) / (x1 - x0)) * pw,
      py: (v) => M.top + ph - (v / y1) * ph,
      t: (px) => x0 + ((px - M.left) / pw) * (x1 - x0),
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

  function draw() {
    view.frame = null;
    const meta = model.get("meta") || {};
    const specs = model.get("series") || [];
    const marks = model.get("marks") || [];
    const data = specs.map((s) => ({ ...s, ...points(model, s.key), hidden: isHidden(s) }));
    view.data = data;
    const f = frameOf(data, marks);
    view.frame = f;
    title.textContent = meta.title || "";
    note.textContent = meta.note || "";
    svg.setAttribute("width", f.w);
    svg.setAttribute("viewBox", `0 0 ${f.w} ${HEIGHT}`);
    svg.replaceChildren();
    const clipId = `gl-clip-${Math.random().toString(36).slice(2)}`;
    const defs = el("svg:defs", {}, svg);
    el("svg:rect", { x: M.left, y: M.top - 1, width: f.pw, height: f.ph + 2 },
      el("svg:clipPath", { id: clipId }, defs));

    // Grid, ticks and axis titles.
    const grid = [], labels = el("svg:g", { class: "gl-ticks" }, svg);
    for (const v of ticks(0, f.y1, 5)) {
      const y = f.py(v);
      grid.push(`M${M.left} ${y.toFixed(1)}h${f.pw}`);
      el("svg:text", { x: M.left - 6, y: y + 4, "text-anchor": "end" }, labels).textContent =
        `${v}`;
    }
    for (const t of ticks(f.x0, f.x1, Math.max(2, Math.round(f.pw / 90)))) {
      const x = f.px(t);
      grid.push(`M${x.toFixed(1)} ${M.top}v${f.ph}`);
      el("svg:text", { x, y: M.top + f.ph + 14, "text-anchor": "middle" }, labels)
        .textContent = `${t}`;
    }
    el("svg:path", { class: "gl-grid", d: grid.join("") }, svg);
    el("svg:path", { class: "gl-axis", d: `M${M.left} ${M.top}v${f.ph}h${f.pw}` }, svg);
    el("svg:text", {
      class: "gl-axis-title", x: M.left + f.pw / 2, y: HEIGHT - 6, "text-anchor": "middle",
    }, svg).textContent = meta.x_title || "";
    const yMid = M.top + f.ph / 2;
    el("svg:text", {
      class: "gl-axis-title", x: 12, y: yMid, "text-anchor": "middle",
      transform: `rotate(-90 12 ${yMid})`,
    }, svg).textContent = meta.y_title || "";

    const inner = el("svg:g", { "clip-path": `url(#${clipId})` }, svg);
    if (meta.total && meta.total <= f.y1) {
      el("svg:path", {
        class: "gl-total", d: `M${M.left} ${f.py(meta.total).toFixed(1)}h${f.pw}`,
      }, inner);
    }
    // Cell marks: a dotted line each; labels above the plot, thinned so none overlap.
    const shown = marks.filter(([x]) => x >= f.x0 && x <= f.x1);
    if (shown.length) {
      const xs = shown.map(([x]) => f.px(x));
      el("svg:path", {
        class: "gl-marks", d: xs.map((x) => `M${x.toFixed(1)} ${M.top}v${f.ph}`).join(""),
      }, inner);
      const widest = Math.max(...shown.map(([, s]) => s.length)) * LABEL_FONT_PX * 0.62 + 4;
      const g = el("svg:g", { class: "gl-mark-labels", "text-anchor": "middle" }, svg);
      for (const i of thin(xs, widest)) {
        el("svg:text", { x: xs[i].toFixed(1), y: M.top - 5 }, g).textContent = shown[i][1];
      }
    }
    for (const d of data) {
      if (d.hidden) continue;
      el("svg:path", {
        class: "gl-series", "data-key": d.key, d: stepPath(d, f), stroke: d.color,
        "stroke-width": d.width, "stroke-dasharray": d.dash || "none",
      }, inner);
    }
    if (view.drag && view.drag.mode === "zoom") {
      const a = Math.min(view.drag.x0, view.drag.x), b = Math.max(view.drag.x0, view.drag.x);
      el("svg:rect", { class: "gl-zoombox", x: a, y: M.top, width: b - a, height: f.ph }, svg);
    }
    drawLegend(data);
    drawHover();
    view.draws += 1;
  }

  function drawLegend(data) {
    legend.replaceChildren();
    for (const d of data) {
      const item = el("button", {
        class: "gl-item" + (d.hidden ? " gl-off" : ""), type: "button", "data-key": d.key,
        title: d.hidden ? "show this line" : "hide this line",
      }, legend);
      const sw = el("svg:svg", { width: 22, height: 10, class: "gl-swatch" }, item);
      el("svg:path", {
        d: "M1 5h20", stroke: d.color, "stroke-width": Math.min(d.width, 4),
        "stroke-dasharray": d.dash || "none",
      }, sw);
      el("span", {}, item).textContent = d.name;
      item.addEventListener("click", () => {
        view.hidden[d.key] = !d.hidden;
        schedule();
      });
    }
    if (view.zoom) {
      const reset = el("button", { class: "gl-reset", type: "button" }, legend);
      reset.textContent = "reset zoom";
      reset.title = "follow the newest data again (or double-click the plot)";
      reset.addEventListener("click", () => { view.zoom = null; schedule(); });
    }
  }

  function drawHover() {
    const f = view.frame;
    if (!f || !view.mouse || view.drag) { tip.hidden = true; return; }
    const [mx] = view.mouse;
    if (mx < M.left || mx > M.left + f.pw) { tip.hidden = true; return; }
    const t = f.t(mx);
    const rows = [];
    for (const d of view.data) {
      if (d.hidden) continue;
      const i = lastAtOrBefore(d.xs, t);
      if (i < 0) continue;
      rows.push(`<div><span class="gl-dot" style="background:${d.color}"></span>` +
        `${escapeHtml(d.name)}: <b>${gib(d.ys[i])}</b></div>`);
    }
    if (!rows.length) { tip.hidden = true; return; }
    el("svg:path", { class: "gl-hover", d: `M${mx} ${M.top}v${f.ph}` }, svg);
    tip.innerHTML = `<div class="gl-tip-t">${t.toFixed(1)} s</div>` + rows.join("");
    tip.hidden = false;
    const right = mx + 14 + tip.offsetWidth > f.w;
    tip.style.left = `${right ? mx - 14 - tip.offsetWidth : mx + 14}px`;
    tip.style.top = `${M.top + 4}px`;
  }

  let pending = false;
  function schedule() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; draw(); });
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
  draw();

  // What the browser tests read (like plotly's graph div): what is drawn, not how.
  root.gpumemState = () => {
    const latest = {}, hidden = {};
    let count = 0, last = -1;
    for (const d of view.data) {
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
    };
  };

  return () => {
    for (const k of keys) model.off(`change:${k}`, schedule);
    window.removeEventListener("mousemove", onMove);
    window.removeEventListener("mouseup", onUp);
    resize.disconnect();
  };
}

function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

export default { render };
