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
const SPARK_W = 90, SPARK_H = 16;

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

// The index of the notebook cell whose output shows this model (JupyterLab's notebook
// model), or -1.
function cellIndex(ctx, id) {
  const cells = ctx && ctx.model && ctx.model.cells;
  if (!cells || typeof cells.get !== "function") return -1;
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

// JupyterLab's own context menu on this output, and its "Create New View for Output" item:
// what a user would click, for a page that does not expose its application object.
function viaMenu(root) {
  const out = root.closest(".jp-OutputArea-child");
  if (!out) return false;
  const r = out.getBoundingClientRect();
  const at = { bubbles: true, cancelable: true, clientX: r.left + 4, clientY: r.top + 4 };
  out.dispatchEvent(new MouseEvent("contextmenu", { ...at, button: 2 }));
  const item = document.querySelector(`.lm-Menu-item[data-command="${OUTPUT_VIEW}"]`);
  if (!item) {
    document.body.dispatchEvent(new KeyboardEvent("keydown", { key: "Escape", bubbles: true }));
    return false;
  }
  const b = item.getBoundingClientRect();
  const on = { bubbles: true, cancelable: true, button: 0,
    clientX: b.left + b.width / 2, clientY: b.top + b.height / 2 };
  item.dispatchEvent(new MouseEvent("mousemove", on));
  item.dispatchEvent(new MouseEvent("mouseup", on));
  return true;
}

// Pin: a panel of its own in JupyterLab, which stays in sight however far the notebook
// scrolls; elsewhere (Notebook 7, VS Code) the line floats at the window's top right.
async function pin(model, root) {
  const ctx = model.widget_manager && model.widget_manager.context;
  const app = window.jupyterapp;
  const index = cellIndex(ctx, model.model_id);
  try {
    if (app && app.commands && app.commands.hasCommand(OUTPUT_VIEW) && index >= 0) {
      await app.commands.execute(OUTPUT_VIEW, { path: ctx.path, index });
      return "view";
    }
    if (index >= 0 && viaMenu(root)) return "view";
  } catch (e) {
    console.warn("gpumem_nb: could not open a view of the reading; it floats instead", e);
  }
  root.classList.toggle("gc-floating");
  return "float";
}

function render({ model, el: host }) {
  const root = el("div", { class: "gpumem-compact-live" }, host);
  const body = el("div", { class: "gc-lines" }, root);
  const pinButton = el("button", { class: "gc-pin", type: "button",
    title: "Keep this reading in sight: a panel of its own (JupyterLab's Create New View "
      + "for Output), or floating where there is none" }, root, "pin");
  const view = { draws: 0, pinned: "" };
  pinButton.addEventListener("click", async () => { view.pinned = await pin(model, root); });

  function draw() {
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
  }
  model.on("change:lines", draw);
  draw();
  // What the browser tests read: what is drawn, not how.
  root.gpumemCompact = () => ({ lines: body.children.length, draws: view.draws,
    pinned: view.pinned, text: body.innerText });
  return () => model.off("change:lines", draw);
}

export default { render };
