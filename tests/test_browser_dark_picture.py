"""The chart's saved picture follows the page's theme in chromium instead of showing as a white
card in a dark one (issue 27). The picture is an ``<img>``: it cannot see the page's
stylesheet, but inside it ``prefers-color-scheme`` is the colour scheme of the element that
shows it, which a dark system sets, and JupyterLab's dark theme too (``color-scheme: dark`` on
``<body>``)."""

from __future__ import annotations

import struct
import time
import zlib
from typing import Any

import pytest

from gpumem_nb.svgchart import static_bundle

from .browser_harness import (
    open_notebook,
    run_cell,
    running_lab,
    wait_kernel_idle,
    write_notebook,
)
from .test_svgchart import gpu_data

pytestmark = pytest.mark.browser


def pixel(png: bytes) -> tuple[int, int, int]:
    """The colour of a 1×1 PNG (one row, one pixel: every PNG filter leaves it as it is)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos:pos + 4])
        kind = png[pos + 4:pos + 8]
        if kind == b"IDAT":
            idat += png[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    return raw[1], raw[2], raw[3]


def background(page: Any, img: Any) -> tuple[int, int, int]:
    """The picture's own background, left of its title."""
    box = img.bounding_box()
    return pixel(page.screenshot(clip={"x": box["x"] + 8, "y": box["y"] + 8, "width": 1,
                                       "height": 1}))


def is_dark(rgb: tuple[int, int, int]) -> bool:
    assert max(rgb) < 40 or min(rgb) > 220, f"neither dark nor light: {rgb}"
    return max(rgb) < 40


@pytest.mark.parametrize(("system", "page_scheme", "dark"), [
    ("dark", "", True), ("light", "", False),  # a page of no scheme of its own
    ("light", "dark", True),  # a dark page on a light system: the reviewer's white card
    ("dark", "light", False),
])
def test_the_saved_picture_takes_the_colour_scheme_it_is_shown_in(
        browser, system, page_scheme, dark):
    html = static_bundle(gpu_data())["text/html"]
    context = browser.new_context(color_scheme=system, viewport={"width": 900, "height": 500})
    scheme = f"color-scheme:{page_scheme};" if page_scheme else ""
    try:
        page = context.new_page()
        page.set_content(f"<body style='{scheme}margin:0;background:#777'>{html}</body>")
        page.wait_for_function("() => document.querySelector('img').complete")
        assert is_dark(background(page, page.locator("img"))) is dark
    finally:
        context.close()


DISPLAY_PICTURE = """\
from tests.test_svgchart import gpu_data
from gpumem_nb.svgchart import static_bundle
from IPython.display import display
display({'text/html': static_bundle(gpu_data())['text/html']}, raw=True)"""


def test_the_picture_follows_jupyterlabs_theme_on_a_light_system(browser, tmp_path):
    """Chromium's colour scheme left light, as the reviewer's was: only the theme changes."""
    with running_lab(tmp_path) as lab:
        folder = lab.folder("dark")
        (folder / "tests").symlink_to(lab.env["PYTHONPATH"].split(":")[0] + "/tests")
        write_notebook(folder, "dark.ipynb", [DISPLAY_PICTURE])
        page = browser.new_page(viewport={"width": 1300, "height": 900}, color_scheme="light")
        open_notebook(page, lab, "dark/dark.ipynb")
        wait_kernel_idle(page)
        run_cell(page, 0)
        img = page.locator(".jp-OutputArea-output img").first
        img.wait_for()
        seen = {}
        for theme in ("JupyterLab Light", "JupyterLab Dark"):
            page.evaluate("(t) => window.jupyterapp.commands.execute("
                          "'apputils:change-theme', {theme: t})", theme)
            page.wait_for_function("(t) => document.body.dataset.jpThemeName === t", arg=theme,
                                   timeout=30_000)
            time.sleep(1)  # the theme's stylesheet applied and the image redrawn
            seen[theme] = is_dark(background(page, img))
        page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', "
                      "{theme: 'JupyterLab Light'})")
    assert seen == {"JupyterLab Light": False, "JupyterLab Dark": True}, seen


def test_the_picture_the_page_saves_with_the_notebook_is_dark_in_a_dark_page(browser, tmp_path):
    """The other picture: the one livechart.js saves in the notebook's widget state when the
    user saves with the chart live (what a reopened notebook shows, kernel gone)."""
    import base64
    import re

    import nbformat

    from .browser_harness import use_two_fake_gpus
    from .test_browser_chart import CELLS, open_live_and_save

    with running_lab(tmp_path) as lab:
        folder = lab.folder("saved")
        use_two_fake_gpus(folder)
        path = write_notebook(folder, "saved.ipynb", CELLS)
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        try:
            open_live_and_save(page, lab, path, folder / "saved.ipynb", "lab")
        finally:
            page.close()
    nb = nbformat.read(folder / "saved.ipynb", as_version=4)
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    values = [e["state"].get("value", "") for e in states.values()
              if e.get("model_name") == "HTMLModel"]
    src = next(re.search(r'src="(data:image/svg\+xml;base64,[^"]+)"', v) for v in values
               if "data:image/svg+xml" in v)
    svg = base64.b64decode(src.group(1).split(",", 1)[1]).decode()
    assert "prefers-color-scheme: dark" in svg
    for scheme, dark in (("dark", True), ("light", False)):
        context = browser.new_context(viewport={"width": 900, "height": 600})
        try:
            page = context.new_page()
            page.set_content(f"<body style='color-scheme:{scheme};margin:0'>"
                             f"<img src='{src.group(1)}'></body>")
            page.wait_for_function("() => document.querySelector('img').complete")
            assert is_dark(background(page, page.locator("img"))) is dark, scheme
        finally:
            context.close()
