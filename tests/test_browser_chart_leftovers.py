"""What the browser review of 2026-12-05 still found on the chart, in chromium and JupyterLab:

- with no GPU, the live chart's legend listed four GPU lines that had no data, and its y axis
  was in GiB where its picture used MiB;
- a kernel restart, or a saved notebook reopened, put ipywidgets' red broken-link icon beside
  the chart, which reads as breakage where the chart already says it is frozen or saved;
- a notebook saved during a replay and reopened showed the page's picture of the part played
  (0-6.5 s) in JupyterLab, and the kernel's picture of the whole recording in nbconvert.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest

from .browser_harness import (
    ErrorWatch,
    chromium,
    open_notebook,
    run_cell,
    run_first_cell,
    running_lab,
    screenshot,
    use_two_fake_gpus,
    wait_kernel_idle,
    write_notebook,
)
from .test_browser_chart import current_session, end_sessions, save

pytestmark = pytest.mark.browser
CHART = ".jp-Notebook .gpumem-live"
# ipywidgets' broken-link icons a user can see: the ::before of a disconnected view.
ICONS = """() => Array.from(document.querySelectorAll('.jp-Notebook .jupyter-widgets-disconnected'))
  .filter(e => { const b = getComputedStyle(e, '::before');
                 return b.display !== 'none' && b.content !== 'none' && b.content !== ''; })
  .length"""
LIVE = """() => { const r = document.querySelector('.jp-Notebook .gpumem-live');
  if (!r) return null;
  return {legend: Array.from(r.querySelectorAll('.gl-legend .gl-item')).map(b => b.innerText),
          y_title: Array.from(r.querySelectorAll('.gl-axis-title')).map(t => t.textContent)[1],
          drawn: r.querySelectorAll('path.gl-series').length}; }"""
PICTURE = """() => Array.from(document.querySelectorAll('.jp-Notebook .jp-OutputArea img'))
  .filter(x => (x.alt || '').startsWith('gpumem_nb chart') && x.offsetParent !== null
          && x.naturalWidth > 0).map(x => x.src)"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: Any) -> Any:
    with running_lab(tmp_path_factory.mktemp("lab")) as lab:
        yield lab


@pytest.fixture(scope="module")
def browser() -> Any:
    with chromium() as b:
        yield b


def test_no_gpu_legend_lists_only_host_ram_in_the_pictures_unit_and_a_restart_shows_no_icon(
        lab, browser):
    folder = lab.folder("no-gpu")
    path = write_notebook(folder, "host.ipynb", [
        "%load_ext gpumem_nb", "%gpumem watch",
        "held = bytearray(300 * 2**20)\nimport time; time.sleep(1.5)"])
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    try:
        with ErrorWatch(page, lab, folder):
            open_notebook(page, lab, path)
            run_first_cell(page, "no GPU visible")
            run_cell(page, 1)
            run_cell(page, 2)
            page.wait_for_function(f"() => ({LIVE})()?.drawn >= 1", timeout=20_000)
            page.wait_for_timeout(1200)
            live = page.evaluate(LIVE)
            screenshot(page, "browser-no-gpu-legend.png")
            assert live["legend"] == ["host RAM (RSS)"], live
            # 300 MiB and more of host RAM: the picture's axis reads MiB, and so does this one.
            assert live["y_title"] == "MiB", live
            assert page.evaluate(ICONS) == 0
            current_session(page, "restartKernel()")
            wait_kernel_idle(page)
            page.wait_for_timeout(1500)
            assert page.evaluate(ICONS) == 0, "a broken-link icon by the frozen chart"
    finally:
        context.close()


def test_a_replay_saved_live_reopens_with_the_kernels_picture_as_nbconvert_shows_it_no_icon(
        lab, browser):
    folder = lab.folder("replay-saved")
    use_two_fake_gpus(folder)
    path = write_notebook(folder, "replay.ipynb", [
        "%load_ext gpumem_nb", "%gpumem watch --replay bundled", "import time; time.sleep(3)"])
    file = folder / "replay.ipynb"
    context = browser.new_context(viewport={"width": 1400, "height": 1200})
    page = context.new_page()
    try:
        with ErrorWatch(page, lab, folder) as watch:
            open_notebook(page, lab, path)
            run_first_cell(page, "watching GPU")
            run_cell(page, 1)
            run_cell(page, 2)
            page.wait_for_function(f"() => !!document.querySelector('{CHART} path.gl-series')",
                                   timeout=20_000)
            save(page, file)  # saved while live, then the kernel goes, no later save
            watch.leaving_notebook()
            page.goto("about:blank")
            page.wait_for_timeout(1000)
            end_sessions(lab, path)
            open_notebook(page, lab, path)
            wait_kernel_idle(page)
            page.wait_for_timeout(2500)  # the widget manager restores what it can by then
            shown = page.evaluate(PICTURE)
            screenshot(page, "browser-replay-reopened.png")
            assert len(shown) == 1, shown  # one picture: the kernel's
            assert page.evaluate(ICONS) == 0, "a broken-link icon by the reopened chart"
            text = page.locator(".jp-Notebook .jp-Cell").nth(1).inner_text()
            assert "where the replay stood" in text and "recorded process" in text, text
    finally:
        context.close()

    from nbconvert import HTMLExporter

    html, _ = HTMLExporter().from_filename(str(file))
    exported = re.findall(r'src="(data:image/svg\+xml;base64,[^"]+)"', html)
    assert shown[0] in exported, "JupyterLab and nbconvert show different pictures"
    svg = base64.b64decode(shown[0].split("base64,")[1]).decode()
    assert "replay here" in svg
