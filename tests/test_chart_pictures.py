"""The trace timeline's and the what-if chart's static pictures: a saved notebook (tutorials
07 and 08) shows them on GitHub, in nbconvert's HTML and in untrusted views, where plotly's
JSON draws nothing. Every bundle carries an SVG of the same data twice (``image/svg+xml`` and
an ``<img>`` in ``text/html``) beside plotly's figure, and no two texts in it overlap at an
800 or 1400 px wide output. Every test parses the SVG as XML, as a browser would."""

from __future__ import annotations

import base64
import dataclasses
import itertools
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

import pytest

from gpumem_nb import svgchart
from gpumem_nb.kernel import current_monitor
from gpumem_nb.trace import TraceTimeline, analyze
from gpumem_nb.whatif import api
from gpumem_nb.whatif.report import WhatIfChart

from .fakes import GiB, MiB
from .helpers import in_fresh_interpreter, needs_installed, replay_gpus_named
from .test_svgchart import gpu_data
from .test_trace import SKIP, alloc, free
from .whatif_history import History

NS = "{http://www.w3.org/2000/svg}"
PLOTLY = "application/vnd.plotly.v1+json"
IMG = re.compile(r'<img src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)" alt="[^"<]*"[^<>]*>')


def picture(bundle: dict[str, Any]) -> ET.Element:
    """The bundle's SVG, after checking that text/html carries the same one as an img."""
    svg = bundle["image/svg+xml"]
    m = IMG.fullmatch(bundle["text/html"])
    assert m, bundle["text/html"][:200]
    assert base64.b64decode(m.group(1)).decode() == svg
    root = ET.fromstring(svg)
    assert root.tag == NS + "svg"
    return root


def by_class(root: ET.Element, tag: str, cls: str) -> list[ET.Element]:
    return [e for e in root.iter(NS + tag) if e.get("class") == cls]


def text_of(e: ET.Element) -> str:
    return "".join(e.itertext())


def legend_names(root: ET.Element) -> list[str]:
    return [text_of(t) for g in by_class(root, "g", "legend") for t in g.iter(NS + "text")]


def y_ticks(root: ET.Element) -> list[float]:
    ticks = by_class(root, "g", "ticks")[0]
    return [float(text_of(t)) for t in ticks.iter(NS + "text") if t.get("text-anchor") == "end"]


def site_entries(sites: int = 3, *, oom: bool = False) -> list[dict[str, Any]]:
    """``sites`` lines, each allocating (k + 1) x 64 MiB; the first one's block freed."""
    entries, t = [], 1000.0
    for k in range(sites):
        entries.append(alloc(k + 1, (k + 1) * 64 * MiB, t, k + 1))
        t += 1000
    entries += free(1, 64 * MiB, t)
    if oom:
        entries.append({"action": "oom", "size": 40 * GiB, "time_us": t + 2000,
                        "device_free": GiB})
    return entries


# -- the trace timeline ----------------------------------------------------------------------
def test_the_trace_timeline_bundle_draws_each_site_beside_plotlys_figure():
    view = TraceTimeline(analyze(site_entries(3), skip=SKIP))
    bundle = view._repr_mimebundle_()
    fig = bundle[PLOTLY]  # still interactive where plotly draws
    root = picture(bundle)
    areas = by_class(root, "path", "series")
    assert len(areas) == len(fig["data"]) == 3
    assert all(a.get("fill") not in (None, "none") for a in areas)  # a stack of areas
    # Drawn from the top of the stack down, listed in the figure's order.
    assert [a.get("data-series") for a in areas] == ["site-2", "site-1", "site-0"]
    assert legend_names(root) == [t["name"] for t in fig["data"]]
    # The axis reaches the peak (3 sites: 64 + 128 + 192 MiB live at once).
    assert max(y_ticks(root)) >= 384 and "MiB" in text_of(by_class(root, "text", "y-title")[0])
    assert [text_of(t) for t in by_class(root, "text", "mark-label")] == ["peak"]
    assert "peak 384.00 MiB" in text_of(by_class(root, "text", "total-note")[0])
    assert "peak 384.00 MiB" in (root.findtext(NS + "title") or "")


def test_a_trace_that_ran_out_of_memory_marks_it_in_the_picture():
    view = TraceTimeline(analyze(site_entries(3, oom=True), skip=SKIP))
    root = picture(view._repr_mimebundle_())
    labels = " ".join(text_of(t) for t in by_class(root, "text", "mark-label"))
    assert "OOM" in labels and "peak" in labels
    assert "out of memory at" in (root.findtext(NS + "title") or "")


def test_the_trace_picture_of_a_long_cell_stays_small():
    entries, t = [], 0.0
    for i in range(20_000):  # a site's 1 MiB blocks allocated and freed in turn, for long
        entries.append(alloc(i, MiB, t, 1 + i % 9))
        entries += free(i - 5, MiB, t + 1) if i >= 5 else []
        t += 10
    root_svg = TraceTimeline(analyze(entries, skip=SKIP)).svg()
    assert len(root_svg.encode()) < 100_000, len(root_svg.encode())
    assert len(by_class(ET.fromstring(root_svg), "path", "series")) == 9


# -- the what-if chart -----------------------------------------------------------------------
def whatif_result(capacity_bytes: int | None) -> Any:
    h = History()
    h.entries.append({"action": "segment_alloc", "addr": 1, "size": 20 * MiB, "stream": 0,
                      "time_us": 1.0})
    a = h.alloc(16 * MiB)
    h.alloc(5 * MiB)
    h.free(a)
    h.alloc(30 * MiB)
    return api.whatif(h.snapshot(), ["", "expandable_segments:True", "max_split_size_mb:64"],
                      capacity_bytes=capacity_bytes)


def test_the_whatif_bundle_draws_every_setting_the_recording_and_the_capacity():
    chart = WhatIfChart(whatif_result(80 * MiB))
    bundle = chart._repr_mimebundle_()
    fig = bundle[PLOTLY]
    root = picture(bundle)
    lines = by_class(root, "path", "series")
    assert len(lines) == len(fig["data"]) == 4  # three settings and the recorded segments
    assert legend_names(root) == [t["name"] for t in fig["data"]]
    assert lines[-1].get("stroke-dasharray")  # the recording, dotted as in plotly
    assert len(by_class(root, "path", "total")) == 1  # the capacity line, in range
    assert "capacity 80.00 MiB" in text_of(by_class(root, "text", "total-note")[0])
    # Each setting's predicted peak is named for readers who cannot see the picture.
    title = root.findtext(NS + "title") or ""
    for row in chart.result.rows:
        assert row.label in title


def test_a_capacity_far_above_the_predictions_is_named_but_not_drawn():
    root = picture(WhatIfChart(whatif_result(140 * GiB))._repr_mimebundle_())
    assert not by_class(root, "path", "total")  # it would flatten the lines to the axis
    assert "capacity 140.00 GiB" in text_of(by_class(root, "text", "total-note")[0])
    assert max(y_ticks(root)) < 200  # MiB: the predictions fill the height


def test_a_history_torch_recorded_alone_is_timed_from_its_first_entry():
    """A _dump_snapshot pickle has no start of gpumem_nb's: neither a cell nor a session
    began its clock."""
    h = History()
    a = h.alloc(16 * MiB)
    h.free(a)
    chart = WhatIfChart(api.whatif(h.snapshot(recorded_start=False), [""]))
    says = "ms since the history's first entry"
    assert chart.figure()["layout"]["xaxis"]["title"]["text"] == says
    assert chart.plot().x_title == says


# -- the plotly figures in JupyterLab's light and dark themes ---------------------------------
# JupyterLab's page behind an output, in its light and its dark theme.
THEME_BACKGROUNDS = {"light": (255, 255, 255), "dark": (17, 17, 17)}


def rgba(colour: str) -> tuple[float, float, float, float]:
    """A plotly colour as written in our figures: #rrggbb or rgba(r,g,b,a)."""
    if colour.startswith("#") and len(colour) == 7:
        return (int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16), 1.0)
    found = re.fullmatch(r"rgba\((\d+),\s*(\d+),\s*(\d+),\s*([\d.]+)\)", colour)
    assert found, f"a colour this test cannot read: {colour!r}"
    r, g, b, a = found.groups()
    return (int(r), int(g), int(b), float(a))


def contrast(colour: tuple[float, float, float], background: tuple[float, float, float]
             ) -> float:
    """WCAG's contrast ratio of two opaque colours."""
    def lum(c: tuple[float, float, float]) -> float:
        ch = [x / 255 for x in c]
        lin = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in ch]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    hi, lo = sorted((lum(colour), lum(background)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def texts_and_marks(fig: dict[str, Any]) -> dict[str, str]:
    """Every colour the figure gives a text, an axis or a mark drawn on the page itself (not
    inside the hover box), by where it is."""
    lay = fig["layout"]
    found = {"font": lay["font"]["color"]}
    for axis in ("xaxis", "yaxis"):
        found[f"{axis}.color"] = lay[axis]["color"]
    for i, a in enumerate(lay.get("annotations", [])):
        found[f"annotation {i} ({a['text']})"] = a.get("font", {}).get("color",
                                                                       lay["font"]["color"])
    for i, sh in enumerate(lay.get("shapes", [])):
        found[f"shape {i}"] = sh["line"]["color"]
    return found


def theme_figures() -> list[tuple[str, dict[str, Any]]]:
    return [("trace timeline", TraceTimeline(analyze(site_entries(3, oom=True), skip=SKIP))
             .figure()),
            ("what-if chart", WhatIfChart(whatif_result(80 * MiB)).figure())]


@pytest.mark.parametrize("name", ["trace timeline", "what-if chart"])
def test_the_plotly_figures_are_no_white_card_in_jupyterlabs_dark_theme(name):
    """Browser review 2026-12-05: the plotly pictures of 07-09 were white cards in the dark
    theme (plotly.js paints a white paper and plot area when a figure names none). Both
    backgrounds are transparent, so the page's own shows through, and every text and mark on
    it reads against the light and the dark page (contrast 3:1 at least, WCAG's bar for
    graphics and large text)."""
    fig = dict(theme_figures())[name]
    lay = fig["layout"]
    assert rgba(lay["paper_bgcolor"])[3] == 0 and rgba(lay["plot_bgcolor"])[3] == 0, lay
    for axis in ("xaxis", "yaxis"):
        assert rgba(lay[axis]["gridcolor"])[3] < 1, "a grid line would cover the lines"
    for where, colour in texts_and_marks(fig).items():
        r, g, b, a = rgba(colour)
        assert a == 1, where
        for theme, page in THEME_BACKGROUNDS.items():
            assert contrast((r, g, b), page) >= 3, f"{name}: {where} ({colour}) on {theme}"
    # The data's own palette (plotly's category10) is the same in both themes; each line
    # stands out from either page, if less than a text must.
    for t in fig["data"]:
        for theme, page in THEME_BACKGROUNDS.items():
            assert contrast(rgba(t["line"]["color"])[:3], page) >= 2, (t["name"], theme)
    # The hover box is drawn over the lines: it keeps a background of its own, and its text
    # reads on it.
    box = lay["hoverlabel"]
    assert rgba(box["bgcolor"])[3] == 1
    assert contrast(rgba(box["font"]["color"])[:3], rgba(box["bgcolor"])[:3]) >= 4.5


# -- no two texts overlap ---------------------------------------------------------------------
def _font_px(e: ET.Element, parents: dict[ET.Element, ET.Element]) -> float:
    node: ET.Element | None = e
    while node is not None:
        if node.get("font-size"):
            return float(node.get("font-size") or 0)
        node = parents.get(node)
    return svgchart.FONT_PX


def _anchor(e: ET.Element, parents: dict[ET.Element, ET.Element]) -> str:
    node: ET.Element | None = e
    while node is not None:
        if node.get("text-anchor"):
            return node.get("text-anchor") or "start"
        node = parents.get(node)
    return "start"


def text_boxes(root: ET.Element) -> Iterator[tuple[float, float, float, float, str]]:
    """(left, top, right, bottom, text) of every visible text, from the renderer's own glyph
    estimate (bold a little wider); the rotated y title in its rotated box."""
    parents = {c: p for p in root.iter() for c in p}
    for e in root.iter(NS + "text"):
        if float(e.get("fill-opacity", 1)) < 0.5:
            continue  # the replay watermark lies behind everything on purpose
        font = _font_px(e, parents) * (1.08 if e.get("font-weight") == "bold" else 1.0)
        s = text_of(e)
        w = svgchart.text_width_px(s, font)
        x, y = float(e.get("x", 0)), float(e.get("y", 0))
        if e.get("transform", "").startswith("rotate(-90"):
            yield x - 0.8 * font, y - w / 2, x + 0.2 * font, y + w / 2, s
            continue
        left = {"end": x - w, "middle": x - w / 2}.get(_anchor(e, parents), x)
        yield left, y - 0.8 * font, left + w, y + 0.2 * font, s


def assert_no_text_overlaps(svg: str) -> None:
    root = ET.fromstring(svg)
    width = float(root.get("width") or 0)
    boxes = list(text_boxes(root))
    for left, _, right, _, s in boxes:
        assert left >= 0 and right <= width, f"{s!r} runs off the picture: {left}-{right}"
    for a, b in itertools.combinations(boxes, 2):
        apart = a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]
        assert apart, f"{a[4]!r} overlaps {b[4]!r}"


def crowded_trace() -> TraceTimeline:
    """Nine sites with long lines of code, the OOM right after the peak."""
    entries, t = [], 1000.0
    for k in range(12):
        entries.append(alloc(k + 1, (k % 4 + 1) * 300 * MiB, t, k + 1))
        t += 700
    entries.append({"action": "oom", "size": 40 * GiB, "time_us": t + 50, "device_free": GiB})
    d = analyze(entries, skip=SKIP)
    long = [dataclasses.replace(s, label=f"cell line {i}: hidden = self.layers[{i}]"
                                f"(torch.cat([hidden, residual_stream_{i}], dim=-1)) " * 2)
            for i, s in enumerate(d.series)]
    return TraceTimeline(dataclasses.replace(d, series=tuple(long)))


def crowded_whatif() -> WhatIfChart:
    h = History()
    for i in range(40):
        h.alloc((i % 7 + 1) * 3 * MiB)
    result = api.whatif(h.snapshot(), [
        "", "expandable_segments:True", "max_split_size_mb:64", "roundup_power2_divisions:4",
        "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
        "garbage_collection_threshold:0.6,max_split_size_mb:128"], capacity_bytes=500 * MiB)
    return WhatIfChart(result)


@pytest.mark.parametrize("width_px", [800, 1400])
@pytest.mark.parametrize("make", [crowded_trace, crowded_whatif], ids=["trace", "whatif"])
def test_no_two_texts_overlap_in_a_crowded_picture(make, width_px):
    chart = make()
    plot = dataclasses.replace(chart.plot(), width_px=width_px)
    svg = svgchart.render_plot(plot)
    assert_no_text_overlaps(svg)
    root = ET.fromstring(svg)
    assert len(legend_names(root)) == len(plot.lines)  # every entry kept, long ones clipped


@pytest.mark.parametrize("width_px", [800, 1400])
def test_no_two_texts_overlap_in_the_live_charts_replay_picture(width_px):
    data = gpu_data(title="gpumem_nb chart: GPU 0 (NVIDIA H200)",
                    replay="replay of a recorded session (NVIDIA H200)",
                    marks=[(i * 0.01, f"[{i}]") for i in range(200)])
    plot = dataclasses.replace(svgchart.live_plot(data), width_px=width_px)
    assert_no_text_overlaps(svgchart.render_plot(plot))


def test_the_overlap_check_sees_an_overlap():
    """The check above must be able to fail: two labels drawn on one spot."""
    svg = ('<svg xmlns="http://www.w3.org/2000/svg" width="800" height="100">'
           '<text x="100" y="20">cell line 1</text><text x="110" y="22">cell line 2</text>'
           "</svg>")
    with pytest.raises(AssertionError, match="overlaps"):
        assert_no_text_overlaps(svg)


# -- nbconvert -------------------------------------------------------------------------------
NBCONVERT_HTML = """
import json, sys
import nbformat, nbconvert
bundles = json.load(sys.stdin)
nb = nbformat.v4.new_notebook()
nb.cells = [nbformat.v4.new_code_cell("chart", outputs=[
    nbformat.v4.new_output("display_data", data=b)]) for b in bundles]
nbformat.validate(nb)
page, _ = nbconvert.HTMLExporter().from_notebook_node(nb)
print(json.dumps(page))
"""


def test_nbconvert_html_shows_both_pictures():
    """What a site such as nbviewer or GitHub shows of a saved 07 or 08: the pictures."""
    needs_installed("nbformat", "nbconvert")
    charts = [TraceTimeline(analyze(site_entries(3), skip=SKIP)),
              WhatIfChart(whatif_result(80 * MiB))]
    page = in_fresh_interpreter(NBCONVERT_HTML, [c._repr_mimebundle_() for c in charts])
    shown = [base64.b64decode(m).decode()
             for m in re.findall(r'<img [^>]*src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"',
                                 page)]
    assert shown == [c.svg() for c in charts]


# -- hostile text: every picture stays XML ---------------------------------------------------
# What html.escape leaves and XML forbids: C0 controls (NUL, ESC, form feed...), U+FFFE and
# U+FFFF, a lone surrogate; and what it must still escape (markup, quotes, a CDATA end).
HOSTILE = ["GPU\x00\x01\x08\x0b\x0c\x1f\x7f", "GPU\ufffe\uffff", "\x1b[1mbold\x1b[0m",
           "lone \ud800 surrogate", "]]></text><!-- & \"'<script>", "\u202eevil\t\n\r"]
HOSTILE_IDS = ["c0-controls", "noncharacters", "ansi-escape", "lone-surrogate", "markup",
               "bidi-and-whitespace"]


def hostile_whatif(text: str) -> WhatIfChart:
    result = whatif_result(80 * MiB)
    rows = [dataclasses.replace(row, label=f"{text} {i}") for i, row in enumerate(result.rows)]
    return WhatIfChart(dataclasses.replace(result, rows=rows))


def hostile_trace(text: str) -> TraceTimeline:
    """A history whose stacks name a file and a function that hold ``text``."""
    entries = [alloc(1, 64 * MiB, 1000.0, 1, (f"/home/{text}/model.py", 7, text)),
               alloc(2, 32 * MiB, 2000.0, 2)]
    return TraceTimeline(analyze(entries, skip=SKIP))


def hostile_live(text: str) -> dict[str, str]:
    data = gpu_data(title=f"gpumem_nb chart: GPU 0 ({text})", replay=f"replay ({text})",
                    marks=[(0.5, text), (1.0, "[2]")])
    return svgchart.static_bundle(data)


@pytest.mark.parametrize("text", HOSTILE, ids=HOSTILE_IDS)
@pytest.mark.parametrize("bundle_of", [
    lambda text: hostile_trace(text)._repr_mimebundle_(),
    lambda text: hostile_whatif(text)._repr_mimebundle_(),
    hostile_live,
], ids=["trace-timeline", "whatif", "live-chart"])
def test_every_picture_is_well_formed_xml_whatever_its_texts_hold(bundle_of, text):
    root = picture(bundle_of(text))  # parsed as XML, as a browser would before drawing it
    shown = " ".join(text_of(e) for e in root.iter())
    assert "<script>" in shown or "script" not in text  # markup shown as text, not run
    assert not any(0xD800 <= ord(c) <= 0xDFFF or c in "\x00\x1b\ufffe\uffff" for c in shown)


def test_a_traced_line_holding_a_raw_escape_leaves_the_timeline_a_picture_that_says_so(loaded):
    # The review's case: a saved notebook showed a broken image for this cell's timeline.
    loaded.run_cell("%%gpumem --trace -q\n"
                    "z = cuda.tensor(MiB); _s = '\x1b[1mbold\x1b[0m'  # \x01\x0b \ufffe\uffff\n",
                    store_history=True)
    traced = current_monitor(loaded).last_trace
    roots = [picture(TraceTimeline(d)._repr_mimebundle_()) for d in traced.devices if d.series]
    assert roots
    names = " ".join(name for root in roots for name in legend_names(root))
    assert "\\x1b[1mbold" in names, names
    del loaded.user_ns["z"]


def test_a_replayed_gpu_with_a_hostile_name_keeps_the_charts_picture_xml(shell, no_gpu,
                                                                        tmp_path):
    mon = replay_gpus_named(shell, tmp_path / "hostile.json",
                            ["NVIDIA\x00\x1b[31m\ufffe\uffff H200"], samples=50)
    bundle = mon.widget.plain_bundle()
    root = ET.fromstring(bundle["image/svg+xml"])
    assert "\\x1b[31m" in (root.findtext(NS + "title") or "")
    img = re.search(r'src="data:image/svg\+xml;base64,([^"]+)"', bundle["text/html"])
    assert img is not None and base64.b64decode(img.group(1)).decode() == \
        bundle["image/svg+xml"]
