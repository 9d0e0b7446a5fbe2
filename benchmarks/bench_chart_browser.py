"""The live chart at first sight, measured in chromium: time and bytes to the first chart.

For each frontend (JupyterLab, Notebook 7) and each run, a fresh notebook and kernel:

1. ``%load_ext gpumem_nb``, then ``%gpumem watch --replay bundled``: the time from the
   Shift+Enter (a keydown listener in the page) to the first line of the chart drawn (a
   MutationObserver in the page), the kernel's part of it (the watch cell's pre_run_cell to
   post_run_cell, imports included, from an IPython startup file), and the bytes the kernel's
   websocket delivered for it (Playwright's frames), until the chart is drawn and the cell done;
2. live traffic: bytes per second while a cell sleeps and the chart keeps drawing;
3. a later ``%gpumem watch`` in the same kernel (another cell): the same chart shown again,
   its bytes; then the first watch cell run again, which starts the recording over in a new
   chart: its bytes too;
4. the notebook saved (Ctrl+S), with JupyterLab's "save widget state" on, so the widget state
   counts too: the file's size.

Issue 17's budgets: first chart <= 1 s (kernel <= 0.3 s), <= 200 KB for the first watch,
<= 50 KB for a later one, <= 20 KB/s live, <= 200 KB saved per chart.

    python benchmarks/bench_chart_browser.py [--runs 5] [--frontends lab,notebook]
        [--tree DIR]   # another checkout's gpumem_nb, e.g. a candidate to compare
        [--label NAME] [--out results.json]

Prints one JSON line per run and a summary of medians (``benchmarks.common.emit``). A machine
with other work running skews the times: run it when the machine is quiet.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import contextlib

from tests.browser_harness import (
    chromium,
    open_notebook,
    run_cell,
    running_lab,
    wait_cell_done,
    wait_kernel_idle,
    write_notebook,
)

WATCH = "%gpumem watch --replay bundled"
CELLS = ["%load_ext gpumem_nb", WATCH, "import time; time.sleep(12)", "%gpumem watch"]
LIVE_WINDOW_S = 8.0

# Cell times from inside the kernel: a startup file, so the tree under test needs nothing.
TIMING_STARTUP = """\
def _gpumem_bench_timing():
    import json, os, time
    from IPython import get_ipython
    ip, state = get_ipython(), {}
    path = os.path.join(os.getcwd(), f"cell-times-{os.getpid()}.jsonl")
    def pre(info):
        state["t"], state["src"] = time.perf_counter(), info.raw_cell
    def post(result):
        if "t" in state:
            with open(path, "a") as f:
                f.write(json.dumps({"src": state.pop("src"),
                                    "s": time.perf_counter() - state.pop("t")}) + "\\n")
    ip.events.register("pre_run_cell", pre)
    ip.events.register("post_run_cell", post)
_gpumem_bench_timing()
del _gpumem_bench_timing
"""

# The first line of either chart drawn: ours (livechart.js) or plotly's FigureWidget. Charts
# marked old (an earlier output) do not count.
DRAWN = """() => {
  const fresh = (sel) => Array.from(document.querySelectorAll(sel))
      .some(e => !e.closest('[data-gpumem-old]') && (e.getAttribute('d') || '').startsWith('M'));
  return fresh('.jp-Notebook .gpumem-live path.gl-series')
      || fresh('.jp-Notebook .js-plotly-plot .scatterlayer path.js-line');
}"""

ARM = """(drawn) => {
  for (const o of document.querySelectorAll('.jp-Notebook .jp-OutputArea-output'))
    o.setAttribute('data-gpumem-old', '1');
  const isDrawn = eval(drawn);
  window.__gm = {press: null, drawn: null};
  if (!window.__gmArmed) {
    window.__gmArmed = true;
    document.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && e.shiftKey && window.__gm.press === null)
        window.__gm.press = performance.now();
    }, true);
  }
  if (window.__gmObserver) window.__gmObserver.disconnect();
  window.__gmObserver = new MutationObserver(() => {
    if (window.__gm.drawn === null && window.__gm.press !== null && isDrawn())
      window.__gm.drawn = performance.now();
  });
  window.__gmObserver.observe(document.body, {subtree: true, childList: true,
                                              attributes: true, attributeFilter: ['d']});
}"""


class WireMeter:
    """Bytes the kernel's websocket delivers to the page (and sends), from Playwright."""

    def __init__(self, page: Any) -> None:
        self.received = 0
        self.sent = 0
        page.on("websocket", self._on_socket)

    def _on_socket(self, ws: Any) -> None:
        if "/api/kernels/" not in ws.url:
            return
        ws.on("framereceived", lambda payload: self._add("received", payload))
        ws.on("framesent", lambda payload: self._add("sent", payload))

    def _add(self, which: str, payload: Any) -> None:
        n = len(payload.encode() if isinstance(payload, str) else payload)
        setattr(self, which, getattr(self, which) + n)


def cell_seconds(folder: Path, source: str) -> list[float]:
    out = []
    for path in folder.glob("cell-times-*.jsonl"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if entry["src"].strip() == source:
                out.append(float(entry["s"]))
    return out


def _watch(page: Any, meter: WireMeter, index: int) -> tuple[float, int]:
    """Run the watch cell; (seconds from Shift+Enter to the first line drawn, bytes)."""
    page.evaluate(ARM, DRAWN)
    before = meter.received
    run_cell(page, index, wait=False)
    page.wait_for_function("() => window.__gm.drawn !== null", timeout=120_000)
    wait_cell_done(page, index, timeout_ms=120_000)
    page.wait_for_timeout(300)  # the last messages of the cell's display
    gm = page.evaluate("() => window.__gm")
    return (gm["drawn"] - gm["press"]) / 1e3, meter.received - before


def one_run(lab: Any, browser: Any, frontend: str, n: int) -> dict[str, Any]:
    folder = lab.folder(f"bench-{frontend}-{n}")
    path = write_notebook(folder, "bench.ipynb", CELLS)
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    page = context.new_page()
    meter = WireMeter(page)
    try:
        open_notebook(page, lab, path, frontend)
        wait_kernel_idle(page)
        for attempt in range(3):  # a Shift+Enter before the kernel is connected is dropped
            run_cell(page, 0, wait=False)
            try:
                wait_cell_done(page, 0, timeout_ms=20_000)
                break
            except Exception:
                if attempt == 2:
                    raise
        page.wait_for_timeout(1500)
        first_s, first_bytes = _watch(page, meter, 1)
        kernel_s = cell_seconds(folder, WATCH)
        run_cell(page, 2, wait=False)
        page.wait_for_timeout(1500)
        b0, t0 = meter.received, time.monotonic()
        page.wait_for_timeout(LIVE_WINDOW_S * 1000)
        live = (meter.received - b0) / (time.monotonic() - t0)
        wait_cell_done(page, 2, timeout_ms=60_000)
        later_s, later_bytes = _watch(page, meter, 3)
        _, rerun_bytes = _watch(page, meter, 1)
        page.keyboard.press("Control+s")
        file = folder / "bench.ipynb"
        size = file.stat().st_size
        for _ in range(50):
            page.wait_for_timeout(200)
            if "widget-state" in file.read_text() or file.stat().st_size != size:
                break
        page.wait_for_timeout(500)
        kernel_id = page.evaluate("() => window.jupyterapp.shell.currentWidget"
                                  ".sessionContext.session.kernel.id")
        return {"frontend": frontend, "run": n, "load_1min": round(os.getloadavg()[0], 2),
                "first_chart_s": round(first_s, 3),
                "kernel_s": round(kernel_s[0], 3) if kernel_s else None,
                "browser_s": round(first_s - kernel_s[0], 3) if kernel_s else None,
                "first_watch_kb": round(first_bytes / 1e3, 1),
                "later_watch_kb": round(later_bytes / 1e3, 1),
                "later_chart_s": round(later_s, 3),
                "rerun_replay_kb": round(rerun_bytes / 1e3, 1),
                "live_kb_per_s": round(live / 1e3, 2),
                "saved_notebook_kb": round(file.stat().st_size / 1e3, 1),
                "saved_with_widget_state": "widget-state" in file.read_text(),
                "_kernel_id": kernel_id}
    finally:
        context.close()


def shutdown_kernel(lab: Any, kernel_id: str) -> None:
    req = urllib.request.Request(f"{lab.base}/api/kernels/{kernel_id}?token={lab.token}",
                                 method="DELETE")
    with contextlib.suppress(OSError):
        urllib.request.urlopen(req, timeout=30)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("load_1min", "first_chart_s", "kernel_s", "browser_s", "first_watch_kb",
            "later_watch_kb", "later_chart_s", "rerun_replay_kb", "live_kb_per_s",
            "saved_notebook_kb")
    out: dict[str, Any] = {}
    for frontend in sorted({r["frontend"] for r in runs}):
        mine = [r for r in runs if r["frontend"] == frontend]
        out[frontend] = {"runs": len(mine)}
        for k in keys:
            values = [r[k] for r in mine if r.get(k) is not None]
            if values:
                out[frontend][k] = {"median": round(statistics.median(values), 3),
                                    "min": min(values), "max": max(values)}
    return out


def measure(runs: int = 3, frontends: tuple[str, ...] = ("lab", "notebook"),
            tree: Path | None = None) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="gpumem-bench-chart-"))
    kw: dict[str, Any] = {"widget_state": True, "extra_startup": TIMING_STARTUP}
    if tree is not None:
        kw["tree"] = tree
    with running_lab(tmp, **kw) as lab, chromium() as browser:
        print("versions:", lab.versions, file=sys.stderr)
        for n in range(runs):
            for frontend in frontends:
                r = one_run(lab, browser, frontend, n)
                shutdown_kernel(lab, r.pop("_kernel_id"))
                print(json.dumps(r), flush=True)
                results.append(r)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--frontends", default="lab,notebook")
    ap.add_argument("--tree", type=Path, default=None)
    ap.add_argument("--label", default="gpumem_nb livechart (anywidget)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    runs = measure(args.runs, tuple(args.frontends.split(",")), args.tree)
    from benchmarks.common import emit

    summary = {"candidate": args.label, "summary": summarize(runs), "runs": runs}
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))
    emit("bench_chart_browser", summary)


if __name__ == "__main__":
    main()
