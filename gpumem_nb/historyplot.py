"""``%gpumem history --plot``: a bar per cell of its reserved growth and its allocator peak,
flagged re-runs in red, drawn by the chart's own SVG renderer (``svgchart.render_plot``).

Bars are step areas: each cell is a column at its place in the history (1, 2, …), as wide as
``BAR_WIDTH``, its peak behind and its reserved growth in front. A cell that freed memory has
no growth bar (a negative Δ is in ``%gpumem history``'s table). Without a GPU the bars are the
cell's host-RAM growth.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .model import CellDevice, CellRecord, Verdict
from .svgchart.bundle import plot_bundle
from .svgchart.data import SeriesStyle
from .svgchart.layout import byte_axis
from .svgchart.render import Line, Mark, Plot

__all__ = ["BAR_WIDTH", "STYLES", "history_plot", "history_plot_bundle"]

BAR_WIDTH = 0.7  # of a cell's column
STYLES = {
    "peak": SeriesStyle("allocator peak during the cell", "#aec7e8", 1.0),
    "reserved": SeriesStyle("reserved Δ (growth)", "#ff7f0e", 1.0),
    "flagged": SeriesStyle("reserved Δ of a flagged re-run", "#d62728", 1.0),
    "rss": SeriesStyle("host RAM Δ (growth)", "#2ca02c", 1.0),
}
FLAG_COLOR = "#d62728"


def _bars(values: Sequence[tuple[int, float | None]]) -> list[tuple[float, float | None]]:
    """(column, bytes) as a step line that rises to each value for the bar's width and
    drops to zero between bars."""
    half = BAR_WIDTH / 2
    out: list[tuple[float, float | None]] = []
    for x, v in values:
        out += [(x - half, v or 0.0), (x + half, 0.0)]
    return out


def _device(rec: CellRecord, device: int | None) -> CellDevice | None:
    shown = rec.shown_devices()
    if device is None:
        return shown[0] if shown else None
    return next((d for d in rec.devices if d.index == device), None)


def history_plot(records: Sequence[CellRecord], verdicts: Iterable[Verdict] = (),
                 device: int | None = None) -> Plot:
    flagged = {(v.cell_key, v.execution_count) for v in verdicts}
    gpu = any(rec.devices for rec in records)
    peak: list[tuple[int, float | None]] = []
    grow: list[tuple[int, float | None]] = []
    red: list[tuple[int, float | None]] = []
    marks: list[Mark] = []
    for i, rec in enumerate(records, start=1):
        is_flagged = (rec.cell_key, rec.execution_count) in flagged
        label = f"[{'*' if rec.execution_count is None else rec.execution_count}]"
        marks.append(Mark(i, label, FLAG_COLOR if is_flagged else "#555"))
        if gpu:
            d = _device(rec, device)
            delta = d.reserved_delta_bytes if d is not None else None
            peak.append((i, float(d.peak_allocated_bytes or 0) if d is not None else None))
        else:
            delta = rec.rss_delta_bytes
        growth = float(max(delta or 0, 0))
        (red if is_flagged else grow).append((i, growth))
    top = max((v or 0.0 for _, v in peak + grow + red), default=0.0)
    unit, unit_name = byte_axis(top)

    def line(key: str, values: list[tuple[int, float | None]]) -> Line:
        return Line(key, STYLES[key], [(x, None if v is None else v / unit)
                                       for x, v in _bars(values)], area=True)

    lines = [line("peak", peak)] if gpu else []
    lines += [line("reserved" if gpu else "rss", grow), line("flagged", red)]
    which = "host RAM" if not gpu else f"GPU {device}" if device is not None else "GPU"
    n = len(records)
    return Plot(lines=lines, title=f"gpumem_nb history: the last {n} cells, {which}",
                x_title="cells in the order they ran (flagged re-runs in red)",
                y_title=unit_name, marks=marks, min_top=0.01,
                summary=f"gpumem_nb history: {n} cells, {len(red)} flagged re-runs")


def history_plot_bundle(records: Sequence[CellRecord], verdicts: Iterable[Verdict] = (),
                        device: int | None = None) -> dict[str, str]:
    """The picture as display-bundle entries (``image/svg+xml``, an ``<img>``), with a line
    of text for a terminal."""
    plot = history_plot(records, verdicts, device)
    bundle = plot_bundle(plot)
    bundle["text/plain"] = plot.summary
    return bundle
