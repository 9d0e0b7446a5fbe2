"""The chart's static picture: what a saved notebook shows without a kernel (issue 7, defects 5
and 6). Every test parses the SVG as XML, as a browser would."""

from __future__ import annotations

import base64
import html
import itertools
import json
import math
import subprocess
import sys
import xml.etree.ElementTree as ET

from hypothesis import given
from hypothesis import strategies as st

from gpumem_nb.model import CellMark
from gpumem_nb.svgchart import (
    LABEL_FONT_PX,
    MAX_POINTS_PER_SERIES,
    STYLES,
    ChartData,
    chart_data,
    describe,
    downsample,
    html_img,
    render_svg,
    static_bundle,
    svg_data_uri,
    thin_labels,
)
from gpumem_nb.timeline import SERIES, Timeline

GIB = 1 << 30
NS = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == NS + "svg"
    return root


def series_paths(root: ET.Element) -> list[ET.Element]:
    return [e for e in root.iter(NS + "path") if e.get("class") == "series"]


def texts(root: ET.Element, cls: str | None = None) -> list[ET.Element]:
    return [e for e in root.iter(NS + "text") if cls is None or e.get("class") == cls]


def all_text(root: ET.Element) -> str:
    return " ".join("".join(e.itertext()) for e in root.iter(NS + "text"))


def flat(values_gib: list[float], step_s: float = 0.5) -> list[tuple[float, float | None]]:
    return [(i * step_s, v * GIB) for i, v in enumerate(values_gib)]


def gpu_data(**kw: object) -> ChartData:
    args: dict = {
        "series": {
            "nvml_used": flat([2.5, 2.5, 3.0]),
            "process": flat([2.5, 2.5, 3.0]),
            "reserved": flat([2.0, 2.0, 2.5]),
            "allocated": flat([1.0, 2.0, 2.0]),
        },
        "marks": [(0.2, "[1]"), (0.7, "[2]")],
        "total_bytes": 141 * GIB,
        "title": "GPU 0: NVIDIA H200",
    }
    args.update(kw)
    return ChartData(**args)


def test_the_picture_is_well_formed_xml_with_a_title_and_aria_text():
    root = parse(render_svg(gpu_data(title="GPU 0: <odd & name>")))
    title = root.find(NS + "title")
    assert title is not None and title.text is not None
    assert title.text.startswith("gpumem_nb chart, GPU 0: <odd & name>")
    assert "allocated (live tensors) 2.00 GiB" in title.text
    assert root.get("role") == "img" and root.get("aria-label") == title.text


def test_the_legend_names_every_gpu_series_and_not_host_ram():
    root = parse(render_svg(gpu_data()))
    names = [
        "".join(t.itertext()) for g in root.iter(NS + "g") if g.get("class") == "legend"
        for t in g.iter(NS + "text")]
    assert names == [STYLES[k].name for k in ("nvml_used", "process", "reserved", "allocated")]


def test_without_a_gpu_the_picture_charts_host_ram():
    tl = Timeline()
    for i in range(20):
        tl.append(100.0 + i, {k: (0.25 + i / 100 if k == "rss" else math.nan) for k in SERIES})
    data = chart_data(tl, 100.0, [], title="No GPU visible", include_rss=True)
    root = parse(render_svg(data))
    assert [p.get("data-series") for p in series_paths(root)] == ["rss"]
    assert "host RAM (RSS)" in all_text(root)


def test_nvml_used_stays_visible_when_it_equals_this_process():
    """The grey whole-GPU line used to vanish under the purple one (issue 7, defect 6)."""
    root = parse(render_svg(gpu_data()))
    paths = series_paths(root)
    order = [p.get("data-series") for p in paths]
    nvml, proc = paths[order.index("nvml_used")], paths[order.index("process")]
    assert nvml.get("d") == proc.get("d")  # the same values: the same pixels
    assert order.index("nvml_used") > order.index("process")  # drawn on top
    assert nvml.get("stroke-dasharray")  # dashed, so purple shows through its gaps
    assert float(proc.get("stroke-width") or 0) > float(nvml.get("stroke-width") or 0)
    assert nvml.get("stroke") != proc.get("stroke")


def label_boxes(root: ET.Element) -> list[tuple[float, float, str]]:
    """Each cell label's horizontal extent, with an average glyph width of 0.6 em."""
    out = []
    for t in texts(root, "mark-label"):
        s = "".join(t.itertext())
        half = len(s) * LABEL_FONT_PX * 0.6 / 2
        x = float(t.get("x") or 0)
        out.append((x - half, x + half, s))
    return sorted(out)


def test_500_cell_labels_never_overlap_and_the_newest_is_always_shown():
    marks = [(i * 14.4, f"[{i + 1}]") for i in range(500)]
    marks += [(7200.0 + i * 0.01, f"[{501 + i}]") for i in range(10)]  # a burst at the end
    root = parse(render_svg(gpu_data(series={"nvml_used": flat([1.0] * 14_401)}, marks=marks)))
    boxes = label_boxes(root)
    assert 10 <= len(boxes) < 100
    for (_, right, a), (left, _, b) in itertools.pairwise(boxes):
        assert left >= right, (a, b)
    assert boxes[-1][2] == "[510]"
    lines = next(p for p in root.iter(NS + "path") if p.get("class") == "marks")
    assert lines.get("d", "").count("M") >= 100  # every mark is still drawn as a line


@given(st.lists(st.floats(0, 1000, allow_nan=False), max_size=60),
       st.floats(0.5, 50, allow_nan=False))
def test_thin_labels_keeps_them_apart_keeps_the_last_and_drops_only_crowded_ones(xs, gap):
    kept = thin_labels(xs, gap)
    pos = [xs[i] for i in kept]
    assert pos == sorted(pos)
    assert all(b - a >= gap for a, b in itertools.pairwise(pos))
    if xs:
        assert pos[-1] == max(xs)
        # Nothing is dropped that had room: each dropped label is crowded by a kept one.
        for i in set(range(len(xs))) - set(kept):
            assert any(abs(xs[i] - xs[k]) < gap for k in kept)


def test_device_total_is_drawn_only_when_in_range_and_always_named():
    def total_lines(data: ChartData) -> int:
        return sum(p.get("class") == "total" for p in parse(render_svg(data)).iter(NS + "path"))

    far = gpu_data(total_bytes=141 * GIB)
    assert total_lines(far) == 0
    assert "total 141.0 GiB · headroom 138.0 GiB" in all_text(parse(render_svg(far)))
    near = gpu_data(total_bytes=int(3.2 * GIB))
    assert total_lines(near) == 1


def test_no_data_yet_renders_a_waiting_picture():
    for data in (ChartData(series={}, title="GPU 0"),
                 ChartData(series={"nvml_used": [(0.0, None), (1.0, None)]})):
        root = parse(render_svg(data))
        assert "waiting for data" in all_text(root)
        assert not series_paths(root)
        assert describe(data).endswith("waiting for data")


def two_hours(interval_s: float = 0.5) -> Timeline:
    """A busy two-hour session: memory changes on every sample, one 0.5 s spike."""
    tl = Timeline()
    for i in range(int(7200 / interval_s)):
        used = 10 + (i % 37) / 10 + (100 if i == 5000 else 0)
        tl.append(1000.0 + i * interval_s, {
            "nvml_used": used + 1, "process": used + 0.5, "reserved": used,
            "allocated": used - (i % 7) / 10, "rss": 3.0})
    return tl


def test_a_two_hour_session_with_500_cells_stays_under_40_kb_and_keeps_its_spike():
    tl = two_hours()
    marks = [CellMark(1000.0 + i * 14.4, i + 1) for i in range(500)]
    data = chart_data(tl, 1000.0, marks, total_bytes=141 * GIB, title="GPU 0: NVIDIA H200")
    assert all(len(pts) <= MAX_POINTS_PER_SERIES for pts in data.series.values())
    svg = render_svg(data)
    assert len(svg.encode()) < 40_000, len(svg.encode())
    root = parse(svg)
    ticks = [float("".join(t.itertext())) for g in root.iter(NS + "g")
             if g.get("class") == "ticks" for t in g.iter(NS + "text")]
    assert max(ticks) >= 110  # the y axis reaches the 111 GiB spike


def test_a_replay_says_so_in_the_title_and_the_description():
    data = gpu_data(replay="bundled")
    root = parse(render_svg(data))
    title = next(iter(texts(root, "title")))
    assert "REPLAY of bundled, not your GPU" in "".join(title.itertext())
    assert "REPLAY of bundled, not your GPU" in describe(data)
    assert "REPLAY" not in render_svg(gpu_data())


def _extent_px(e: ET.Element, font_px: float) -> tuple[float, float, float]:
    """(left, right, baseline) of a text element, from its anchor and estimated width."""
    from gpumem_nb.svgchart import text_width_px

    width = text_width_px("".join(e.itertext()), font_px)
    x = float(e.get("x", 0))
    left = x - width if e.get("text-anchor") == "end" else x
    return left, left + width, float(e.get("y", 0))


def test_a_replays_long_title_never_runs_into_the_total_and_headroom_note():
    """Issue 17: 00's saved picture had its title over the headroom text."""
    data = gpu_data(title="gpumem_nb chart: GPU 0 (NVIDIA H200)",
                    replay="replay of a recorded session (NVIDIA H200)")
    root = parse(render_svg(data))
    title = _extent_px(next(iter(texts(root, "title"))), 11 * 1.08)
    note = _extent_px(next(iter(texts(root, "total-note"))), 11)
    same_line = abs(title[2] - note[2]) < 12
    assert not same_line or title[1] + 8 <= note[0], (title, note)
    # and a short title keeps the note on its own line's right end
    short = parse(render_svg(gpu_data()))
    assert next(iter(texts(short, "total-note"))).get("y") == "16"


def test_html_img_carries_the_svg_as_a_base64_data_uri():
    svg = render_svg(gpu_data())
    tag = html_img(svg, describe(gpu_data(title='a "quoted" <name>')))
    assert tag.startswith('<img src="data:image/svg+xml;base64,')
    uri = tag.split('"')[1]
    assert uri == svg_data_uri(svg)
    assert base64.b64decode(uri.split(",", 1)[1]).decode() == svg
    alt = tag.split('alt="', 1)[1].split('"', 1)[0]  # an escaped quote would end it early
    assert "<" not in alt
    assert html.unescape(alt).startswith('gpumem_nb chart, a "quoted" <name>')
    assert tag.endswith('style="max-width:100%;height:auto">')  # a narrow output scales it
    bundle = static_bundle(gpu_data())
    assert set(bundle) == {"image/svg+xml", "text/html"}
    assert bundle["text/html"] == html_img(bundle["image/svg+xml"], describe(gpu_data()))


def test_downsample_keeps_a_spike_a_gap_and_both_ends():
    pts: list[tuple[float, float | None]] = [(float(i), 1.0) for i in range(100_000)]
    pts[54_321] = (54_321.0, 99.0)
    pts[77_777] = (77_777.0, None)
    out = downsample(pts, 600)
    assert len(out) <= 600
    assert (54_321.0, 99.0) in out and (77_777.0, None) in out
    assert out[0] == pts[0] and out[-1] == pts[-1]
    assert [t for t, _ in out] == sorted(t for t, _ in out)


def test_chart_data_turns_a_timeline_into_bytes_seconds_and_cell_labels():
    tl = Timeline()
    for i in range(4):
        tl.append(50.0 + i, {"nvml_used": 1.0 + i, "process": math.nan, "reserved": 0.5,
                             "allocated": 0.25, "rss": 2.0})
    data = chart_data(tl, 50.0, [CellMark(51.0, 7), CellMark(52.5, None)], total_bytes=GIB)
    assert data.series["nvml_used"] == [(float(i), (1.0 + i) * GIB) for i in range(4)]
    assert data.known("process") == [] and "rss" not in data.series
    assert data.marks == [(1.0, "[7]"), (2.5, "[*]")]
    assert "process" not in {p.get("data-series") for p in series_paths(parse(render_svg(data)))}
    assert chart_data(None, 0.0, []).series == {}


def test_the_renderer_imports_no_numpy_or_plotly():
    code = ("import sys, json, gpumem_nb.svgchart as s; "
            "s.render_svg(s.ChartData(series={'allocated': [(0.0, 1.0), (1.0, 2.0)]})); "
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    mods = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert not {"numpy", "plotly", "ipywidgets"} & mods
