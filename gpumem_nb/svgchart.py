"""A static picture of the live chart: a small standalone SVG for saved notebooks.

A widget needs a kernel, or its saved state and its JavaScript. An untrusted notebook in
JupyterLab, nbviewer and GitHub show only the static entries of a display bundle. So the chart
also renders itself as an SVG, put in the bundle twice: as ``image/svg+xml``, and as an
``<img>`` with a data URI in ``text/html`` (JupyterLab's sanitizer keeps an img's data URI,
and drops inline SVG in untrusted HTML).

Pure standard library (no numpy, no plotly), so it is cheap to call on a refresh and testable
anywhere. Input is ``ChartData``: plain lists in bytes and seconds, built from a ``Timeline``
by ``chart_data``.
"""

from __future__ import annotations

import base64
import html
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .model import CellMark
from .units import format_bytes

if TYPE_CHECKING:  # a type only: importing timeline at run time would import numpy
    from .timeline import Timeline

GIB = float(1 << 30)
# Each series keeps at most this many points: min and max per bucket, so spikes survive.
MAX_POINTS_PER_SERIES = 600


# What a series' colour and dash may be. Both reach the browser as SVG attributes and CSS
# values: anything else (a quote, an angle bracket, a url()) is refused where it is made.
_COLOR = re.compile(r"#(?:[0-9a-fA-F]{3,4}|[0-9a-fA-F]{6}|[0-9a-fA-F]{8})|[a-zA-Z]{1,32}"
                    r"|(?:rgb|rgba|hsl|hsla)\([0-9.,%\s/]{1,64}\)")
_DASH = re.compile(r"[0-9.,\s]{0,64}")
MAX_WIDTH_PX = 20.0


@dataclass(frozen=True)
class SeriesStyle:
    name: str
    color: str  # a CSS colour: #rgb, #rrggbb(aa), a name, rgb()/hsl()
    width_px: float
    dash: str = ""  # an SVG stroke-dasharray; "" is solid

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ValueError(f"a series name is text, not {self.name!r}")
        if not isinstance(self.color, str) or not _COLOR.fullmatch(self.color):
            raise ValueError(f"a series colour is a CSS colour such as '#1f77b4' or 'teal', "
                             f"not {self.color!r}")
        width = self.width_px
        if (not isinstance(width, int | float) or isinstance(width, bool)
                or not 0 < width <= MAX_WIDTH_PX):
            raise ValueError(f"a series width is more than 0 and at most {MAX_WIDTH_PX:g} px, "
                             f"not {width!r}")
        if not isinstance(self.dash, str) or not _DASH.fullmatch(self.dash):
            raise ValueError(f"a series dash is an SVG dash array such as '6 3', "
                             f"not {self.dash!r}")


# Same names and colours as the live chart. Visual hierarchy: wide lines underneath, thin on
# top, and NVML's whole-GPU line last and dashed, so where it equals "this process" (no other
# process on the GPU) both stay visible instead of grey vanishing under purple.
STYLES: dict[str, SeriesStyle] = {
    "nvml_used": SeriesStyle("NVML used (whole GPU)", "#7f7f7f", 1.5, "6 3"),
    "process": SeriesStyle("this process (NVML)", "#9467bd", 3.5),
    "reserved": SeriesStyle("reserved (PyTorch cache)", "#ff7f0e", 3.0),
    "allocated": SeriesStyle("allocated (live tensors)", "#1f77b4", 1.5),
    "rss": SeriesStyle("host RAM (RSS)", "#2ca02c", 2.0),
}
LEGEND_ORDER = ("nvml_used", "process", "reserved", "allocated", "rss")
DRAW_ORDER = ("rss", "reserved", "allocated", "process", "nvml_used")
TOTAL_COLOR = "#d62728"

Point = tuple[float, float | None]  # (seconds since load, bytes or None when unknown)


@dataclass(frozen=True)
class ChartData:
    """What the picture shows. Series keys are those of ``STYLES``; a series without a known
    value is left out, legend included."""

    series: dict[str, list[Point]]
    marks: list[tuple[float, str]] = field(default_factory=list)  # (seconds, "[12]")
    total_bytes: int | None = None
    title: str = ""
    replay: str | None = None  # the recording's name when the chart plays one back
    x_title: str = "seconds since %load_ext gpumem_nb"

    def known(self, key: str) -> list[tuple[float, float]]:
        return [(t, v) for t, v in self.series.get(key, ()) if v is not None]


# -- layout -----------------------------------------------------------------------------------
WIDTH_PX = 800
PLOT_HEIGHT_PX = 220
LEFT_PX, RIGHT_PX = 56, 20
TITLE_BAND_PX = 24  # title line
LABEL_BAND_PX = 16  # cell labels, above the plot
FONT_PX = 11
LABEL_FONT_PX = 10
# Average glyph width of a sans-serif font as a share of its size, a little generous so an
# estimate never lets two labels touch.
GLYPH_EM = 0.62


def text_width_px(text: str, font_px: float = FONT_PX) -> float:
    return len(text) * font_px * GLYPH_EM


def label_gap_px(labels: Iterable[str], font_px: float = LABEL_FONT_PX) -> float:
    """The distance two label centres need so that none of these labels touch."""
    return max((text_width_px(s, font_px) for s in labels), default=0.0) + 4.0


def thin_labels(xs: Sequence[float], min_gap: float) -> list[int]:
    """Indices of the labels to keep so that kept ones are at least ``min_gap`` apart.

    Greedy from the left; the rightmost (the newest cell) is always kept, dropping the kept
    label before it if the two would be too close. ``xs`` may be in pixels or in data units
    (then ``min_gap`` is too). Returned indices are in ascending x order.
    """
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    kept: list[int] = []
    for i in order:
        if not kept or xs[i] - xs[kept[-1]] >= min_gap:
            kept.append(i)
    if order and kept[-1] != order[-1]:
        # The newest label wins. Dropping one kept label is enough: the one before it was
        # already min_gap from it, so it is at least that far from anything to its right.
        if xs[order[-1]] - xs[kept[-1]] < min_gap:
            kept.pop()
        kept.append(order[-1])
    return kept


def downsample(points: Sequence[Point], max_points: int = MAX_POINTS_PER_SERIES) -> list[Point]:
    """At most ``max_points``: per bucket its first gap (if any), minimum and maximum, so a
    short spike and a lost reading both survive. The first and last points are kept."""
    n = len(points)
    if n <= max_points:
        return list(points)
    buckets = max((max_points - 2) // 3, 1)
    size = -(-n // buckets)
    keep = {0, n - 1}
    for start in range(0, n, size):
        chunk = range(start, min(start + size, n))
        known = [i for i in chunk if points[i][1] is not None]
        gap = next((i for i in chunk if points[i][1] is None), None)
        if gap is not None:
            keep.add(gap)
        if known:
            keep.add(min(known, key=lambda i: points[i][1] or 0.0))
            keep.add(max(known, key=lambda i: points[i][1] or 0.0))
    return [points[i] for i in sorted(keep)]


def nice_step(span: float, target: int) -> float:
    """A round tick step (1, 2, 2.5 or 5 times a power of ten) giving about ``target`` ticks."""
    raw = max(span, 1e-12) / target
    mag = 10.0 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * mag >= raw * 0.999)


def ticks(lo: float, hi: float, target: int) -> list[float]:
    step = nice_step(hi - lo, target)
    first = math.ceil(lo / step - 1e-9)
    out = []
    k = first
    while k * step <= hi + step * 1e-9:
        out.append(round(k * step, 10))
        k += 1
    return out


def tick_text(v: float) -> str:
    return f"{v:g}"


# -- text ------------------------------------------------------------------------------------
def replay_banner(replay: str) -> str:
    what = replay.removeprefix("replay of ")
    return f"REPLAY of {what}, not your GPU"


def describe(data: ChartData) -> str:
    """One sentence for ``<title>``, aria-label and the img's alt text."""
    head = "gpumem_nb chart"
    if data.title.startswith(head):
        head = data.title  # the chart's own title names it already
    elif data.title:
        head += f", {data.title}"
    if data.replay:
        head += f" ({replay_banner(data.replay)})"
    latest, times = [], []
    for key in LEGEND_ORDER:
        pts = data.known(key)
        if pts:
            times.append(pts[-1][0])
            latest.append(f"{STYLES[key].name} {format_bytes(int(pts[-1][1]))}")
    if not latest:
        return f"{head}: waiting for data"
    at = f" at {max(times):.0f} s"
    cells = f"; {len(data.marks)} cells marked" if data.marks else ""
    return f"{head}: {', '.join(latest)}{at}{cells}"


def _attr(value: str) -> str:
    return html.escape(value, quote=True)


# -- rendering -------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Frame:
    """Maps data to pixels: x in seconds, y in GiB."""

    x0: float
    x1: float
    y1: float
    left: int
    top: int
    width: int
    height: int

    def px(self, t_s: float) -> int:
        return round(self.left + (t_s - self.x0) / (self.x1 - self.x0) * self.width)

    def py(self, gib: float) -> int:
        return round(self.top + self.height - gib / self.y1 * self.height)


def _step_path(points: Sequence[Point], frame: _Frame) -> str:
    """A step line (value held until the next reading), in relative integer moves: about six
    characters a point. A gap (None) lifts the pen."""
    parts: list[str] = []
    cx = cy = 0
    pen = False
    for t, v in points:
        if v is None:
            pen = False
            continue
        x, y = frame.px(t), frame.py(v / GIB)
        if not pen:
            parts.append(f"M{x} {y}")
            pen = True
        else:
            if x != cx:
                parts.append(f"h{x - cx}")
            if y != cy:
                parts.append(f"v{y - cy}")
        cx, cy = x, y
    return "".join(parts)


def _legend(keys: list[str], top: int) -> tuple[list[str], int]:
    """Legend entries left to right, wrapping; returns the elements and the height used."""
    out: list[str] = []
    x, y = LEFT_PX, top + 10
    for key in keys:
        st = STYLES[key]
        w = 28 + text_width_px(st.name, FONT_PX * 0.9) + 14
        if x + w > WIDTH_PX - RIGHT_PX and x > LEFT_PX:
            x, y = LEFT_PX, y + 18
        dash = f' stroke-dasharray="{st.dash}"' if st.dash else ""
        out.append(
            f'<g class="legend" data-series="{key}"><path d="M{x} {y}h24" stroke="{st.color}" '
            f'stroke-width="{st.width_px:g}"{dash}/>'
            f'<text x="{x + 28}" y="{y + 4}">{html.escape(st.name)}</text></g>')
        x += round(w)
    return out, y - top + 10


def render_svg(data: ChartData) -> str:
    """The chart as a standalone SVG document (a string, UTF-8 text)."""
    keys = [k for k in LEGEND_ORDER if data.known(k)]
    summary = describe(data)
    # The title sits left and the total/headroom note right; when the two would meet (a
    # replay's long title), the note takes a line of its own.
    note = _total_note(data)
    title_w = text_width_px(data.title or "gpumem_nb", FONT_PX * 1.08)
    if data.replay:
        title_w += text_width_px(" " + replay_banner(data.replay), FONT_PX * 1.08)
    note_w = text_width_px(note)
    two_lines = bool(note) and LEFT_PX + title_w + 16 + note_w > WIDTH_PX - RIGHT_PX
    title_band = TITLE_BAND_PX + (16 if two_lines else 0)
    plot_top = title_band + LABEL_BAND_PX
    plot_bottom = plot_top + PLOT_HEIGHT_PX
    plot_w = WIDTH_PX - LEFT_PX - RIGHT_PX
    body: list[str] = []

    # Title line: what this is, and loudly when it is somebody else's recording.
    title = html.escape(data.title or "gpumem_nb")
    if data.replay:
        title += (f' <tspan class="replay" fill="{TOTAL_COLOR}" font-weight="bold">'
                  f"{html.escape(replay_banner(data.replay))}</tspan>")
    body.append(f'<text class="title" x="{LEFT_PX}" y="16" font-weight="bold">{title}</text>')

    if not keys:
        height = plot_bottom + 20
        body.append(f'<rect x="{LEFT_PX}" y="{plot_top}" width="{plot_w}" '
                    f'height="{PLOT_HEIGHT_PX}" fill="#fafafa" stroke="#ddd"/>')
        body.append(f'<text class="waiting" x="{LEFT_PX + plot_w // 2}" '
                    f'y="{plot_top + PLOT_HEIGHT_PX // 2}" text-anchor="middle" fill="#666">'
                    "waiting for data…</text>")
        return _document(summary, height, body)

    # Ranges: like the live chart, y follows the data (not the device total), and the total
    # is drawn only when it is in range.
    all_t = [t for k in keys for t, _ in data.known(k)] + [t for t, _ in data.marks]
    x0, x1 = min(all_t), max(all_t)
    if x1 - x0 < 1e-6:
        x0, x1 = x0 - 0.5, x1 + 0.5
    top_gib = max(max(v for _, v in data.known(k)) for k in keys) / GIB
    top_gib = max(top_gib, 0.01) * 1.15
    total_gib = (data.total_bytes or 0) / GIB
    y1 = max(top_gib * 1.08, total_gib * 1.02 if 0 < total_gib <= top_gib else 0.0)
    frame = _Frame(x0, x1, y1, LEFT_PX, plot_top, plot_w, PLOT_HEIGHT_PX)

    if data.replay:  # a watermark, so a cropped screenshot still says it
        body.append(f'<text x="{LEFT_PX + plot_w // 2}" y="{plot_top + PLOT_HEIGHT_PX // 2 + 20}"'
                    f' text-anchor="middle" font-size="64" font-weight="bold" fill="{TOTAL_COLOR}"'
                    ' fill-opacity="0.07">REPLAY</text>')

    # Axes and grid.
    grid, labels = [], []
    for v in ticks(0.0, y1, 5):
        y = frame.py(v)
        grid.append(f"M{LEFT_PX} {y}h{plot_w}")
        labels.append(f'<text x="{LEFT_PX - 6}" y="{y + 4}" text-anchor="end">'
                      f"{tick_text(v)}</text>")
    for t in ticks(x0, x1, 8):
        x = frame.px(t)
        grid.append(f"M{x} {plot_top}V{plot_bottom}")
        labels.append(f'<text x="{x}" y="{plot_bottom + 14}" text-anchor="middle">'
                      f"{tick_text(t)}</text>")
    body.append(f'<path class="grid" d="{"".join(grid)}" stroke="#e5e5e5" stroke-width="1"/>')
    body.append(f'<g class="ticks" fill="#444">{"".join(labels)}</g>')
    body.append(f'<path d="M{LEFT_PX} {plot_top}V{plot_bottom}h{plot_w}" stroke="#999" '
                'fill="none"/>')
    body.append(f'<text x="14" y="{plot_top + PLOT_HEIGHT_PX // 2}" text-anchor="middle" '
                f'transform="rotate(-90 14 {plot_top + PLOT_HEIGHT_PX // 2})">GiB</text>')
    body.append(f'<text x="{LEFT_PX + plot_w // 2}" y="{plot_bottom + 30}" '
                f'text-anchor="middle">{html.escape(data.x_title)}</text>')

    # Total and headroom: named in the corner always, drawn as a line when in range.
    if total_gib > 0:
        body.append(f'<text class="total-note" x="{WIDTH_PX - RIGHT_PX}" '
                    f'y="{32 if two_lines else 16}" text-anchor="end" fill="{TOTAL_COLOR}">'
                    f"{note}</text>")
        if total_gib <= top_gib:
            y = frame.py(total_gib)
            body.append(f'<path class="total" d="M{LEFT_PX} {y}h{plot_w}" stroke="{TOTAL_COLOR}"'
                        ' stroke-width="1" stroke-dasharray="6 3"/>')

    # Cell marks: every one as a dotted line, labels thinned so none overlap.
    # Lines on one pixel column are drawn once, so even 10 000 marks stay a small path.
    marks = sorted(data.marks)
    if marks:
        xs = [frame.px(t) for t, _ in marks]
        lines = "".join(f"M{x} {plot_top}V{plot_bottom}" for x in sorted(set(xs)))
        body.append(f'<path class="marks" d="{lines}" stroke="#000" stroke-opacity="0.25" '
                    'stroke-width="1" stroke-dasharray="1 3"/>')
        gap = label_gap_px(s for _, s in marks)
        texts = "".join(
            f'<text class="mark-label" x="{xs[i]}" y="{plot_top - 4}">'
            f"{html.escape(marks[i][1])}</text>" for i in thin_labels(xs, gap))
        body.append(f'<g text-anchor="middle" font-size="{LABEL_FONT_PX}" fill="#555">'
                    f"{texts}</g>")

    # Series, wide ones first and NVML's whole-GPU line last.
    for key in DRAW_ORDER:
        if key not in keys:
            continue
        st = STYLES[key]
        d = _step_path(downsample(data.series[key]), frame)
        dash = f' stroke-dasharray="{st.dash}"' if st.dash else ""
        body.append(f'<path class="series" data-series="{key}" d="{d}" fill="none" '
                    f'stroke="{st.color}" stroke-width="{st.width_px:g}"{dash} '
                    'stroke-linejoin="round"/>')

    legend, legend_h = _legend(keys, plot_bottom + 40)
    body.extend(legend)
    return _document(summary, plot_bottom + 40 + legend_h, body)


def _total_note(data: ChartData) -> str:
    total_gib = (data.total_bytes or 0) / GIB
    if total_gib <= 0:
        return ""
    used = data.known("nvml_used")
    note = f"total {total_gib:.1f} GiB"
    if used:
        note += f" · headroom {max(total_gib - used[-1][1] / GIB, 0):.1f} GiB"
    return note


def _document(summary: str, height: int, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH_PX}" height="{height}" '
        f'viewBox="0 0 {WIDTH_PX} {height}" role="img" aria-label="{_attr(summary)}" '
        f'font-family="sans-serif" font-size="{FONT_PX}">'
        f"<title>{html.escape(summary)}</title>"
        f'<rect width="{WIDTH_PX}" height="{height}" fill="#fff"/>'
        + "".join(body) + "</svg>")


def svg_data_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def html_img(svg: str, alt: str) -> str:
    """An ``<img>`` that survives JupyterLab's sanitizer in untrusted notebooks and nbviewer."""
    return f'<img src="{svg_data_uri(svg)}" alt="{_attr(alt)}">'


def static_bundle(data: ChartData) -> dict[str, str]:
    """The picture as display-bundle entries: ``image/svg+xml`` and an ``<img>`` in
    ``text/html`` (append the numbers' table to the latter)."""
    svg = render_svg(data)
    return {"image/svg+xml": svg, "text/html": html_img(svg, describe(data))}


# -- from the live chart's data ------------------------------------------------------------------
def mark_label(mark: CellMark) -> str:
    return f"[{'*' if mark.execution_count is None else mark.execution_count}]"


def chart_data(timeline: Timeline | None, t0_s: float, marks: Iterable[CellMark], *,
               total_bytes: int | None = None, title: str = "", replay: str | None = None,
               include_rss: bool = False, x_title: str = ChartData.x_title,
               max_points: int = MAX_POINTS_PER_SERIES) -> ChartData:
    """ChartData from one device's ``Timeline`` (values in GiB) and the monitor's marks.

    ``include_rss``: host RAM is charted only without a GPU, as the live chart does.
    """
    keys = ("nvml_used", "process", "reserved", "allocated") + (("rss",) if include_rss else ())
    series: dict[str, list[Point]] = {}
    if timeline is not None and timeline.n:
        for key in keys:
            a = timeline.arrays(key, t0_s, max_points)
            series[key] = [(float(t), None if math.isnan(v) else float(v) * GIB)
                           for t, v in zip(a.x.tolist(), a.y.tolist(), strict=True)]
    return ChartData(series=series, marks=[(m.t_s - t0_s, mark_label(m)) for m in marks],
                     total_bytes=total_bytes, title=title, replay=replay, x_title=x_title)
