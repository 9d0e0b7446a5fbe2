"""``%gpumem watch --compact`` in chromium and JupyterLab, on two fake H200s: a line per GPU
that follows a cell while it runs, its static line hidden beside it, a pin that opens it in a
panel of its own, and nothing in the error watch.

The figures (bytes per update, redraw time) are benchmarks/bench_compact_browser.py's; the
assertions here catch only gross regressions.
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import bench_compact_browser as bench

from .browser_harness import ErrorWatch, chromium, run_cell, running_lab, wait_cell_done

pytestmark = pytest.mark.browser
OUTSIDE = ("() => Array.from(document.querySelectorAll('.gpumem-compact-live'))"
           ".filter(e => !e.closest('.jp-Notebook')).length")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: Any) -> Any:
    with running_lab(tmp_path_factory.mktemp("lab")) as lab:
        yield lab


@pytest.fixture(scope="module")
def browser() -> Any:
    with chromium() as b:
        yield b


def test_compact_reading_follows_a_running_cell_in_small_updates(lab, browser):
    r = bench.one_run(lab, browser, 0)
    print(r)
    assert r["lines"] == 2  # one per GPU
    assert "GPU 0" in r["text"] and "headroom" in r["text"] and "GPU 1" in r["text"]
    assert "reserved +2.00 GiB" in r["text"]  # the growing cell's delta
    assert r["updates"] >= 4, r  # it moved while the 8 s cell ran
    assert r["bytes_per_update"] < 4000, r
    assert r["redraw_ms_median"] < 50, r


@pytest.mark.parametrize("app_exposed", [False, True])
def test_pin_opens_the_reading_in_a_panel_of_its_own(lab, browser, app_exposed):
    folder = lab.folder(f"pin-{app_exposed}")
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    try:
        with ErrorWatch(page, lab, folder):
            bench.start(page, lab, folder)
            run_cell(page, 1)
            page.wait_for_selector(f"{bench.COMPACT} .gc-line", timeout=60_000)
            # The static line is there for a page without the widget, and hidden here.
            hidden = page.evaluate("""() => Array.from(document.querySelectorAll(
                '.jp-Notebook .gpumem-compact-static')).map(
                e => e.closest('.jp-OutputArea-child').offsetParent === null)""")
            assert hidden == [True], hidden
            if not app_exposed:  # a user's JupyterLab has no window.jupyterapp: it floats
                page.evaluate("() => { window.__app = window.jupyterapp; "
                              "window.jupyterapp = undefined; }")
            page.locator(f"{bench.COMPACT} .gc-pin").click()
            page.wait_for_function(f"() => ({OUTSIDE})() === 1", timeout=10_000)
            if not app_exposed:
                page.evaluate("() => { window.jupyterapp = window.__app; }")
            floating = page.evaluate(
                "() => document.querySelectorAll('.gpumem-compact-live.gc-floating').length")
            assert floating == (0 if app_exposed else 1)
            if not app_exposed:  # in sight with the notebook scrolled to its end
                page.evaluate("() => document.querySelector('.jp-WindowedPanel-outer')"
                              ".scrollTo(0, 1e6)")
                box = page.locator(".gpumem-compact-live.gc-floating").bounding_box()
                assert box is not None and 0 <= box["y"] < 200, box
                # the static line stays hidden: the cell holds a placeholder that unpins
                assert page.locator(".jp-Notebook .gc-placeholder").count() == 1
            run_cell(page, 2, timeout_ms=60_000)
            wait_cell_done(page, 2, timeout_ms=60_000)
            page.wait_for_function(
                "() => Array.from(document.querySelectorAll('.gpumem-compact-live'))"
                ".some(e => !e.closest('.jp-Notebook') && /reserved \\+2\\.00 GiB/"
                ".test(e.innerText))", timeout=20_000)
    finally:
        context.close()
