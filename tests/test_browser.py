"""JupyterLab 4 in Debian's chromium, driven as a user drives it, failing on any error anywhere.

Every test runs under an ``ErrorWatch`` (tests/browser_harness.py): an exception in the kernel
(ipywidgets message handlers included), an entry in JupyterLab's log console, an error output
or stderr in the notebook, a browser console error or a server traceback fails it.
``test_the_error_watch_catches_*`` proves the channels fire on injected errors.

One JupyterLab serves the module; each test gets its own folder (the kernel's working
directory, where the kernel-side capture writes and the fakes are chosen), its own workspace
and its own page. No browser is downloaded. Screenshots go to artifacts/.

Other versions of plotly and ipywidgets: ``GPUMEM_NB_BROWSER_PYTHON`` names the Python that
runs JupyterLab and the kernel (the tests themselves run in the current one). For the lowest
versions pyproject.toml allows:

    python3 -m venv /tmp/lowvenv
    /tmp/lowvenv/bin/pip install -e '.[test,lab]' 'plotly==6.0.0' 'ipywidgets==8.1.0'
    GPUMEM_NB_BROWSER_PYTHON=/tmp/lowvenv/bin/python .venv/bin/python -m pytest -m browser

A longer live session: ``GPUMEM_NB_BROWSER_SESSION_S=300`` (seconds).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest

from .browser_harness import (
    ErrorWatch,
    Lab,
    PhaseClock,
    open_notebook,
    run_cell,
    run_first_cell,
    screenshot,
    use_two_fake_gpus,
    wait_cell_done,
    wait_kernel_idle,
    write_notebook,
)

pytestmark = pytest.mark.browser
SESSION_ENV = "GPUMEM_NB_BROWSER_SESSION_S"  # the live session's least length, seconds
VIEWPORT = {"width": 1400, "height": 1300}


# --------------------------------------------------------------------------------------------
# Reading the chart through its own element (gpumem_nb/livechart.js)
# --------------------------------------------------------------------------------------------
CHART = ".jp-Notebook .gpumem-live"
PLOT_STATE = f"""() => {{
  const r = document.querySelector('{CHART}');
  return r && r.gpumemState ? r.gpumemState() : null;
}}"""

ALLOCATED = "allocated"  # the series whose name starts with this: PyTorch's live tensors
RESERVED = "reserved"


def plot(page: Any) -> dict[str, Any]:
    state = page.evaluate(PLOT_STATE)
    assert state is not None, "no gpumem_nb chart on the page"
    return dict(state)


def latest(state: dict[str, Any], prefix: str) -> dict[str, float]:
    found = [v for k, v in state["latest"].items() if k.startswith(prefix)]
    assert found, f"no series named {prefix}…: {sorted(state['latest'])}"
    return max(found, key=lambda v: v["x"])


def header_text(page: Any) -> str:
    return str(page.locator(".jp-Notebook .gpumem-header").first.inner_text())


def wait_chart_has_points(page: Any, timeout_ms: int = 30_000) -> None:
    """The chart is on the page with a line drawn."""
    page.wait_for_function(
        f"() => !!document.querySelector('{CHART} path.gl-series[d^=\"M\"]')",
        timeout=timeout_ms)


def wait_chart_moves(page: Any, seconds: float = 3.0) -> list[dict[str, Any]]:
    """Sample the chart once a second; new points must keep arriving (a frozen line fails)."""
    seen = [plot(page)]
    for _ in range(int(seconds)):
        page.wait_for_timeout(1000)
        seen.append(plot(page))
    lasts = [s["last"] for s in seen]
    assert lasts[-1] - lasts[0] >= seconds - 1.5, f"the chart stopped moving: {lasts}"
    return seen


ALL_GPUS = None  # the dropdown's "all GPUs (sum)": the default while no device is configured


def shown_as(gpu: int | None) -> str:
    return "all GPUs (sum)" if gpu is ALL_GPUS else f"GPU {gpu}"


def chart_follows(page: Any, gpu: int | None, allocated_gib: float, what: str) -> list[str]:
    """What is wrong with the chart's following this choice: its allocated line must end at the
    GPU's figure (the sum for all GPUs) and keep advancing (not a frozen line), the dropdown
    must show the choice, and the header a single GPU's figure. Returned, not raised, so one
    session reports every broken step."""
    deadline = time.monotonic() + 8
    while True:
        y = latest(plot(page), ALLOCATED)["y"]
        if abs(y - allocated_gib) < 0.01 or time.monotonic() > deadline:
            break
        page.wait_for_timeout(250)
    problems = []
    if abs(y - allocated_gib) >= 0.01:
        problems.append(f"{what}: the chart should show {shown_as(gpu)} (allocated "
                        f"{allocated_gib} GiB); its allocated line ends at {y:.3f} GiB")
    before = latest(plot(page), ALLOCATED)["x"]
    page.wait_for_timeout(2000)
    after = latest(plot(page), ALLOCATED)["x"]
    if after - before < 1.0:
        problems.append(f"{what}: the allocated line is frozen at t={before:.1f} s "
                        f"(2 s later it ends at t={after:.1f} s)")
    if dropdown_label(page) != shown_as(gpu):
        problems.append(f"{what}: the dropdown shows {dropdown_label(page)!r}, "
                        f"not {shown_as(gpu)!r}")
    header = header_text(page)
    if gpu is not ALL_GPUS and f"{allocated_gib:.2f} GiB" not in header:
        problems.append(f"{what}: the header does not show GPU {gpu}'s {allocated_gib:.2f} GiB "
                        f"allocated: {header!r}")
    return problems


def choose(page: Any, gpu: int | None) -> None:
    """Pick in the chart's device dropdown, as a user does."""
    select = page.locator(f"{CHART} select.gl-device-select").first
    labels = select.evaluate("s => Array.from(s.options).map(o => o.text)")
    wanted = [x for x in labels if x == shown_as(gpu)]
    assert wanted, f"the dropdown offers no {shown_as(gpu)!r}: {labels}"
    select.select_option(label=wanted[0])


def dropdown_label(page: Any) -> str:
    return str(page.locator(f"{CHART} select.gl-device-select").first.evaluate(
        "s => s.options[s.selectedIndex].text"))


def plot_area(page: Any) -> dict[str, float]:
    """The plot's inner area (inside livechart.js' margins), in page pixels."""
    box = page.locator(f"{CHART} svg.gl-svg").first.bounding_box()
    assert box is not None, "the chart's drawing is not on the page"
    left, right, top, bottom = 52, 16, 18, 40
    return {"x": box["x"] + left, "y": box["y"] + top,
            "width": box["width"] - left - right, "height": box["height"] - top - bottom}


HOVER_LABELS = f"() => document.querySelectorAll('{CHART} .gl-tip:not([hidden])').length"


def hover(page: Any) -> str:
    """Move the mouse across the plot as a user does; the hover box must appear and name the
    values. Returns its text."""
    area = plot_area(page)
    for i in range(20):
        page.mouse.move(area["x"] + area["width"] * (0.4 + i * 0.02),
                        area["y"] + area["height"] * 0.5, steps=2)
        if page.evaluate(HOVER_LABELS) > 0:
            page.wait_for_timeout(200)
            return str(page.locator(f"{CHART} .gl-tip").first.inner_text())
        page.wait_for_timeout(100)
    raise AssertionError("no hover label appeared over the chart")


# --------------------------------------------------------------------------------------------
# The error watch, proven
# --------------------------------------------------------------------------------------------
INJECT = '''\
import ipywidgets as widgets
slider = widgets.IntSlider(value=1, min=0, max=10, description="inject")
def _raise_on_change(change):
    raise RuntimeError("injected: observer raised on a browser change")
slider.observe(_raise_on_change, names="value")
button = widgets.Button(description="inject click")
def _raise_on_click(_):
    raise ValueError("injected: on_click raised")
button.on_click(_raise_on_click)
widgets.HBox([slider, button])'''


def test_the_error_watch_catches_kernel_errors_in_widget_handlers_and_browser_errors(lab, page):
    folder = lab.folder("inject")
    path = write_notebook(folder, "inject.ipynb", ['print("kernel ready")', INJECT])
    watch = ErrorWatch(page, lab, folder)
    open_notebook(page, lab, path)
    run_first_cell(page, "kernel ready")
    run_cell(page, 1)
    assert watch.collect() == {k: [] for k in ("kernel", "log console", "notebook", "browser",
                                                "server")}, "clean before the injection"
    # A browser-originated change whose kernel-side observer raises, a click whose handler
    # raises, and an uncaught error in the page.
    page.locator(".jp-Notebook .widget-slider .noUi-handle").first.focus()
    page.keyboard.press("ArrowRight")
    page.locator("button:has-text('inject click')").click()
    page.evaluate("() => { setTimeout(() => { throw new Error('injected: page error'); }); }")
    page.wait_for_timeout(2500)

    found = watch.collect()
    kernel, console = "\n".join(found["kernel"]), "\n".join(found["log console"])
    for text in ("injected: observer raised on a browser change", "injected: on_click raised"):
        assert text in kernel, f"the kernel capture missed {text!r}:\n{kernel}"
        assert text in console, f"the log console reading missed {text!r}:\n{console}"
    assert "outside any cell" in kernel  # told apart from a cell's own error
    assert "sys.last_value" in kernel  # the stored exception the user never raised
    assert any("injected: page error" in e for e in found["browser"]), found["browser"]
    with pytest.raises(AssertionError, match="injected: observer raised"):
        watch.assert_clean()


# --------------------------------------------------------------------------------------------
# A live session with two GPUs
# --------------------------------------------------------------------------------------------
LIVE_CELLS = [
    "%load_ext gpumem_nb",
    # The kernel's torch is the two-H200 fake: 3 GiB of tensors on GPU 0, 9 GiB on GPU 1.
    "import torch\nx0 = torch.cuda.tensor(3 << 30, device=0)\n"
    "x1 = torch.cuda.tensor(9 << 30, device=1)",
    "%gpumem watch",
    "import time\ntime.sleep(8)",
    "y0 = torch.cuda.tensor(1 << 30, device=0)",
    "%gpumem config --device 1",
    "z = sum(range(10**6))",
]


def test_live_session_with_two_gpus_hover_zoom_legend_pause_cleanup_and_device_switching(
        lab, page):
    folder = lab.folder("live")
    use_two_fake_gpus(folder)
    path = write_notebook(folder, "live.ipynb", LIVE_CELLS)
    with ErrorWatch(page, lab, folder) as watch:
        open_notebook(page, lab, path)
        run_first_cell(page, "watching GPU")  # the fakes are in: two GPUs, not "no GPU visible"
        clock = PhaseClock()  # prints each phase's time: shown with a failure
        problems: list[str] = []  # the chart not following a device choice: reported at the end
        page.wait_for_timeout(2000)
        clock.phase("allocating")
        run_cell(page, 1)
        page.wait_for_timeout(1000)
        clock.phase("%gpumem watch")
        run_cell(page, 2)
        wait_chart_has_points(page)
        problems += chart_follows(page, ALL_GPUS, 12.0, "after %gpumem watch")

        clock.phase("long cell")
        # A long cell: the chart keeps growing while it sleeps, and answers the mouse meanwhile.
        run_cell(page, 3, wait=False)
        page.wait_for_timeout(1000)
        grew = wait_chart_moves(page, 4)
        assert grew[-1]["points"] >= grew[0]["points"], grew
        tip = hover(page)
        # The hover reads the values: GPU 0 and 1 together hold 12 GiB of tensors.
        assert re.search(r"allocated \(live tensors\): 12\.00 GiB", tip), tip
        page.wait_for_timeout(1500)  # updates arrive; the hover stays up and current
        assert page.evaluate(HOVER_LABELS) > 0, "an update cleared the hover label"
        screenshot(page, "browser-live-hover.png")
        wait_cell_done(page, 3, timeout_ms=30_000)
        page.mouse.move(10, 10)
        page.wait_for_timeout(1000)

        clock.phase("zoom")
        # Zoom by dragging across the plot; updates keep the zoom; shift+drag pans;
        # double-click follows the data again.
        area = plot_area(page)
        y_mid = area["y"] + area["height"] * 0.5
        page.mouse.move(area["x"] + area["width"] * 0.2, y_mid)
        page.mouse.down()
        page.mouse.move(area["x"] + area["width"] * 0.4, y_mid, steps=8)
        page.mouse.move(area["x"] + area["width"] * 0.6, y_mid, steps=8)
        page.mouse.up()
        page.wait_for_function(f"() => ({PLOT_STATE})().zoom !== null", timeout=5_000)
        zoomed = plot(page)
        assert zoomed["zoom"][1] > zoomed["zoom"][0], zoomed
        page.wait_for_timeout(2500)  # at least four updates
        after = plot(page)
        assert after["draws"] > zoomed["draws"] and after["zoom"] == zoomed["zoom"], (
            f"an update lost the zoom: {zoomed} then {after}")
        screenshot(page, "browser-live-zoom.png")
        page.keyboard.down("Shift")
        page.mouse.move(area["x"] + area["width"] * 0.5, y_mid)
        page.mouse.down()
        page.mouse.move(area["x"] + area["width"] * 0.3, y_mid, steps=6)
        page.mouse.up()
        page.keyboard.up("Shift")
        panned = plot(page)["zoom"]
        span = zoomed["zoom"][1] - zoomed["zoom"][0]
        assert panned[0] > zoomed["zoom"][0] and abs(panned[1] - panned[0] - span) < 1e-6, (
            zoomed["zoom"], panned)
        page.mouse.dblclick(area["x"] + area["width"] * 0.5, y_mid)
        page.wait_for_function(f"() => ({PLOT_STATE})().zoom === null", timeout=5_000)
        page.wait_for_timeout(1000)

        clock.phase("legend")
        # A legend click hides the reserved line; a second one brings it back.
        def reserved_hidden() -> Any:
            return next(v for k, v in plot(page)["hidden"].items() if k.startswith(RESERVED))

        legend = page.locator(f"{CHART} .gl-item", has_text=re.compile(f"^{RESERVED}")).first
        legend.click()
        page.wait_for_function(
            f"() => Object.entries(({PLOT_STATE})().hidden)"
            f".some(([k, v]) => k.startsWith('{RESERVED}') && v)", timeout=5_000)
        assert page.locator(f"{CHART} path.gl-series[data-key='reserved']").count() == 0
        page.wait_for_timeout(1000)
        assert reserved_hidden(), "an update showed the hidden line again"
        legend.click()
        page.wait_for_function(
            f"() => Object.entries(({PLOT_STATE})().hidden)"
            f".every(([k, v]) => !k.startsWith('{RESERVED}') || !v)", timeout=5_000)
        page.wait_for_timeout(1000)

        clock.phase("pause")
        # Pause: the chart holds still and says so. Resume: it moves again.
        page.locator(f"{CHART} button.gl-pause").first.click()
        page.wait_for_selector(f"{CHART} button.gl-pause:has-text('Resume')", timeout=5_000)
        page.wait_for_timeout(800)
        held = plot(page)["last"]
        page.wait_for_timeout(2500)
        assert plot(page)["last"] == held, "the chart kept moving while paused"
        page.locator(f"{CHART} button.gl-pause").first.click()
        wait_chart_moves(page, 3)

        clock.phase("dropdown")
        # The device dropdown: GPU 0 -> 1 -> 0, the chart and header following each time.
        choose(page, 1)
        problems += chart_follows(page, 1, 9.0, "after choosing GPU 1 in the dropdown")
        screenshot(page, "browser-live-gpu1.png")
        choose(page, 0)
        problems += chart_follows(page, 0, 3.0, "after choosing GPU 0 in the dropdown")

        # More work on GPU 0, then the magic moves the chart to GPU 1, and the dropdown back.
        run_cell(page, 4)
        problems += chart_follows(page, 0, 4.0, "after allocating 1 GiB more on GPU 0")
        page.wait_for_timeout(1000)
        run_cell(page, 5)
        problems += chart_follows(page, 1, 9.0, "after %gpumem config --device 1")
        choose(page, 0)
        problems += chart_follows(page, 0, 4.0,
                                  "after choosing GPU 0 in the dropdown after the magic")
        choose(page, ALL_GPUS)
        problems += chart_follows(page, ALL_GPUS, 13.0, "after choosing all GPUs")
        run_cell(page, 6)
        page.wait_for_timeout(1000)

        clock.phase("longer session (on request)")
        # A longer session on request (GPUMEM_NB_BROWSER_SESSION_S=300 for five minutes): a
        # cell every few seconds and the mouse over the chart, the error watch still on.
        while clock.elapsed_s() < float(os.environ.get(SESSION_ENV, "0")):
            run_cell(page, 6, wait=False)
            page.wait_for_timeout(1500)
            wait_cell_done(page, 6)
            hover(page)
            page.mouse.move(10, 10)
            page.wait_for_timeout(3000)

        clock.phase("cleanup")
        # The cleanup button reports what each step freed.
        page.locator(f"{CHART} button.gl-cleanup").first.click()
        page.wait_for_selector("text=what each step freed", timeout=30_000)
        try:
            wait_chart_moves(page, 2)
        except AssertionError as e:
            problems.append(f"after the cleanup button: {e}")
        elapsed_s = clock.elapsed_s()
        assert elapsed_s >= 30, f"the live session lasted only {elapsed_s:.0f} s"
        page.locator(CHART).first.scroll_into_view_if_needed()
        screenshot(page, "browser-live.png")
        watch.open_log_console()
        screenshot(page, "browser-live-log-console.png")
        assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------------------------
# The replay demonstration
# --------------------------------------------------------------------------------------------
def test_replay_chart_renders_grows_while_a_cell_sleeps_and_cleanup_reports(lab, page):
    folder = lab.folder("replay")
    path = write_notebook(folder, "demo.ipynb", [
        "%load_ext gpumem_nb",
        "%gpumem watch --replay bundled",
        "import time; time.sleep(8)",
    ])
    with ErrorWatch(page, lab, folder):
        open_notebook(page, lab, path)
        run_first_cell(page, "gpumem_nb")
        run_cell(page, 1)
        wait_chart_has_points(page)
        run_cell(page, 2, wait=False)  # sleeps 8 s; the chart must keep moving meanwhile
        page.wait_for_timeout(1000)
        seen = wait_chart_moves(page, 4)
        assert len({s["last"] for s in seen}) >= 4, seen
        screenshot(page, "browser-widget-live.png")
        wait_cell_done(page, 2, timeout_ms=30_000)
        page.locator(f"{CHART} button.gl-cleanup").first.click()
        page.wait_for_selector("text=what each step freed", timeout=30_000)
        screenshot(page, "browser-widget.png")


# --------------------------------------------------------------------------------------------
# A saved notebook: the chart survives without the kernel that drew it
# --------------------------------------------------------------------------------------------
# The static picture in the widget's display bundle: an <img> of an SVG data URI whose alt text
# names it, inside the text/html that GitHub, nbviewer and any frontend without the widget's
# JavaScript show. (JupyterLab falls back to that text/html when the widget's model is gone.)
CHART_IMG = re.compile(r'<img\b[^>]*\bsrc="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"[^>]*>')
CHART_ALT = "gpumem_nb chart"

SAVED_CELLS = [
    "%load_ext gpumem_nb",
    "import torch\nx0 = torch.cuda.tensor(3 << 30, device=0)\n"
    "x1 = torch.cuda.tensor(9 << 30, device=1)",
    "%gpumem watch",
    "import time\ntime.sleep(2)",
]

EXECUTE = """
import nbformat, sys
from nbclient import NotebookClient
path, folder = sys.argv[1], sys.argv[2]
nb = nbformat.read(path, as_version=4)
NotebookClient(nb, timeout=120, kernel_name="python3",
               resources={"metadata": {"path": folder}}).execute()
nb.metadata.pop("widgets", None)  # as tools/tutorials/run_tutorials.py saves the tutorials
nbformat.write(nb, path)
"""


@pytest.fixture(scope="module", autouse=True)
def executed_notebook(lab: Lab) -> Any:
    """Run a notebook headless with nbclient, as tools/tutorials/run_tutorials.py does, on the
    two-GPU fakes (its kernel starts in the folder, so the startup file installs them and the
    error capture), and save it. Started with the module, so that its half minute (the chart's
    5 MB widget state goes through nbclient) overlaps the first tests; the saved-notebook test
    waits for it."""
    folder = lab.folder("saved")
    use_two_fake_gpus(folder)
    path = folder / "executed.ipynb"
    write_notebook(folder, path.name, SAVED_CELLS)
    run = subprocess.Popen([lab.python, "-c", EXECUTE, str(path), str(folder)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=lab.env)

    def wait() -> Path:
        out, _ = run.communicate(timeout=240)
        assert run.returncode == 0, out
        return path

    yield wait
    if run.poll() is None:
        run.kill()
        run.wait()


def chart_images(html: str) -> list[str]:
    """The decoded SVG of every chart picture (alt text naming it) in an HTML document."""
    found = []
    for m in CHART_IMG.finditer(html):
        alt = re.search(r'\balt="([^"]*)"', m.group(0))
        if alt and alt.group(1).startswith(CHART_ALT):
            found.append(base64.b64decode(m.group(1)).decode("utf-8", "replace"))
    return found


def draws_lines(svg: str) -> bool:
    return "<svg" in svg and ("<path" in svg or "<polyline" in svg)


SHOWN_IN_LAB = """o => {
  const img = Array.from(o.querySelectorAll('img'))
    .find(i => (i.alt || '').startsWith('gpumem_nb chart'));
  const r = img && img.getBoundingClientRect();
  const plot = o.querySelector('.js-plotly-plot');
  const drawn = plot && plot.data ? plot.data.reduce(
    (a, t) => a + (t.x ? Array.from(t.x).length : 0), 0) : 0;
  return {picture: !!img && img.complete && img.naturalWidth > 0 && r.width > 100
                   && r.height > 50,
          imgSize: r ? [r.width, r.height] : null, restoredPoints: drawn,
          shows: o.innerText.slice(0, 300)};
}"""


def open_saved(page: Any, lab: Lab, notebook: str) -> None:
    """Open the notebook and run nothing: the kernel that drew its charts is gone, and the
    fresh one has no widget models."""
    open_notebook(page, lab, notebook)
    # JupyterLab completes a notebook's metadata once the kernel answers, and the widget
    # manager restores saved widget state then: look only after that.
    wait_kernel_idle(page)
    page.wait_for_timeout(1500)


OPENED_AS_MODIFIED = """async (saved) => {
  // JupyterLab rewrites the notebook's kernelspec and language_info from the kernel's own once
  // it answers; a notebook whose saved metadata differs then shows as modified.
  const w = window.jupyterapp.shell.currentWidget;
  await w.context.ready;
  await w.sessionContext.ready;
  for (let i = 0; i < 300 && !(w.sessionContext.session && w.sessionContext.session.kernel); i++)
    await new Promise(r => setTimeout(r, 100));
  const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
  if (kernel) { await kernel.info; await kernel.spec; }
  await new Promise(r => setTimeout(r, 1000));
  const canon = v => JSON.stringify(v, (k, x) => x && typeof x === 'object' && !Array.isArray(x)
      ? Object.fromEntries(Object.keys(x).sort().map(key => [key, x[key]])) : x);
  // language_info.version is the Python that ran the notebook: any other Python rewrites it,
  // whatever the notebook holds, so it is left out of the comparison.
  const strip = (key, v) => key === 'language_info' && v && typeof v === 'object'
      ? Object.fromEntries(Object.entries(v).filter(([k]) => k !== 'version')) : v;
  // What JupyterLab writes, from the kernel itself: judged against that too, since JupyterLab
  // does not always get to rewrite the first notebook a page opens before we look.
  const info = kernel ? await kernel.info : null, spec = kernel ? await kernel.spec : null;
  const fromKernel = {
    kernelspec: spec ? {name: kernel.name, display_name: spec.display_name,
                        language: spec.language} : undefined,
    language_info: info ? info.language_info : undefined};
  const differs = (key, drop) => [w.context.model.getMetadata(key), fromKernel[key]].some(
    now => now !== undefined && (drop ? canon(strip(key, now)) !== canon(strip(key, saved[key]))
                                      : canon(now) !== canon(saved[key])));
  return {dirty: w.context.model.dirty,
          rewritten: Object.keys(saved).filter(key => differs(key, true)),
          versionOnly: Object.keys(saved).some(key => differs(key, false) && !differs(key, true))};
}"""


def opened_as_modified(page: Any, path: Path) -> str:
    """Why JupyterLab shows the notebook as modified right after opening it, or ''."""
    saved = nbformat.read(path, as_version=4).metadata
    state = page.evaluate(OPENED_AS_MODIFIED, {k: saved.get(k) for k in ("kernelspec",
                                                                           "language_info")})
    if state["rewritten"]:
        return f"modified: JupyterLab completed its {' and '.join(state['rewritten'])}"
    if state["dirty"] and not state["versionOnly"]:
        return "modified, though its kernelspec and language_info are complete"
    return ""


def chart_shown(page: Any, cell_index: int) -> dict[str, Any]:
    """A chart is shown when the static picture is there and decoded, or when the widget was
    restored from saved state with its points."""
    output = page.locator(".jp-Notebook .jp-Cell").nth(cell_index).locator(".jp-OutputArea")
    output.scroll_into_view_if_needed()
    shown = dict(output.evaluate(SHOWN_IN_LAB))
    shown["chart"] = shown["picture"] or shown["restoredPoints"] > 0
    return shown


def test_saved_notebook_shows_the_chart_in_its_bundle_in_nbconvert_html_and_in_jupyterlab(
        lab, page, executed_notebook):
    path = executed_notebook()
    folder = path.parent
    nb = nbformat.read(path, as_version=4)
    shown = [o for o in nb.cells[2].outputs if o.get("output_type") == "display_data"]
    assert shown, f"%gpumem watch displayed nothing: {nb.cells[2].outputs}"
    # The live view's output, then the picture's (MemoryWidget.display): the picture is in
    # one of them, whichever way the chart ended.
    bundle_html = "".join(o["data"].get("text/html", "") for o in shown)

    from nbconvert import HTMLExporter  # nbviewer renders with nbconvert's HTML exporter

    nbviewer_html, _ = HTMLExporter().from_notebook_node(nb)
    with ErrorWatch(page, lab, folder):  # nbclient's kernel is checked here too
        open_saved(page, lab, f"{folder.name}/{path.name}")
        in_lab = chart_shown(page, 2)
        screenshot(page, "browser-saved-notebook.png")
        problems = []
        svgs = chart_images(bundle_html)
        if not svgs:
            problems.append("the display bundle's text/html has no <img alt='gpumem_nb chart…' "
                            "src='data:image/svg+xml;base64,…'>; it begins: "
                            + bundle_html[:300])
        elif not draws_lines(svgs[0]):
            problems.append("the chart picture draws no line: " + svgs[0][:300])
        if not chart_images(nbviewer_html):
            problems.append("nbconvert's HTML (nbviewer) has no chart picture")
        if not in_lab["chart"]:
            problems.append(f"JupyterLab shows no chart, without a re-run: {in_lab}")
        modified = opened_as_modified(page, path)
        if modified:
            problems.append(f"JupyterLab opens the executed notebook as {modified}")
        assert not problems, "\n".join(problems)


TUTORIALS = sorted((Path(__file__).resolve().parent.parent / "notebooks")
                   .glob("[0-9][0-9]_*.ipynb"))
WATCH = re.compile(r"^\s*%gpumem\s+watch\b", re.M)

KERNEL_METADATA = """
import json
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import start_new_kernel
spec = KernelSpecManager().get_kernel_spec("python3")
km, kc = start_new_kernel(kernel_name="python3")
try:
    info = kc.kernel_info(reply=True, timeout=60)["content"]
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)
print(json.dumps({"kernelspec": {"name": "python3", "display_name": spec.display_name,
                                 "language": spec.language},
                  "language_info": info["language_info"]}))
"""


def what_jupyterlab_writes(lab: Lab) -> dict[str, Any]:
    """The kernelspec and language_info JupyterLab writes into a notebook once its kernel
    answers (the same kernel JupyterLab would start)."""
    out = subprocess.run([lab.python, "-c", KERNEL_METADATA], capture_output=True, text=True,
                         env=lab.env, cwd=lab.root, timeout=120, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def completed_by_jupyterlab(saved: dict[str, Any], written: dict[str, Any]) -> list[str]:
    """The metadata keys JupyterLab would change on opening, which marks the notebook modified.
    language_info.version is the Python that ran it, which no notebook can match everywhere."""
    def strip(key: str, value: Any) -> Any:
        if key == "language_info" and isinstance(value, dict):
            return {k: v for k, v in value.items() if k != "version"}
        return value

    return [key for key in ("kernelspec", "language_info")
            if strip(key, saved.get(key)) != strip(key, written[key])]


def test_the_tutorials_open_unmodified_and_executed_ones_show_their_charts_in_jupyterlab(
        lab, page):
    """What a new user opening notebooks/ meets first: no re-run, the H200's outputs. Every
    tutorial's metadata is what JupyterLab would write (else it opens as modified); every
    executed ``%gpumem watch`` cell shows a chart in JupyterLab, without a re-run."""
    assert TUTORIALS, "no tutorials in notebooks/"
    written = what_jupyterlab_writes(lab)
    problems, to_open = [], []
    for source in TUTORIALS:
        nb = nbformat.read(source, as_version=4)
        completed = completed_by_jupyterlab(nb.metadata, written)
        if completed:
            problems.append(f"{source.name} opens as modified: JupyterLab completes its "
                            + " and ".join(completed))
        charts = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                  and WATCH.search(c.source) and c.get("execution_count") is not None]
        if charts:
            to_open.append((source, charts))
    if to_open:
        folder = lab.folder("tutorials")
        # The tutorials' own error outputs are their content (a failed cell, on purpose): only
        # the live channels count here.
        with ErrorWatch(page, lab, folder, saved_outputs=True) as watch:
            for source, charts in to_open:
                shutil.copy(source, folder / source.name)
                open_saved(page, lab, f"{folder.name}/{source.name}")
                modified = opened_as_modified(page, source)
                if modified and not any(p.startswith(f"{source.name} opens as modified")
                                        for p in problems):
                    problems.append(f"{source.name} opens as {modified}")
                for index in charts:
                    shown = chart_shown(page, index)
                    if not shown["chart"]:
                        problems.append(f"{source.name} cell {index} shows no chart: {shown}")
                screenshot(page, f"browser-tutorial-{source.stem}.png")
                watch.leaving_notebook()
    print(f"opened in JupyterLab: {[s.name for s, _ in to_open] or 'none (none executed)'}")
    assert not problems, "\n".join(problems)
