"""The chart's saved picture follows a dark colour scheme in chromium instead of showing as a
white card (issue 27), and stays light under a light one. The picture is an ``<img>``, which
cannot see the page's theme: the browser's colour scheme is what it can follow."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import pytest

from gpumem_nb.svgchart import static_bundle

from .browser_harness import chromium
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


@pytest.fixture(scope="module")
def browser() -> Any:
    with chromium() as b:
        yield b


@pytest.mark.parametrize(("scheme", "dark"), [("dark", True), ("light", False)])
def test_the_saved_picture_takes_the_colour_scheme_of_the_page(browser, scheme, dark):
    html = static_bundle(gpu_data())["text/html"]
    context = browser.new_context(color_scheme=scheme, viewport={"width": 900, "height": 500})
    try:
        page = context.new_page()
        page.set_content(f"<body style='margin:0;background:#777'>{html}</body>")
        page.wait_for_function("() => document.querySelector('img').complete")
        # The picture's own background, left of its title.
        r, g, b = pixel(page.screenshot(clip={"x": 8, "y": 8, "width": 1, "height": 1}))
    finally:
        context.close()
    if dark:
        assert max(r, g, b) < 40, (r, g, b)
    else:
        assert min(r, g, b) > 240, (r, g, b)
