// gpumem_nb's compact reading (%gpumem watch --compact): one line per GPU, a sparkline each,
// and a pin that keeps it in sight. The anywidget front end of CompactReading (livechart.py).
//
// The model holds plain JSON, formatted by the kernel (compact.py):
//   lines [{label, used, total, reserved, allocated, headroom, spark, spark_top, delta, fill}]
//         spark: the recent "used" readings as 0..100 of spark_top
//   meta  {}

const SVG = "http://www.w3.org/2000/svg";
const OUTPUT_VIEW = "notebook:create-output-view"; // JupyterLab's "Create New View for Output"
const VIEW_MIME = "application/vnd.jupyter.widget-view+json";
const SPARK_W = 72, SPARK_H = 16;

function el(tag, attrs, parent, content) {
  const node = tag.startsWith("svg:")
    ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (content !== undefined) node.textContent = content;
  if (parent) parent.appendChild(node);
  return node;
}

function sparkline(levels, parent) {
  const svg = el("svg:svg", { class: "gc-spark", width: SPARK_W, height: SPARK_H,
    viewBox: `0 0 ${SPARK_W} ${SPARK_H}` }, parent);
  if (levels.length < 2) return svg;
  const step = SPARK_W / (levels.length - 1);
  const pts = levels.map((v, i) => `${(i * step).toFixed(1)},${(SPARK_H - 1 - (v / 100)
    * (SPARK_H - 2)).toFixed(1)}`);
  el("svg:polyline", { points: pts.join(" "), class: "gc-spark-line" }, svg);
  return svg;
}

// The index of the notebook cell whose output holds `root`, or -1: its place among the
// notebook's cells in the page (JupyterLab keeps every cell in the page unless its windowing
// setting is "full"; then the model is searched for this model's id).
function cellIndex(ctx, root, id) {
  const nb = root.closest(".jp-Notebook");
  const cell = root.closest(".jp-Cell");
  if (nb && cell) {
    const index = Array.prototype.indexOf.call(nb.querySelectorAll(".jp-Cell"), cell);
    const cells = ctx && ctx.model && ctx.model.cells;
    if (index >= 0 && (!cells || cells.length === nb.querySelectorAll(".jp-Cell").length)) {
      return index;
    }
  }
  const cells = ctx && ctx.model && ctx.model.cells;
  if (!id || !cells || typeof cells.get !== "function") return -1;
  for (let i = 0; i < cells.length; i++) {
    const outputs = cells.get(i).outputs;
    if (!outputs || typeof outputs.get !== "function") continue;
    for (let j = 0; j < outputs.length; j++) {
      const view = (outputs.get(j).data || {})[VIEW_MIME];
      if (view && view.model_id === id) return i;
    }
  }
  return -1;
}

// Pin: in JupyterLab, a panel of its own ("Create New View for Output"), which stays in sight
// however far the notebook scrolls. That command is reachable only where the page exposes
// JupyterLab's application; elsewhere (a default JupyterLab, Notebook 7) the reading floats at
// the window's top right, moved out of the cell (whose containment would scroll it away), and
// a placeholder in the cell unpins it.
async function pin(model, root, host, placeholder) {
  if (root.classList.contains("gc-floating")) {
    root.classList.remove("gc-floating");
    placeholder.remove();
    host.appendChild(root);
    return "";
  }
  const ctx = model.widget_manager && model.widget_manager.context;
  const app = window.jupyterapp;
  const index = cellIndex(ctx, root, model.model_id);
  try {
    if (app && app.commands && app.commands.hasCommand(OUTPUT_VIEW) && index >= 0) {
      await app.commands.execute(OUTPUT_VIEW, { path: ctx.path, index });
      return "view";
    }
  } catch (e) {
    console.warn("gpumem_nb: could not open a view of the reading; it floats instead", e);
  }
  host.appendChild(placeholder);
  document.body.appendChild(root);
  root.classList.add("gc-floating");
  return "float";
}

function render({ model, el: host }) {
  const root = el("div", { class: "gpumem-compact-live" }, host);
  const body = el("div", { class: "gc-lines" }, root);
  const pinButton = el("button", { class: "gc-pin", type: "button",
    title: "Keep this reading in sight: a panel of its own (JupyterLab's Create New View "
      + "for Output), or floating where there is none" }, root, "pin");
  const view = { draws: 0, pinned: "", drawMs: [] };
  // In the cell while the reading floats: it keeps the static line hidden, and unpins.
  const placeholder = el("div", { class: "gpumem-compact-live gc-placeholder" }, null);
  const unpin = el("button", { class: "gc-pin", type: "button" }, placeholder, "unpin");
  placeholder.prepend("gpumem_nb: the reading floats at the window's top right ");
  const toggle = async () => {
    view.pinned = await pin(model, root, host, placeholder);
    pinButton.textContent = view.pinned === "float" ? "unpin" : "pin";
  };
  pinButton.addEventListener("click", toggle);
  unpin.addEventListener("click", toggle);

  function draw() {
    const t0 = performance.now();
    const lines = model.get("lines") || [];
    body.replaceChildren();
    for (const ln of lines) {
      const row = el("div", { class: "gc-line" }, body);
      el("b", { class: "gc-label" }, row, ln.label);
      if (ln.total || ln.reserved) {
        el("span", {}, row, `used ${ln.used} / ${ln.total}`);
        el("span", {}, row, `reserved ${ln.reserved}`);
        el("span", {}, row, `allocated ${ln.allocated}`);
        el("span", { class: ln.fill >= 0.9 ? "gc-headroom gc-low" : "gc-headroom" }, row,
          `headroom ${ln.headroom}`);
      } else {
        el("span", {}, row, ln.used);
      }
      const spark = sparkline(ln.spark || [], row);
      if (ln.spark_top) spark.appendChild(el("svg:title", {}, null, `recent readings, top ${ln.spark_top}`));
      if (ln.delta) el("span", { class: "gc-delta" }, row, `last cell ${ln.delta}`);
    }
    view.draws += 1;
    void root.offsetHeight; // the layout too: what a redraw costs the page
    if (view.drawMs.length < 1000) view.drawMs.push(performance.now() - t0);
  }
  model.on("change:lines", draw);
  draw();
  // What the browser tests read: what is drawn, not how.
  root.gpumemCompact = () => ({ lines: body.children.length, draws: view.draws,
    pinned: view.pinned, floating: root.classList.contains("gc-floating"), text: body.innerText, drawMs: [...view.drawMs] });
  return () => {
    model.off("change:lines", draw);
    if (root.classList.contains("gc-floating")) root.remove();
  };
}

export default { render };
