"""Live bytes by site over the cell: plotly JSON for JupyterLab's bundled renderer, with a
static SVG picture of the same stack for every other viewer (``svgchart``).
"""

from __future__ import annotations

import html
from typing import Any

from .. import plotlyjson, svgchart
from ..units import format_bytes
from .replay import DeviceTrace, MiB
from .sites import _HOVER_CHARS, _LEGEND_CHARS, _shown

__all__ = ["TraceTimeline"]

_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#17becf", "#7f7f7f")
_OOM_COLOR = "#d62728"


class TraceTimeline:
    """Live bytes by site over the cell. Rendered by JupyterLab's bundled plotly mime
    renderer (no CDN, kept in the saved notebook); every bundle also carries a static SVG
    picture of the same stack (``svgchart``), for nbconvert, GitHub and untrusted views."""

    MIME = "application/vnd.plotly.v1+json"

    def __init__(self, device: DeviceTrace) -> None:
        self.device = device

    def _marks(self) -> list[tuple[float, str, str]]:
        d = self.device
        marks = [(d.peak_ms, "peak", plotlyjson.NEUTRAL)]
        if d.oom_ms is not None:
            marks.append((d.oom_ms, "OOM", _OOM_COLOR))
        return marks

    def figure(self) -> dict[str, Any]:
        d = self.device
        data = [{
            "type": "scatter", "mode": "lines", "name": _shown(s.label, _LEGEND_CHARS),
            "x": list(d.times_ms), "y": [round(v, 3) for v in s.mib],
            "stackgroup": "live", "line": {"shape": "hv", "width": 0.5,
                                            "color": _PALETTE[i % len(_PALETTE)]},
            "hovertemplate": "%{y:.1f} MiB<extra>" + html.escape(_shown(s.label, _HOVER_CHARS))
                             + "</extra>",
        } for i, s in enumerate(d.series)]
        marks = self._marks()
        shapes = [{"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x,
                   "y0": 0, "y1": 1, "line": {"color": color, "dash": "dot", "width": 1}}
                  for x, _, color in marks]
        annotations = [{"x": x, "y": 1, "xref": "x", "yref": "paper", "text": text,
                        "showarrow": False, "yanchor": "bottom", "font": {"color": color}}
                       for x, text, color in marks]
        layout = plotlyjson.layout(f"GPU {d.device}: this cell's live allocations by site",
                                   "ms since the cell started", "MiB live",
                                   legend_entries=len(data))
        layout.update(shapes=shapes, annotations=annotations)
        return {"data": data, "layout": layout, "config": plotlyjson.config()}

    def plot(self) -> svgchart.Plot:
        """The same stack as a static picture: each site's area on top of the ones before
        it, the peak and the OOM marked."""
        d = self.device
        xs = d.times_ms
        totals = [sum(s.mib[i] for s in d.series) for i in range(len(xs))]
        unit, unit_name = svgchart.byte_axis(max(totals, default=0.0) * MiB)
        keep = svgchart.downsample_indices(totals)
        lines, below = [], [0.0] * len(xs)
        for i, s in enumerate(d.series):
            below = [b + v for b, v in zip(below, s.mib, strict=False)]
            style = svgchart.SeriesStyle(s.label, _PALETTE[i % len(_PALETTE)], 1.0)
            lines.append(svgchart.Line(f"site-{i}", style,
                                       [(xs[j], below[j] * MiB / unit) for j in keep],
                                       area=True))
        marks = self._marks()
        span = (xs[-1] - xs[0]) if len(xs) > 1 else 0.0
        if len(marks) == 2 and span > 0 and abs(marks[1][0] - marks[0][0]) < span * (
                svgchart.label_gap_px(["peak · OOM"]) / svgchart.plot_width_px()):
            marks = [(marks[1][0], "peak · OOM", _OOM_COLOR)]  # one label, not a lost one
        return svgchart.Plot(
            lines=lines[::-1], legend=[ln.key for ln in lines],
            title=f"GPU {d.device}: this cell's live allocations by site",
            note=f"peak {format_bytes(d.peak_bytes)}", x_title="ms since the cell started",
            y_title=f"{unit_name} live", marks=[svgchart.Mark(x, t, c) for x, t, c in marks],
            summary=self.describe())

    def svg(self) -> str:
        """The static picture: a standalone SVG document."""
        return svgchart.render_plot(self.plot())

    def describe(self) -> str:
        d = self.device
        return (f"gpumem --trace timeline, GPU {d.device}: {len(d.series)} sites over "
                f"{(d.times_ms[-1] - d.times_ms[0]) if d.times_ms else 0:.1f} ms, peak "
                f"{format_bytes(d.peak_bytes)}"
                + (f", out of memory at {d.oom_ms:.1f} ms" if d.oom_ms is not None else ""))

    def __str__(self) -> str:
        return self.describe() + " (shown as a chart in JupyterLab)"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle: dict[str, Any] = {self.MIME: self.figure(), "text/plain": str(self)}
        bundle.update(svgchart.plot_bundle(self.plot()))
        return bundle
