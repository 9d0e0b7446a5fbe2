"""What ``%%gpumem --trace`` displays: the top sites as text and HTML, then the timelines.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..report import Shown, html_table, text_table
from ..units import format_bytes
from .recorder import TraceResult
from .replay import SiteBytes
from .sites import _TABLE_LABEL_CHARS, _shown
from .timeline import TraceTimeline

if TYPE_CHECKING:
    from ..views import CellReport

__all__ = ["TraceReport", "views"]


class TraceReport(Shown):
    """The top sites at the peak and alive at the end, per GPU, as text and HTML."""

    HEADERS = ("bytes", "allocations", "site")

    def __init__(self, result: TraceResult, cell: CellReport | None = None) -> None:
        self.result = result
        self.cell = cell  # the %%gpumem measurement (CellReport) of the same cell

    def _sections(self) -> list[tuple[str, list[list[str]]]]:
        out: list[tuple[str, list[list[str]]]] = []
        for d in self.result.devices:
            gpu = f"GPU {d.device}"
            out.append((f"{gpu}: top sites at the cell's peak ({format_bytes(d.peak_bytes)} "
                        f"of its own allocations live at {d.peak_ms:.1f} ms)", _rows(d.at_peak)))
            if d.alive_at_end:
                out.append((f"{gpu}: still alive at the end ({format_bytes(d.end_bytes)}): "
                            "leak candidates", _rows(d.alive_at_end)))
            if d.at_oom:
                out.append((f"{gpu}: live when it ran out of memory (asked "
                            f"{format_bytes(d.oom_requested_bytes)})", _rows(d.at_oom)))
        return out

    def footer(self) -> str:
        r = self.result
        parts = [f"gpumem --trace: {r.entries} history entries; tracing added "
                 f"{r.added_s * 1e3:.1f} ms (PyTorch's snapshot {r.snapshot_s * 1e3:.1f} ms, "
                 f"switching its recording on and off {r.switch_s * 1e3:.1f} ms, gpumem_nb's "
                 f"analysis {r.ours_s * 1e3:.1f} ms)"]
        if r.saved_to:
            parts.append(f"snapshot saved to {r.saved_to} (pickle protocol 4, for "
                         "PyTorch's memory_viz)")
        return "; ".join(parts) + "."

    def __str__(self) -> str:
        lines: list[str] = []
        if not self.result.devices:
            lines.append("gpumem --trace: this cell allocated nothing on the GPU.")
        for title, rows in self._sections():
            lines += [title, text_table(self.HEADERS, rows)]
        lines += list(self.result.notes)
        lines.append(self.footer())
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        parts = []
        if not self.result.devices:
            parts.append("<div>gpumem --trace: this cell allocated nothing on the GPU.</div>")
        for title, rows in self._sections():
            parts.append(html_table(self.HEADERS, rows, caption=title,
                                    text_columns=(self.HEADERS.index("site"),)))
        parts += [f"<div>{html.escape(n)}</div>" for n in self.result.notes]
        parts.append(f"<div style='color:#777'>{html.escape(self.footer())}</div>")
        return "<div class='gpumem-nb gpumem-trace'>" + "".join(parts) + "</div>"


def _rows(sites: Iterable[SiteBytes]) -> list[list[str]]:
    return [[format_bytes(s.nbytes), str(s.allocations), _shown(s.label, _TABLE_LABEL_CHARS)]
            for s in sites]


def views(result: TraceResult,
          cell: CellReport | None = None) -> list[TraceReport | TraceTimeline]:
    """What ``%%gpumem --trace`` displays: the report, then one timeline per GPU."""
    out: list[TraceReport | TraceTimeline] = [TraceReport(result, cell)]
    out += [TraceTimeline(d) for d in result.devices if d.series]
    return out
