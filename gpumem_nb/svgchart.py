"""Static pictures of our charts: small standalone SVGs for saved notebooks.

A widget needs a kernel, or its saved state and its JavaScript; a plotly figure needs
plotly.js. An untrusted notebook in JupyterLab, nbconvert's HTML, nbviewer and GitHub show
only the static entries of a display bundle. So every chart (the live one, ``%%gpumem
--trace``'s timeline, ``%gpumem whatif``'s predictions) also renders itself as an SVG, put in
the bundle twice: as ``image/svg+xml``, and as an ``<img>`` with a data URI in ``text/html``
(JupyterLab's sanitizer keeps an img's data URI, and drops inline SVG in untrusted HTML).

One renderer draws them all: ``render_plot`` lays out a ``Plot`` (step lines or stacked areas,
labelled marks, one dashed level, a wrapping legend) so that no two texts overlap. The live
chart's ``ChartData`` (plain lists in bytes and seconds, built from a ``Timeline`` by
``chart_data``) becomes a ``Plot`` in ``live_plot``.

Pure standard library (no numpy, no plotly), so it is cheap to call on a refresh and testable
anywhere.
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
from .units import format_bytes, printable

if TYPE_CHECKING:  # a type only: importing timeline at run time would import numpy
    from .timeline import Timeline

__all__ = [
    "DARK_CSS",
    "DRAW_ORDER",
    "FONT_PX",
    "GIB",
    "GLYPH_EM",
    "LABEL_BAND_PX",
    "LABEL_FONT_PX",
    "LEGEND_ORDER",
    "MAX_POINTS_PER_SERIES",
    "MAX_WIDTH_PX",
    "PLOT_HEIGHT_PX",
    "STYLES",
    "TITLE_BAND_PX",
    "TOTAL_COLOR",
    "WIDTH_PX",
    "ChartData",
    "Line",
    "Mark",
    "Plot",
    "Point",
    "SeriesStyle",
    "byte_axis",
    "chart_data",
    "describe",
    "downsample",
    "downsample_indices",
    "html_img",
    "label_gap_px",
    "live_plot",
    "mark_label",
    "nice_step",
    "plot_bundle",
    "plot_width_px",
    "render_plot",
    "render_svg",
    "replay_banner",
    "static_bundle",
    "svg_data_uri",
    "text_width_px",
    "thin_labels",
    "tick_text",
    "ticks",
]

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


def plot_width_px(width_px: int = WIDTH_PX) -> int:
    """The plot area's width in a picture ``width_px`` wide."""
    return width_px - LEFT_PX - RIGHT_PX


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


def downsample_indices(values: Sequence[float | None],
                       max_points: int = MAX_POINTS_PER_SERIES) -> list[int]:
    """The indices ``downsample`` keeps, for series that must stay in step (a stack)."""
    n = len(values)
    if n <= max_points:
        return list(range(n))
    buckets = max((max_points - 2) // 3, 1)
    size = -(-n // buckets)
    keep = {0, n - 1}
    for start in range(0, n, size):
        chunk = range(start, min(start + size, n))
        known = [i for i in chunk if values[i] is not None]
        gap = next((i for i in chunk if values[i] is None), None)
        if gap is not None:
            keep.add(gap)
        if known:
            keep.add(min(known, key=lambda i: values[i] or 0.0))
            keep.add(max(known, key=lambda i: values[i] or 0.0))
    return sorted(keep)


def downsample(points: Sequence[Point], max_points: int = MAX_POINTS_PER_SERIES) -> list[Point]:
    """At most ``max_points``: per bucket its first gap (if any), minimum and maximum, so a
    short spike and a lost reading both survive. The first and last points are kept."""
    if len(points) <= max_points:
        return list(points)
    return [points[i] for i in downsample_indices([v for _, v in points], max_points)]


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


# XML allows no C0 control but tab, newline and return, no lone surrogate, and neither U+FFFE
# nor U+FFFF; html.escape leaves them all, and one of them (a raw ESC in a traced line, a
# replayed GPU's name) made the whole picture no XML: a broken image wherever it is shown.
# Every text is written as the text outputs write it (``units.printable``: each control
# character and noncharacter as its escape, ``\x1b``, ``\ufffe``).
def _xml(value: str) -> str:
    """``value`` as an SVG text or attribute value: well-formed XML whatever it holds."""
    return html.escape(printable(value), quote=True)


# -- any chart: lines, areas, marks and one level ----------------------------------------------
@dataclass(frozen=True)
class Line:
    """One series of a ``Plot``, in the plot's own units (x as the axis reads, y in the y
    axis' unit); None is a gap. An ``area`` is filled down to zero: a stacked area chart is
    its cumulative values, drawn from the top of the stack down so each hides the part of
    the one above it that is not its own."""

    key: str
    style: SeriesStyle
    points: Sequence[Point]
    area: bool = False


@dataclass(frozen=True)
class Mark:
    """A dotted vertical line at ``x``, labelled above the plot (labels are thinned so that
    none overlap; the rightmost always stays)."""

    x: float
    label: str
    color: str = "#555"


@dataclass(frozen=True)
class Plot:
    """What any of our static pictures shows. ``render_plot`` lays it out so that no two
    texts overlap at the given width (title and note, cell labels, legend entries)."""

    lines: Sequence[Line]  # drawn in this order: the first underneath
    title: str = ""
    badge: str = ""  # bold and red after the title (a replay's banner)
    note: str = ""  # red, at the title line's right end (device total, capacity)
    x_title: str = ""
    y_title: str = "GiB"
    marks: Sequence[Mark] = ()
    # A dashed red line across the plot (device total, capacity), drawn, and the y axis
    # stretched to it, only when it is at most ``level_within`` times the data's top.
    level: float | None = None
    level_label: str = ""
    level_within: float = 1.0
    legend: Sequence[str] | None = None  # keys in legend order; None: the draw order
    summary: str = ""  # for <title>, aria-label and the img's alt text
    watermark: str = ""
    width_px: int = WIDTH_PX
    min_top: float = 0.01  # the y axis reaches at least this (a flat zero still has a scale)


@dataclass(frozen=True)
class _Frame:
    """Maps data to pixels."""

    x0: float
    x1: float
    y1: float
    left: int
    top: int
    width: int
    height: int

    def px(self, x: float) -> int:
        return round(self.left + (x - self.x0) / (self.x1 - self.x0) * self.width)

    def py(self, y: float) -> int:
        return round(self.top + self.height - y / self.y1 * self.height)


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
        x, y = frame.px(t), frame.py(v)
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


def _area_path(points: Sequence[Point], frame: _Frame) -> str:
    """The step line closed down to zero: the region under it (a gap counts as zero)."""
    pts = [(t, v or 0.0) for t, v in points]
    if not pts:
        return ""
    zero = frame.py(0.0)
    return (_step_path(pts, frame) + f"V{zero}H{frame.px(pts[0][0])}Z")


def _within(x: float, text_w: float, width_px: int) -> int:
    """A centred text's x, moved just enough to lie inside the picture."""
    half = text_w / 2 + 2
    return round(min(max(x, half), width_px - half))


def _clip_to(text: str, width_px: float, font_px: float) -> str:
    """``text`` shortened with an ellipsis to fit ``width_px``."""
    fits = max(int(width_px / (font_px * GLYPH_EM)), 1)
    return text if len(text) <= fits else text[: fits - 1] + "…"


def _legend(lines: Sequence[Line], top: int, width_px: int) -> tuple[list[str], int]:
    """Legend entries left to right, wrapping; returns the elements and the height used."""
    out: list[str] = []
    x, y = LEFT_PX, top + 10
    room = width_px - RIGHT_PX - LEFT_PX - 28
    for line in lines:
        st = line.style
        name = _clip_to(printable(st.name), room, FONT_PX)  # clipped as it is shown
        w = 28 + text_width_px(name) + 14
        if x + w > width_px - RIGHT_PX and x > LEFT_PX:
            x, y = LEFT_PX, y + 18
        if line.area:
            swatch = f'<rect x="{x}" y="{y - 5}" width="24" height="10" fill="{st.color}"/>'
        else:
            dash = f' stroke-dasharray="{st.dash}"' if st.dash else ""
            swatch = (f'<path d="M{x} {y}h24" stroke="{st.color}" '
                      f'stroke-width="{st.width_px:g}"{dash}/>')
        out.append(f'<g class="legend" data-series="{_xml(line.key)}">{swatch}'
                   f'<text x="{x + 28}" y="{y + 4}">{_xml(name)}</text></g>')
        x += round(w)
    return out, y - top + 10


def render_plot(plot: Plot) -> str:
    """A standalone SVG document (a string, UTF-8 text) of ``plot``."""
    width = plot.width_px
    known = [ln for ln in plot.lines if any(v is not None for _, v in ln.points)]
    by_key = {ln.key: ln for ln in known}
    order = plot.legend if plot.legend is not None else [ln.key for ln in plot.lines]
    legend_lines = [by_key[k] for k in order if k in by_key]
    # The title sits left and the note right; when the two would meet (a replay's long
    # title), the note takes a line of its own.
    title_w = text_width_px(plot.title or "gpumem_nb", FONT_PX * 1.08)
    if plot.badge:
        title_w += text_width_px(" " + plot.badge, FONT_PX * 1.08)
    note_w = text_width_px(plot.note)
    two_lines = bool(plot.note) and LEFT_PX + title_w + 16 + note_w > width - RIGHT_PX
    title_band = TITLE_BAND_PX + (16 if two_lines else 0)
    plot_top = title_band + LABEL_BAND_PX
    plot_bottom = plot_top + PLOT_HEIGHT_PX
    plot_w = plot_width_px(width)
    body: list[str] = []

    # Title line: what this is, and loudly when it is somebody else's recording.
    title = _xml(plot.title or "gpumem_nb")
    if plot.badge:
        title += (f' <tspan class="replay" fill="{TOTAL_COLOR}" font-weight="bold">'
                  f"{_xml(plot.badge)}</tspan>")
    body.append(f'<text class="title" x="{LEFT_PX}" y="16" font-weight="bold">{title}</text>')
    if plot.note:
        body.append(f'<text class="total-note" x="{width - RIGHT_PX}" '
                    f'y="{32 if two_lines else 16}" text-anchor="end" fill="{TOTAL_COLOR}">'
                    f"{_xml(plot.note)}</text>")

    if not known:
        height = plot_bottom + 20
        body.append(f'<rect x="{LEFT_PX}" y="{plot_top}" width="{plot_w}" '
                    f'height="{PLOT_HEIGHT_PX}" fill="#fafafa" stroke="#ddd"/>')
        body.append(f'<text class="waiting" x="{LEFT_PX + plot_w // 2}" '
                    f'y="{plot_top + PLOT_HEIGHT_PX // 2}" text-anchor="middle" fill="#666">'
                    "waiting for data…</text>")
        return _document(plot.summary, width, height, body)

    # Ranges: y follows the data (not the device total); the level is drawn only when in
    # range.
    all_x = [t for ln in known for t, v in ln.points if v is not None] + [
        m.x for m in plot.marks]
    x0, x1 = min(all_x), max(all_x)
    if x1 - x0 < 1e-6:
        x0, x1 = x0 - 0.5, x1 + 0.5
    top = max(max(v for _, v in ln.points if v is not None) for ln in known)
    top = max(top, plot.min_top) * 1.15
    level = plot.level if plot.level is not None and plot.level > 0 else None
    drawn = level is not None and level <= top * plot.level_within
    y1 = max(top * 1.08, level * 1.02 if drawn and level is not None else 0.0)
    frame = _Frame(x0, x1, y1, LEFT_PX, plot_top, plot_w, PLOT_HEIGHT_PX)

    if plot.watermark:  # so that a cropped screenshot still says it
        body.append(f'<text x="{LEFT_PX + plot_w // 2}" y="{plot_top + PLOT_HEIGHT_PX // 2 + 20}"'
                    f' text-anchor="middle" font-size="64" font-weight="bold" fill="{TOTAL_COLOR}"'
                    f' fill-opacity="0.07">{_xml(plot.watermark)}</text>')

    # Axes and grid.
    grid, labels = [], []
    for v in ticks(0.0, y1, 5):
        y = frame.py(v)
        grid.append(f"M{LEFT_PX} {y}h{plot_w}")
        labels.append(f'<text x="{LEFT_PX - 6}" y="{y + 4}" text-anchor="end">'
                      f"{tick_text(v)}</text>")
    for t in ticks(x0, x1, 8 * width // WIDTH_PX):
        x = frame.px(t)
        grid.append(f"M{x} {plot_top}V{plot_bottom}")
        text = tick_text(t)
        cx = _within(x, text_width_px(text), width)
        labels.append(f'<text x="{cx}" y="{plot_bottom + 16}" text-anchor="middle">'
                      f"{text}</text>")
    body.append(f'<path class="grid" d="{"".join(grid)}" stroke="#e5e5e5" stroke-width="1"/>')
    body.append(f'<g class="ticks" fill="#444">{"".join(labels)}</g>')
    body.append(f'<path d="M{LEFT_PX} {plot_top}V{plot_bottom}h{plot_w}" stroke="#999" '
                'fill="none"/>')
    mid = plot_top + PLOT_HEIGHT_PX // 2
    body.append(f'<text class="y-title" x="14" y="{mid}" text-anchor="middle" '
                f'transform="rotate(-90 14 {mid})">'
                f"{_xml(_clip_to(printable(plot.y_title), PLOT_HEIGHT_PX, FONT_PX))}</text>")
    body.append(f'<text class="x-title" x="{LEFT_PX + plot_w // 2}" y="{plot_bottom + 30}" '
                f'text-anchor="middle">{_xml(_clip_to(printable(plot.x_title), plot_w, FONT_PX))}'
                "</text>")

    if drawn and level is not None:
        y = frame.py(level)
        body.append(f'<path class="total" d="M{LEFT_PX} {y}h{plot_w}" stroke="{TOTAL_COLOR}"'
                    ' stroke-width="1" stroke-dasharray="6 3"/>')
        if plot.level_label:  # under the line, inside the plot: clear of the labels above
            below = y + 13 if y + 13 < plot_bottom - 2 else y - 3
            body.append(f'<text class="level-label" x="{width - RIGHT_PX - 4}" y="{below}" '
                        f'text-anchor="end" fill="{TOTAL_COLOR}">'
                        f"{_xml(plot.level_label)}</text>")

    # Marks: every one as a dotted line, labels thinned so none overlap.
    # Lines on one pixel column are drawn once, so even 10 000 marks stay a small path.
    marks = sorted(plot.marks, key=lambda m: m.x)
    if marks:
        xs = [frame.px(m.x) for m in marks]
        for color in dict.fromkeys(m.color for m in marks):
            cols = sorted({x for x, m in zip(xs, marks, strict=True) if m.color == color})
            lines = "".join(f"M{x} {plot_top}V{plot_bottom}" for x in cols)
            body.append(f'<path class="marks" d="{lines}" stroke="{color}" '
                        'stroke-opacity="0.45" stroke-width="1" stroke-dasharray="1 3"/>')
        gap = label_gap_px(m.label for m in marks)
        # Labels stay inside the picture: the widest one's half from either edge (a shift
        # that keeps their order, so thinning still keeps them apart).
        cxs = [_within(x, gap - 4, width) for x in xs]
        texts = "".join(
            f'<text class="mark-label" x="{cxs[i]}" y="{plot_top - 4}" '
            f'fill="{marks[i].color}">{_xml(marks[i].label)}</text>'
            for i in thin_labels(cxs, gap))
        body.append(f'<g text-anchor="middle" font-size="{LABEL_FONT_PX}">{texts}</g>')

    for ln in known:
        st = ln.style
        pts = downsample(ln.points)
        if ln.area:
            body.append(f'<path class="series" data-series="{_xml(ln.key)}" '
                        f'd="{_area_path(pts, frame)}" fill="{st.color}" stroke="none"/>')
            continue
        dash = f' stroke-dasharray="{st.dash}"' if st.dash else ""
        body.append(f'<path class="series" data-series="{_xml(ln.key)}" '
                    f'd="{_step_path(pts, frame)}" fill="none" stroke="{st.color}" '
                    f'stroke-width="{st.width_px:g}"{dash} stroke-linejoin="round"/>')

    legend, legend_h = _legend(legend_lines, plot_bottom + 40, width)
    body.extend(legend)
    return _document(plot.summary, width, plot_bottom + 40 + legend_h, body)


# A picture is an <img>: it cannot see the page's stylesheet, but its prefers-color-scheme is
# the colour scheme of the element showing it (in chromium), which JupyterLab's dark theme sets
# (`color-scheme: dark` on <body>), as a dark system does. Under a dark one it takes the live
# chart's dark colours instead of showing as a white card.
# CSS outranks the presentation attributes the light colours are written in.
# Text with a colour of its own (the red total, each cell mark's label) keeps it.
DARK_CSS = ("@media (prefers-color-scheme: dark){.background{fill:#111}"
            "text:not([fill]){fill:rgba(255,255,255,.87)}.grid{stroke:#424242}}")


def _document(summary: str, width: int, height: int, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{_xml(summary)}" '
        f'font-family="sans-serif" font-size="{FONT_PX}">'
        f"<title>{_xml(summary)}</title><style>{DARK_CSS}</style>"
        f'<rect class="background" width="{width}" height="{height}" fill="#fff"/>'
        + "".join(body) + "</svg>")


# -- the live chart's picture --------------------------------------------------------------------
def live_plot(data: ChartData) -> Plot:
    """The live chart's series as a ``Plot``: cell marks, the device total, and a unit that
    keeps the tick labels short (MiB until the data reach a GiB)."""
    keys = [k for k in DRAW_ORDER if data.known(k)]
    top = max((v for k in keys for _, v in data.known(k)), default=0.0)
    unit, unit_name = byte_axis(top)
    lines = [Line(k, STYLES[k], [(t, None if v is None else v / unit)
                                 for t, v in data.series.get(k, ())]) for k in keys]
    return Plot(
        lines=lines, title=data.title,
        badge=replay_banner(data.replay) if data.replay else "",
        note=_total_note(data), x_title=data.x_title, y_title=unit_name,
        marks=[Mark(t, s) for t, s in data.marks],
        level=(data.total_bytes or 0) / unit or None, legend=LEGEND_ORDER,
        summary=describe(data), watermark="REPLAY" if data.replay else "")


def render_svg(data: ChartData) -> str:
    """The live chart's picture as a standalone SVG document."""
    return render_plot(live_plot(data))


def _total_note(data: ChartData) -> str:
    total_gib = (data.total_bytes or 0) / GIB
    if total_gib <= 0:
        return ""
    used = data.known("nvml_used")
    note = f"total {total_gib:.1f} GiB"
    if used:
        note += f" · headroom {max(total_gib - used[-1][1] / GIB, 0):.1f} GiB"
    return note


def byte_axis(top_bytes: float) -> tuple[float, str]:
    """(bytes per unit, unit name) for a y axis whose data reach ``top_bytes``: the largest
    unit the top is at least one of, so tick labels stay short (at most four digits)."""
    for unit, name in ((GIB, "GiB"), (float(1 << 20), "MiB"), (1024.0, "KiB")):
        if top_bytes >= unit:
            return unit, name
    return 1.0, "B"


def svg_data_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def html_img(svg: str, alt: str) -> str:
    """An ``<img>`` that survives JupyterLab's sanitizer in untrusted notebooks and nbviewer."""
    # Scaled down in an output narrower than the picture, never sideways scrolling.
    return (f'<img src="{svg_data_uri(svg)}" alt="{_xml(alt)}" '
            'style="max-width:100%;height:auto">')


def plot_bundle(plot: Plot) -> dict[str, str]:
    """A picture as display-bundle entries: ``image/svg+xml``, and the same SVG as an
    ``<img>`` in ``text/html`` (what nbconvert's HTML and untrusted views show)."""
    svg = render_plot(plot)
    return {"image/svg+xml": svg, "text/html": html_img(svg, plot.summary)}


def static_bundle(data: ChartData) -> dict[str, str]:
    """The live chart's picture as display-bundle entries (append the numbers' table to
    ``text/html``)."""
    return plot_bundle(live_plot(data))


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
