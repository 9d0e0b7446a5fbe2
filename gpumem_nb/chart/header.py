"""The live chart's words: the header's table of the devices, the title and total/headroom
note the page draws, and the axis titles; each read from the chart's state, never drawn here.
"""

from __future__ import annotations

import html
from typing import Any

from ..model import DeviceSample, Sample, SourceStatus
from ..records import format_peak
from ..sampler import Sampler
from ..timeline import GIB, Timeline
from ..units import format_bytes
from ..views import children_html, device_row
from .host import ChartHost, ChartReplay
from .series import ChartSeries, device_key

__all__ = ["BANNER_STYLE", "LIVE_X_TITLE", "NOTE_STYLE", "REPLAY_X_TITLE", "ChartHeader"]

_HEADER = ("GPU", "used / total", "this process", "reserved", "allocated", "last cell peak",
           "outside PyTorch")
LIVE_X_TITLE = "seconds since %load_ext gpumem_nb"
# The replay note and the accumulation banner: JupyterLab's theme colours, so a dark theme
# gets a dark box with light text (a light box kept the theme's white text), with light
# fallbacks where no theme defines them (nbconvert's HTML, other frontends).
NOTE_STYLE = ("background:var(--jp-layout-color2,#e8f0fe);color:var(--jp-ui-font-color1,#111);"
              "border-left:4px solid var(--jp-brand-color1,#1a73e8);padding:4px 8px;"
              "margin:2px 0")
BANNER_STYLE = ("background:var(--jp-layout-color2,#fff3cd);"
                "color:var(--jp-ui-font-color1,#111);"
                "border-left:4px solid var(--jp-warn-color1,#d39e00);padding:6px 10px")
REPLAY_X_TITLE = "seconds into the recording"


class ChartHeader:
    """The chart's state that its words are read from, and the words; ``MemoryWidget`` sets
    the state in its ``__init__``."""

    monitor: ChartHost
    replay: ChartReplay | None
    feed: Sampler
    status: SourceStatus
    has_gpu: bool
    device: int | None
    device_options: list[tuple[str, int]]
    series: ChartSeries
    t0_s: float
    paused: bool

    @property
    def _t0_s(self) -> float:
        # A replay's timeline holds the recording's own points at their times into it.
        return self.t0_s if self.replay is None else 0.0

    def _timeline(self) -> Timeline | None:
        return self.series.timeline(self.device)

    def _meta(self, sample: Sample | None) -> dict[str, Any]:
        """Axis titles, the title line and the total/headroom note. The y axis follows the
        data, not the device total: a 141 GiB axis would flatten a notebook's few GiB into
        the floor; the total is drawn once it is in range and always named in the corner."""
        total = self._total_gib(sample)
        note = ""
        if total and self.has_gpu:
            note = (f"total {total:.1f} GiB · headroom "
                    f"{max(total - self._used_gib(sample), 0):.1f} GiB")
        title = ""
        if self.replay is not None:
            title = "REPLAY of a recorded session, not your GPU"
            if self._replay_ended():
                title += " · the recording ended"
        return {"x_title": LIVE_X_TITLE if self.replay is None else REPLAY_X_TITLE,
                "y_title": "GiB", "title": title, "note": note,
                "total": round(total, 3) if total and self.has_gpu else None,
                # The controls: a running cell holds the browser's requests back until it
                # ends, which the page says when one is asked for meanwhile.
                "busy": bool(self.monitor.cell_running),
                # A replay's saved picture is the kernel's (livechart.js's snapshot).
                "replay": self.replay is not None,
                "devices": [list(o) for o in self.device_options] or None,
                "device": device_key(self.device)}

    def _replay_ended(self) -> bool:
        return self.replay is not None and bool(getattr(self.replay.source, "ended", False))

    def _devices_shown(self, sample: Sample | None) -> list[DeviceSample]:
        if sample is None:
            return []
        if self.device is None:
            return list(sample.devices)
        d = sample.device(self.device)
        return [d] if d is not None else []

    def _total_gib(self, sample: Sample | None) -> float:
        known = [d.nvml.total_bytes for d in self._devices_shown(sample)
                 if d.nvml is not None and d.nvml.total_bytes]
        return sum(known) / GIB if known else 0.0

    def _used_gib(self, sample: Sample | None) -> float:
        known = [d.nvml.used_bytes for d in self._devices_shown(sample)
                 if d.nvml is not None and d.nvml.used_bytes is not None]
        return sum(known) / GIB if known else 0.0

    def _header_html(self, sample: Sample | None) -> str:
        status = self.status
        if sample is None:
            return "<div class='gpumem-header'>waiting for the first reading…</div>"
        if not sample.devices:
            return (f"<div class='gpumem-header'><b>No GPU visible</b>: "
                    f"{html.escape(status.nvml)}. Charting host RAM: "
                    f"{format_bytes(sample.rss_bytes)}.</div>")
        last = self.monitor.history.last() if self.replay is None else None
        rows = []
        for d in sample.devices:
            r = device_row(d)
            peak = "—" if self.replay is None else "(recording)"
            if last is not None:
                cd = next((c for c in last.devices if c.index == d.index), None)
                peak = format_peak(cd) if cd else "—"
            rows.append([r[0], r[1], r[2], r[4], r[3], peak, r[6]])
        head = "".join(f"<th style='padding:0 8px'>{h}</th>" for h in _HEADER)
        body = "".join(
            "<tr>" + "".join(f"<td style='padding:0 8px'>{html.escape(c)}</td>" for c in row)
            + "</tr>" for row in rows)
        note = ""
        if self.replay is not None:
            ended = (" It has ended; <code>%gpumem watch --replay …</code> plays it again."
                     if self._replay_ended() else "")
            note = (f"<div class='gpumem-note' style='{NOTE_STYLE}'><b>REPLAY</b>: "
                    f"{html.escape(self.replay.label)}. Not this machine's GPU: a demonstration"
                    " of the chart. Your own cells are still measured live "
                    "(<code>%gpumem history</code>); <code>%gpumem watch --live</code> "
                    f"charts this machine.{ended}</div>")
        paused = (" <b>(paused)</b>: the numbers and lines as they were; Resume follows "
                  "the GPU again" if self.paused else "")
        # The table scrolls on its own when the output is narrower than it, never the chart.
        return (f"{note}<div class='gpumem-header-scroll' style='overflow-x:auto;"
                f"max-width:100%'><table class='gpumem-header'><tr>{head}</tr>{body}</table>"
                f"</div>{children_html(sample)}{paused}")
