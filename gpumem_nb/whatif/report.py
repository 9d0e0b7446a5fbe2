"""The what-if's result: one row per setting, its table, and its chart.

The chart is a plain plotly JSON figure for the ``application/vnd.plotly.v1+json`` mime type
(JupyterLab's bundled renderer, no CDN, kept in the saved notebook), with a static SVG
picture of the same lines beside it, as ``%%gpumem --trace`` draws its timeline: nothing here
imports plotly.
"""

from __future__ import annotations

import html
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

from .. import plotlyjson, svgchart
from ..report import Shown, html_table, text_table
from ..units import cut, format_bytes, printable
from .snapshot import ORIGIN_CELL, ORIGIN_HISTORY, ORIGIN_SESSION

if TYPE_CHECKING:  # fit loads only when asked for
    from .fit import Fit

__all__ = ["WhatIf", "WhatIfChart", "WhatIfRow", "views"]

_MiB = float(1 << 20)
# The x axis's origin, by what recorded the history (snapshot.ORIGIN_*): a session recording
# spans many cells and starts at %gpumem record on.
_SINCE = {ORIGIN_CELL: "the cell started", ORIGIN_SESSION: "the recording began",
          ORIGIN_HISTORY: "the history's first entry"}
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#17becf")


@dataclass(frozen=True)
class WhatIfRow:
    setting: str  # the PYTORCH_ALLOC_CONF string as given
    label: str
    current: bool  # the setting the history was recorded under
    modelled: bool = True
    peak_reserved_bytes: int | None = None
    end_reserved_bytes: int | None = None
    inactive_split_bytes: int | None = None
    segment_allocs: int | None = None
    segment_frees: int | None = None
    oom: bool | None = None
    start_reserved_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    oom_at_ms: float | None = None
    oom_requested_bytes: int | None = None
    note: str = ""
    series: tuple[tuple[float, int], ...] = field(default=(), repr=False)  # (time, reserved)


@dataclass(frozen=True)
class WhatIf(Shown, Sequence[WhatIfRow]):
    """Rows in the order the settings were given; also a sequence of them."""

    rows: tuple[WhatIfRow, ...]
    device: int
    recorded_setting: str
    capacity_bytes: int | None
    entries: int  # history entries read
    events: int  # of which allocations, frees and empty_cache calls replayed
    skipped: Mapping[str, int]
    unmatched_frees: int
    notes: tuple[str, ...]
    recorded_series: tuple[tuple[float, int], ...] = field(repr=False)
    recorded_peak_reserved_bytes: int
    recorded_end_reserved_bytes: int
    time_unit: str = "ms"
    # What the times count from: snapshot.ORIGIN_CELL, ORIGIN_SESSION or ORIGIN_HISTORY.
    origin: str = ORIGIN_CELL
    elapsed_s: float = 0.0
    # Whether the history says what its own allocator reserved (segment entries, or a
    # recorded start): a wrapped ring buffer or a hand-made history does not.
    recorded_known: bool = True
    fit: Fit | None = None  # when asked for

    @overload
    def __getitem__(self, i: int) -> WhatIfRow: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[WhatIfRow]: ...

    def __getitem__(self, i: int | slice) -> WhatIfRow | Sequence[WhatIfRow]:
        return self.rows[i]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[WhatIfRow]:
        return iter(self.rows)

    @property
    def baseline(self) -> WhatIfRow | None:
        """The row savings are counted from: the recorded setting, else the first row."""
        modelled = [r for r in self.rows if r.modelled]
        return next((r for r in modelled if r.current), modelled[0] if modelled else None)

    HEADERS = ("setting", "peak reserved", "saving", "end reserved", "stranded at peak",
               "cudaMalloc", "cudaFree", "OOM")

    def table_rows(self) -> list[list[str]]:
        base = self.baseline
        out = []
        for r in self.rows:
            label = r.label + (" (current)" if r.current else "")
            if not r.modelled:
                out.append([label, "cannot be modelled", "", "", "", "", "", ""])
                continue
            out.append([label, format_bytes(r.peak_reserved_bytes), _saving(base, r),
                        format_bytes(r.end_reserved_bytes), format_bytes(r.inactive_split_bytes),
                        str(r.segment_allocs), str(r.segment_frees), _oom(r)])
        return out

    def title(self) -> str:
        cap = (f"; OOM judged at {format_bytes(self.capacity_bytes)} "
               "(what PyTorch could use)" if self.capacity_bytes is not None else
               "; no capacity known, so no OOM call (pass --capacity)")
        return (f"gpumem whatif, GPU {self.device}: {self.events} allocations and frees "
                f"replayed under {len(self.rows)} setting(s){cap}")

    def footer(self) -> str:
        # The setting as the recording says it: a file's text, shown printable and cut.
        setting = printable(cut(self.recorded_setting, 200)) or "defaults"
        if self.recorded_known:
            rec = (f"Recorded under {setting}: the history's own "
                   f"segments peaked at {format_bytes(self.recorded_peak_reserved_bytes)} "
                   f"reserved and ended at {format_bytes(self.recorded_end_reserved_bytes)}.")
        else:
            rec = (f"Recorded under {setting}: what its own "
                   "allocator reserved is unknown (the history holds no segment entries).")
        return (f"{rec} Stranded: free bytes empty_cache could not give back. "
                f"Replay took {self.elapsed_s * 1e3:.0f} ms.")

    def lines(self) -> list[str]:
        out = [self.title(), text_table(self.HEADERS, self.table_rows())]
        out += [f"{r.label}: {r.note}" for r in self.rows if r.note]
        if self.fit is not None:
            out += self.fit.lines()
        out += list(self.notes)
        out.append(self.footer())
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        esc = html.escape
        parts = [html_table(self.HEADERS, self.table_rows(), caption=self.title())]
        parts += [f"<div>{esc(r.label)}: {esc(r.note)}</div>" for r in self.rows if r.note]
        if self.fit is not None:
            headers, rows = self.fit.gpu_table()
            parts.append(html_table(headers, rows, caption=self.fit.lines()[0]))
            parts.append(f"<div>{esc(self.fit.sentence())}</div>")
            parts += [f"<div>{esc(line)}</div>" for line in self.fit.uneven_lines()]
        parts += [f"<div>{esc(n)}</div>" for n in self.notes]
        parts.append(f"<div style='color:#777'>{esc(self.footer())}</div>")
        return "<div class='gpumem-nb gpumem-whatif'>" + "".join(parts) + "</div>"


def _saving(base: WhatIfRow | None, r: WhatIfRow) -> str:
    if base is None or base is r or not base.peak_reserved_bytes or r.peak_reserved_bytes is None:
        return ""
    d = base.peak_reserved_bytes - r.peak_reserved_bytes
    return f"{format_bytes(d, signed=True)} ({d / base.peak_reserved_bytes * 100:+.1f}%)"


def _oom(r: WhatIfRow) -> str:
    if r.oom is None:
        return "?"
    if not r.oom:
        return "fits"
    at = f" at {r.oom_at_ms:.1f} ms" if r.oom_at_ms is not None else ""
    return f"OOM{at}"


@dataclass(frozen=True)
class _ChartLine:
    name: str
    points: Sequence[tuple[float, int]]  # (time, reserved bytes)
    color: str
    width: float
    recorded: bool = False


class WhatIfChart:
    """Predicted reserved memory over the cell, one line per setting (not live). Every
    bundle carries plotly's JSON (interactive in JupyterLab) and a static SVG picture of the
    same lines (``svgchart``: nbconvert, GitHub, untrusted views)."""

    MIME = "application/vnd.plotly.v1+json"

    def __init__(self, result: WhatIf) -> None:
        self.result = result

    def _lines(self) -> list[_ChartLine]:
        """The predictions, one per modelled setting, then the recording."""
        r = self.result
        out = [_ChartLine(row.label + (" (current)" if row.current else ""), row.series,
                          _PALETTE[i % len(_PALETTE)], 2.0 if row.current else 1.5)
               for i, row in enumerate(x for x in r.rows if x.modelled and x.series)]
        if len(r.recorded_series) > 1:
            out.append(_ChartLine("recorded (the history's own segments)", r.recorded_series,
                                  plotlyjson.NEUTRAL, 1.0, recorded=True))
        return out

    def _x_title(self) -> str:
        if self.result.time_unit != "ms":
            return "history entry"
        return f"ms since {_SINCE.get(self.result.origin, _SINCE[ORIGIN_HISTORY])}"

    def _title(self) -> str:
        return f"GPU {self.result.device}: predicted reserved memory per allocator setting"

    def figure(self) -> dict[str, Any]:
        r = self.result
        data = [_line(ln.name, ln.points, ln.color, dash="dot" if ln.recorded else "solid",
                      width=ln.width) for ln in self._lines()]
        shapes, annotations = [], []
        if r.capacity_bytes is not None:
            y = round(r.capacity_bytes / _MiB, 1)
            shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y",
                           "y0": y, "y1": y, "line": {"color": "#d62728", "dash": "dash",
                                                      "width": 1}})
            annotations.append({"xref": "paper", "x": 1, "y": y, "yref": "y",
                                "text": "capacity", "showarrow": False, "xanchor": "right",
                                "yanchor": "top", "font": {"color": "#d62728"}})
        layout = plotlyjson.layout(self._title(), self._x_title(), "MiB reserved",
                                   legend_entries=len(data))
        layout["yaxis"]["rangemode"] = "tozero"
        layout.update(shapes=shapes, annotations=annotations)
        return {"data": data, "layout": layout, "config": plotlyjson.config()}

    def plot(self) -> svgchart.Plot:
        """The same lines as a static picture, with the capacity when it is in sight."""
        r = self.result
        lines = self._lines()
        top = max((v for ln in lines for _, v in ln.points), default=0)
        unit, unit_name = svgchart.byte_axis(top)
        cap = r.capacity_bytes
        return svgchart.Plot(
            lines=[svgchart.Line(f"line-{i}", svgchart.SeriesStyle(
                       ln.name, ln.color, ln.width, "2 3" if ln.recorded else ""),
                       [(t, v / unit) for t, v in ln.points]) for i, ln in enumerate(lines)],
            title=self._title(), x_title=self._x_title(), y_title=f"{unit_name} reserved",
            note=f"capacity {format_bytes(cap)}" if cap is not None else "",
            level=cap / unit if cap else None, level_label="capacity",
            # Drawn while the predictions still take a quarter of the height at least.
            level_within=4.0, summary=self.describe())

    def svg(self) -> str:
        return svgchart.render_plot(self.plot())

    def describe(self) -> str:
        r = self.result
        peaks = ", ".join(f"{row.label} {format_bytes(row.peak_reserved_bytes)}"
                          for row in r.rows if row.modelled)
        return (f"gpumem whatif chart, GPU {r.device}: predicted peak reserved memory: "
                f"{peaks or 'nothing modelled'}")

    def __str__(self) -> str:
        n = sum(1 for x in self.result.rows if x.modelled)
        return (f"gpumem whatif chart, GPU {self.result.device}: predicted reserved memory "
                f"under {n} setting(s) (shown as a chart in JupyterLab)")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle: dict[str, Any] = {self.MIME: self.figure(), "text/plain": str(self)}
        bundle.update(svgchart.plot_bundle(self.plot()))
        return bundle


def _line(name: str, pts: Sequence[tuple[float, int]], color: str, *, dash: str = "solid",
          width: float = 1.5) -> dict[str, Any]:
    return {"type": "scatter", "mode": "lines", "name": name,
            "x": [t for t, _ in pts], "y": [round(v / _MiB, 2) for _, v in pts],
            "line": {"shape": "hv", "color": color, "dash": dash, "width": width},
            "hovertemplate": "%{y:.1f} MiB<extra>" + html.escape(name[:50]) + "</extra>"}


def views(result: WhatIf) -> list[Any]:
    """What ``%gpumem whatif`` displays: the table, then the chart."""
    return [result, WhatIfChart(result)]
