"""The live chart's picture: its ``ChartData`` as a ``Plot`` (cell marks, the device total, a
unit that keeps tick labels short), described in one sentence.
"""

from __future__ import annotations

from ..units import format_bytes
from .bundle import plot_bundle
from .data import DRAW_ORDER, GIB, LEGEND_ORDER, STYLES, ChartData
from .layout import byte_axis
from .render import Line, Mark, Plot, render_plot

__all__ = [
    "describe",
    "live_plot",
    "render_svg",
    "replay_banner",
    "static_bundle",
]


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


def static_bundle(data: ChartData) -> dict[str, str]:
    """The live chart's picture as display-bundle entries (append the numbers' table to
    ``text/html``)."""
    return plot_bundle(live_plot(data))
