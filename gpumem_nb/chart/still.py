"""The live chart's still picture: the chart as an SVG with the numbers' table, what a
frontend without the widget shows and what replaces the view when the chart ends.
"""

from __future__ import annotations

import dataclasses
import html
import threading
from typing import Protocol

from ..model import Sample
from ..svgchart.data import chart_data
from ..svgchart.liveplot import static_bundle as svg_static_bundle
from ..timeline import GIB, Timeline
from ..units import shown_name
from ..views import Snapshot
from .header import LIVE_X_TITLE, REPLAY_X_TITLE, ChartHeader

__all__ = ["MAX_MARKS", "ChartStill"]

# Cell labels closer than this fraction of the visible time span are thinned out in the static
# picture; the live front end thins by pixels.
MAX_MARKS = 100
REPLAY_MARK = "replay here"  # where a replay that has not ended stood, on its picture
MAX_TITLE_NAMES = 4  # the GPU names the picture's title lists, each cut (units.shown_name)


class _Html(Protocol):
    value: str


class ChartStill(ChartHeader):
    """The picture half of ``MemoryWidget``."""

    report: _Html  # the Clean up report's widget
    _report_text: str
    _lock: threading.RLock

    def plain_bundle(self) -> dict[str, str]:
        """The chart without the widget: text, the picture (SVG) and the numbers."""
        # A replay's picture is its whole recording, marked where the replay stood; its table
        # is the reading there (``--stop`` freezes it where it was), and says so.
        stood = self._replay_stood() if self.replay is not None else None
        latest = stood or self.feed.latest() or self.monitor.read()
        snap = Snapshot(status=self.status, sample=latest)
        static = self.static_bundle(latest)
        where = self._stood_text()
        # The Clean up button's report stays with the picture: it was the user's only
        # account of what was freed, and ``watch --stop`` used to wipe it with the chart.
        report_html = self.report.value or ""
        report_text = f"\n{self._report_text}" if report_html and self._report_text else ""
        return {"text/plain": "gpumem_nb chart (a static picture; live with a kernel)\n"
                              + (f"{where}\n" if where else "") + str(snap) + report_text,
                "text/html": static["text/html"]
                + (f"<div>{html.escape(where)}</div>" if where else "")
                + snap._repr_html_() + report_html,
                "image/svg+xml": static["image/svg+xml"]}

    def static_bundle(self, sample: Sample | None) -> dict[str, str]:
        """The chart as a static SVG: ``image/svg+xml`` and an ``<img>`` for ``text/html``.
        A replay's picture is its whole recording: the story, however little has played."""
        with self._lock:
            tl = self._timeline()
            marks = [] if self.replay is not None else self.monitor.marks_for_picture(MAX_MARKS)
            t0 = self._t0_s
            if self.replay is not None:
                tl, t0 = self._recording_timeline()
                # Named and totalled as the recording, not this machine: the picture plots
                # the recorded GPU's lines, as the live chart's header names it.
                sample = self._recording_end() or sample
            total = self._total_gib(sample)
            shown = self._devices_shown(sample)
            where = (f"GPU {shown[0].index}" if len(shown) == 1
                     else "all GPUs" if shown else "host RAM")
            names = sorted({shown_name(d.nvml.name) for d in shown if d.nvml and d.nvml.name})
            if len(names) > MAX_TITLE_NAMES:  # a recording of 3,000 GPUs, each named apart
                names[MAX_TITLE_NAMES:] = [f"{len(names) - MAX_TITLE_NAMES} more"]
            title = f"gpumem_nb chart: {where}" + (f" ({', '.join(names)})" if names else "")
            data = chart_data(tl, t0, marks,
                              total_bytes=int(total * GIB) if total else None, title=title,
                              replay=self.replay.label if self.replay is not None else None,
                              include_rss=not self.has_gpu,
                              x_title=LIVE_X_TITLE if self.replay is None else REPLAY_X_TITLE)
            stood_s = self._stood_s()
            if stood_s is not None:
                data = dataclasses.replace(data, marks=[*data.marks, (stood_s, REPLAY_MARK)])
        return svg_static_bundle(data)

    def _replay_stood(self) -> Sample | None:
        """The reading the replay stood at: the last one played, the recording's end once
        it has ended (or its first before any has played)."""
        recording = getattr(self.replay.source if self.replay else None, "recording", None)
        if self._replay_ended() or not recording:
            return self._recording_end()
        return self.feed.latest() or recording[0]

    def _stood_s(self) -> float | None:
        """Seconds into the recording where the replay stood; None once it has ended."""
        if self.replay is None or self._replay_ended():
            return None
        return self.series.played_s or 0.0

    def _stood_text(self) -> str:
        recording = getattr(self.replay.source if self.replay else None, "recording", None)
        if not recording:
            return ""
        span_s = recording[-1].t_s - recording[0].t_s
        at = self._stood_s()
        if at is None:
            return f"REPLAY: the table is the recording's end, {span_s:.1f} s into it."
        return (f"REPLAY: the table is where the replay stood, {at:.1f} s into the "
                f"{span_s:.1f} s recording (the picture's mark \"replay here\").")

    def _recording_end(self) -> Sample | None:
        recording = getattr(self.replay.source if self.replay else None, "recording", None)
        return recording[-1] if recording else None

    def _recording_timeline(self) -> tuple[Timeline | None, float]:
        recording = getattr(self.replay.source if self.replay else None, "recording", None)
        if not recording:
            return self._timeline(), self._t0_s
        return self.series.recording_timeline(recording, self.device), recording[0].t_s
