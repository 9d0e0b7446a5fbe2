"""``render_plot``: any chart (step lines or stacked areas, labelled marks, one dashed level, a
wrapping legend) as a standalone SVG document, laid out so that no two texts overlap.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from ..units import printable
from .data import TOTAL_COLOR, Point, SeriesStyle
from .layout import (
    FONT_PX,
    GLYPH_EM,
    LABEL_BAND_PX,
    LABEL_FONT_PX,
    LEFT_PX,
    PLOT_HEIGHT_PX,
    RIGHT_PX,
    TITLE_BAND_PX,
    WIDTH_PX,
    downsample,
    label_gap_px,
    plot_width_px,
    text_width_px,
    thin_labels,
    tick_text,
    ticks,
)

__all__ = [
    "DARK_CSS",
    "Line",
    "Mark",
    "Plot",
    "render_plot",
]


# XML allows no C0 control but tab, newline and return, no lone surrogate, and neither U+FFFE
# nor U+FFFF; html.escape leaves them all, and one of them (a raw ESC in a traced line, a
# replayed GPU's name) made the whole picture no XML: a broken image wherever it is shown.
# Every text is written as the text outputs write it (``units.printable``: each control
# character and noncharacter as its escape, ``\x1b``, ``\ufffe``).
def _xml(value: str) -> str:
    """``value`` as an SVG text or attribute value: well-formed XML whatever it holds."""
    return html.escape(printable(value), quote=True)


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
