"""``%gpumem watch --compact``: the one-line-per-GPU reading, live, with its static fallback.

It reads the live sampler (never a replay: it is this machine's reading) and sends one small
update at most every ``COMPACT_EVERY_S``, only when a formatted figure changed. It is shown as
the chart is: the widget's output, then a static output that the page hides while the widget
shows (``ChartPicture``), which follows the cells and replaces the widget when it ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..model import CellRecord, Sample, Verdict
from .compact import SparkHistory, compact_html, compact_lines, compact_text
from .livechart import CompactReading
from .picture import WIDGET_VIEW, ChartPicture

__all__ = ["COMPACT_EVERY_S", "CompactView"]

# The reading changes at most this often: a line a second is easy to read, and cheap to send.
COMPACT_EVERY_S = 1.0


class CompactView:
    def __init__(self, monitor: Any) -> None:
        self.monitor = monitor
        self.feed = monitor.sampler
        self.spark = SparkHistory()
        for s in self.feed.samples():  # the readings before it was shown
            self.spark.add(s)
        self._lock = threading.RLock()
        self._sent_at_s = float("-inf")
        self._closed = False
        self.updates = 0
        self.widget = CompactReading(lines=self._lines_json())
        self.picture = ChartPicture(self.plain_bundle, self._lock)
        self.feed.add_listener(self._on_sample)
        monitor.on_record.append(self._on_record)

    def _latest(self) -> Sample | None:
        return self.feed.latest() or self.monitor.read()

    def _last(self) -> CellRecord | None:
        last: CellRecord | None = self.monitor.history.last()
        return last

    def _lines_json(self) -> list[dict[str, Any]]:
        return [ln.as_json() for ln in compact_lines(self._latest(), self.spark, self._last())]

    def _on_sample(self, sample: Sample) -> None:
        """Sampler thread: remember the reading; send at most every COMPACT_EVERY_S."""
        self.spark.add(sample)
        if time.monotonic() - self._sent_at_s >= COMPACT_EVERY_S:
            self.update()
        self.picture.catch_up()

    def _on_record(self, record: CellRecord, verdict: Verdict | None) -> None:
        self.update()  # the last cell's delta, at once

    def update(self) -> bool:
        """Send the lines if a figure changed; True when something was sent."""
        with self._lock:
            if self._closed:
                return False
            self._sent_at_s = time.monotonic()
            lines = self._lines_json()
            if lines == self.widget.lines:
                return False
            self.widget.lines = lines
            self.updates += 1
            return True

    def plain_bundle(self) -> dict[str, str]:
        lines = compact_lines(self._latest(), self.spark, self._last())
        return {"text/plain": compact_text(lines), "text/html": compact_html(lines)}

    def display(self, show: Callable[..., Any], shell: object) -> None:
        got: Any = self.widget._repr_mimebundle_()
        data: dict[str, Any] = got[0] if isinstance(got, tuple) else dict(got or {})
        view = {k: v for k, v in data.items() if k == WIDGET_VIEW}
        view["text/html"] = ""
        self.picture.show(view, show, shell)

    def close(self, *, kernel_exiting: bool = False) -> None:
        """End it: its outputs become the static reading, then the widget closes."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.picture.ended = True
        self.feed.remove_listener(self._on_sample)
        if self._on_record in self.monitor.on_record:
            self.monitor.on_record.remove(self._on_record)
        try:
            self.picture.end()
        finally:
            if not kernel_exiting:
                self.widget.close()
