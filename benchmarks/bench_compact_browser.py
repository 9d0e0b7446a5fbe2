"""``%gpumem watch --compact`` in chromium and JupyterLab: its bytes and redraw cost, measured
as the chart's were (benchmarks/bench_chart_browser.py), on two fake H200s whose memory grows
while a cell runs.

For each run, a fresh notebook and kernel:

1. ``%load_ext gpumem_nb``, then ``%gpumem watch --compact``: the time from Shift+Enter to the
   first line drawn, and the bytes the kernel's websocket delivered for that cell;
2. a cell that allocates 256 MiB a second for ``GROW_S`` seconds: the bytes delivered while it
   runs, the updates drawn (compact.js counts its draws), so the bytes per update, and each
   redraw's time in the page (DOM and layout, compact.js's own ``performance.now()``);
3. with ``--screens DIR``: screenshots of the reading in JupyterLab's light and dark themes,
   and of the reading pinned (JupyterLab's "Create New View for Output").

    python benchmarks/bench_compact_browser.py [--runs 3] [--out results.json] [--screens DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_chart_browser import WireMeter
from tests.browser_harness import (
    chromium,
    open_notebook,
    run_cell,
    running_lab,
    use_two_fake_gpus,
    wait_cell_done,
    wait_kernel_idle,
    write_notebook,
)

GROW_S = 8
CELLS = ["%load_ext gpumem_nb", "%gpumem watch --compact",
         f"import time, torch\nxs = []\nfor _ in range({GROW_S}):\n"
         "    xs.append(torch.cuda.tensor(2**28)); time.sleep(1)",
         "del xs"]
COMPACT = ".jp-Notebook .gpumem-compact-live"
STATE = f"() => {{ const r = document.querySelector('{COMPACT}'); " \
        "return r && r.gpumemCompact ? r.gpumemCompact() : null; }"


def start(page: Any, lab: Any, folder: Path) -> WireMeter:
    use_two_fake_gpus(folder)
    path = write_notebook(folder, "compact.ipynb", CELLS)
    meter = WireMeter(page)
    open_notebook(page, lab, path)
    wait_kernel_idle(page)
    for attempt in range(3):  # a Shift+Enter before the kernel is connected is dropped
        run_cell(page, 0, wait=False)
        try:
            wait_cell_done(page, 0, timeout_ms=20_000)
            break
        except Exception:
            if attempt == 2:
                raise
    page.wait_for_timeout(1000)
    return meter


def one_run(lab: Any, browser: Any, n: int, screens: Path | None = None) -> dict[str, Any]:
    folder = lab.folder(f"compact-{n}")
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    try:
        meter = start(page, lab, folder)
        before = meter.received
        t0 = time.monotonic()
        run_cell(page, 1, wait=False)
        page.wait_for_selector(f"{COMPACT} .gc-line", timeout=60_000)
        first_s = time.monotonic() - t0
        wait_cell_done(page, 1)
        page.wait_for_timeout(500)
        first_bytes = meter.received - before
        drawn0 = page.evaluate(STATE)["draws"]
        b0, t0 = meter.received, time.monotonic()
        run_cell(page, 2, wait=False)
        wait_cell_done(page, 2, timeout_ms=60_000)
        page.wait_for_timeout(1500)  # the reading after the cell's end
        window_s = time.monotonic() - t0
        live_bytes = meter.received - b0
        state = page.evaluate(STATE)
        updates = state["draws"] - drawn0
        redraw_ms = state["drawMs"][1:]  # the first draw builds the view
        result = {
            "run": n, "load_1min": round(os.getloadavg()[0], 2),
            "first_compact_s": round(first_s, 3),
            "first_watch_kb": round(first_bytes / 1e3, 1),
            "lines": state["lines"], "updates": updates,
            "window_s": round(window_s, 1),
            # The window's frames include the cell's own execute messages (a few hundred
            # bytes): an upper bound on what an update costs.
            "bytes_per_update": round(live_bytes / max(updates, 1)),
            "live_kb_per_s": round(live_bytes / window_s / 1e3, 2),
            "redraw_ms_median": round(statistics.median(redraw_ms), 3) if redraw_ms else None,
            "redraw_ms_max": round(max(redraw_ms), 3) if redraw_ms else None,
            "text": state["text"],
        }
        if screens is not None:
            shoot(page, screens)
        return result
    finally:
        context.close()


def _shot(page: Any, path: Path) -> None:
    cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
    cell.scroll_into_view_if_needed()
    box = cell.bounding_box()
    page.screenshot(path=str(path), clip={"x": 0, "y": max(box["y"] - 120, 0),
                                          "width": 1400, "height": box["height"] + 200})


def shoot(page: Any, screens: Path) -> None:
    screens.mkdir(parents=True, exist_ok=True)
    _shot(page, screens / "compact-lab-light.png")
    page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', "
                  "{theme: 'JupyterLab Dark'})")
    page.wait_for_timeout(3000)
    _shot(page, screens / "compact-lab-dark.png")
    page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', "
                  "{theme: 'JupyterLab Light'})")
    page.wait_for_timeout(3000)
    page.locator(f"{COMPACT} .gc-pin").click()
    page.wait_for_timeout(2000)
    page.screenshot(path=str(screens / "compact-lab-pinned.png"))


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": len(runs)}
    for k in ("load_1min", "first_compact_s", "first_watch_kb", "updates", "bytes_per_update",
              "live_kb_per_s", "redraw_ms_median", "redraw_ms_max"):
        values = [r[k] for r in runs if r.get(k) is not None]
        if values:
            out[k] = {"median": statistics.median(values), "min": min(values),
                      "max": max(values)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--screens", type=Path, default=None)
    args = ap.parse_args()
    runs = []
    with running_lab(Path(tempfile.mkdtemp(prefix="gpumem-bench-compact-"))) as lab, \
            chromium() as browser:
        print("versions:", lab.versions, file=sys.stderr)
        for n in range(args.runs):
            r = one_run(lab, browser, n, args.screens if n == args.runs - 1 else None)
            print(json.dumps(r), flush=True)
            runs.append(r)
        versions = lab.versions
    summary = {"what": "%gpumem watch --compact, JupyterLab, chromium, two fake H200s",
               "versions": versions, "summary": summarize(runs), "runs": runs}
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["summary"], indent=1))


if __name__ == "__main__":
    main()
