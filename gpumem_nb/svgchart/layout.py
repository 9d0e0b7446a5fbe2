"""The pictures' layout in pixels: text widths estimated, labels thinned, series downsampled
(spikes kept), axis ticks and the byte axis' unit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from .data import GIB, MAX_POINTS_PER_SERIES, Point

__all__ = [
    "FONT_PX",
    "GLYPH_EM",
    "LABEL_BAND_PX",
    "LABEL_FONT_PX",
    "PLOT_HEIGHT_PX",
    "TITLE_BAND_PX",
    "WIDTH_PX",
    "byte_axis",
    "downsample",
    "downsample_indices",
    "label_gap_px",
    "nice_step",
    "plot_width_px",
    "text_width_px",
    "thin_labels",
    "tick_text",
    "ticks",
]

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


def byte_axis(top_bytes: float) -> tuple[float, str]:
    """(bytes per unit, unit name) for a y axis whose data reach ``top_bytes``: the largest
    unit the top is at least one of, so tick labels stay short (at most four digits)."""
    for unit, name in ((GIB, "GiB"), (float(1 << 20), "MiB"), (1024.0, "KiB")):
        if top_bytes >= unit:
            return unit, name
    return 1.0, "B"
