"""The live chart: NVML usage beside PyTorch's allocated and reserved, a mark at every cell.

The only module that imports ipywidgets (the header, banner and report); the chart and its
controls are ``LiveChart``, a small anywidget (livechart.py and livechart.js). One writer for
the UI: the sampler thread draws (``_on_sample``); cell hooks and the controls' requests only
enqueue work and ask for a tick, so a request arriving on a comm thread while a cell runs
(ipykernel 7's subshells) never races the drawing. Widget updates sent from that thread reach
the browser while a cell is still running, which is what keeps the chart live during a long
cell. The browser's own messages wait behind a running cell, so the controls answer in the
page first (Pause freezes the view, Clean up and the device say they are queued) and the
kernel acknowledges each request once it has handled it.

When the chart ends (``close``: a new feed, ``%reload_ext``, the kernel shutting down or
restarting), every output that showed it is replaced, by display_id, with the plain picture
and table: a notebook saved after that opens with the picture, never "Error displaying
widget: model not found", in JupyterLab, Notebook 7, nbconvert and GitHub alike.
"""

from __future__ import annotations

import html
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as widgets

from ..analysis import held_text
from ..cleanupreport import CleanupReport, CleanupRequest
from ..model import CellMark, CellRecord, Sample, SourceStatus, Verdict
from ..settings import Config
from ..svgchart.data import SeriesStyle, mark_label
from ..timeline import ALL_DEVICES, SERIES, Timeline
from ..units import format_bytes
from .header import BANNER_STYLE
from .host import ChartHost
from .livechart import LiveChart
from .messages import CleanupAsked, DeviceAsked, done, read_request
from .picture import HEADER_NO_LIVE, WIDGET_VIEW, ChartPicture
from .series import ChartSeries, points
from .still import MAX_MARKS, ChartStill

__all__ = ["MemoryWidget", "show"]

# The long, downsampled history is resent only every HISTORY_REFRESH_S; each tick resends just
# the points since then, so live traffic stays at a few KB/s however long the session.
HISTORY_REFRESH_S = 10.0
# Per series: about two points per pixel of a wide chart, with every bucket's minimum and
# maximum kept (timeline.keep_peaks), and few enough that a saved chart stays small.
HISTORY_POINTS = 1200


class MemoryWidget(ChartStill):
    """The live view: the ipywidgets box around the anywidget chart, its one writer (the
    sampler thread draws; everything else enqueues), and the controls' requests. Its data is
    ``series`` (``ChartSeries``) and its outputs ``picture`` (``ChartPicture``). Shown with
    ``display`` and ended with ``close``, each safe to call again, under one lock. Its words
    are read in ``ChartHeader`` (``header``), its still picture drawn in ``ChartStill``
    (``still``)."""

    def __init__(self, monitor: ChartHost) -> None:
        self.monitor = monitor
        # The chart draws one feed for its life: the live sampler, or a replay's own sampler
        # (the monitor makes a new chart when that changes). A replay never shows the user's
        # cell marks or history, and says on screen that it is one.
        self.replay = monitor.replay
        self.feed = monitor.feed
        self.status: SourceStatus = self.feed.source.status()
        status = self.status
        self.has_gpu = status.has_gpu
        self.device: int | None = None if self.replay is not None else monitor.config.device
        if self.replay is not None and status.gpu_count:
            self.device = 0
        self.series = ChartSeries(self.has_gpu)
        self.t0_s = monitor.started_t_s
        self.paused = False
        self._shown: Sample | None = None  # the reading the header shows (frozen while paused)
        self._paused_header: str | None = None
        self._acks: list[str] = []  # requests handled, answered after the next draw
        self.draws = 0
        self._history_until_s: float | None = None
        self._cluster_drawn: tuple[int, int, float] | None = None  # (feed, version, t0)
        self._inbox: deque[Callable[[], None]] = deque()
        # The one lock: the sampler thread's draws, the picture's sends from either thread,
        # and the end of the chart. Reentrant: a picture sent under it draws the chart's
        # static picture, which takes it too.
        self._lock = threading.RLock()
        self._closed = False
        # Late-bound: the picture is whatever ``plain_bundle`` draws at the time.
        self.picture = ChartPicture(lambda: self.plain_bundle(), self._lock)

        gpus = status.gpu_count
        # The device choices the chart offers (none with one GPU): (label, value) pairs.
        self.device_options: list[tuple[str, int]] = []
        if gpus > 1:
            self.device_options = [(f"GPU {i}", i) for i in range(gpus)]
            if self.replay is None:
                self.device_options.insert(0, ("all GPUs (sum)", ALL_DEVICES))

        self.chart = LiveChart(series=self.series.specs(), meta=self._meta(None))
        self.chart.observe(self._on_pause, names="paused")
        self.chart.on_msg(self._on_message)
        self.header = widgets.HTML()
        self.banner = widgets.HTML(layout=widgets.Layout(display="none"))
        self.report = widgets.HTML()
        self._report_text = ""  # the last cleanup report as text, for the picture
        self.box = widgets.VBox([self.header, self.banner, self.chart, self.report])
        self.chart.parts = {"box": self.box.model_id, "header": self.header.model_id,
                            "banner": self.banner.model_id}

        if self.replay is not None:
            self._append_played()
        else:
            for s in self.feed.samples():  # what happened before the chart was shown
                self.series.append(s)
        self.feed.add_listener(self._on_sample)
        monitor.on_record.append(self._on_record)
        monitor.settings_listeners.append(self._on_settings)
        self._draw(self.feed.latest())

    # -- series --------------------------------------------------------------------------------
    @property
    def timelines(self) -> dict[int, Timeline]:
        return self.series.timelines

    def add_series(self, key: str, style: SeriesStyle,
                   value: Callable[[Sample], float | None], *, hidden: bool = False) -> None:
        """Draw another line from now on: ``value(sample)`` gives its bytes (None when
        unknown) for each reading of the feed, whichever device is shown. The cluster's lines
        are one use. Safe from any thread: the sampler thread applies it."""
        if key in SERIES:
            raise ValueError(f"{key!r} is one of the chart's own series")

        def apply() -> None:
            self.series.add(key, style, value, hidden)
            self.chart.series = self.series.specs()
            self._history_until_s = None  # resend the history with the new series

        self._post(apply)

    def remove_series(self, key: str) -> None:
        def apply() -> None:
            if self.series.remove(key):
                self.chart.series = self.series.specs()
                self._history_until_s = None

        self._post(apply)

    # -- the one writer ----------------------------------------------------------------------
    def _append_played(self) -> None:
        source = self.replay.source if self.replay is not None else None
        self.series.append_played(source, self.feed.latest)

    def _on_sample(self, sample: Sample) -> None:
        """Sampler thread: record, then draw (paused: the header and controls only)."""
        if self.replay is not None:
            self._append_played()
        else:
            self.series.append(sample)
        self._draw(sample)
        self.picture.catch_up()

    def _drain(self) -> None:
        while self._inbox:
            self._inbox.popleft()()

    def _draw(self, sample: Sample | None) -> None:
        if self._closed:
            return
        with self._lock:
            if self._closed:
                return
            self._drain()
            try:
                self._draw_locked(sample)
            finally:
                self._send_acks()

    def _draw_locked(self, sample: Sample | None) -> None:
        if self.paused and self._shown is not None:
            sample = self._shown  # the numbers as they were when the chart paused
        else:
            self._shown = sample
        if not self.paused:
            self._paused_header = None
        elif self._paused_header is None:  # the header holds still with the lines
            self._paused_header = self._header_html(sample)
        header = HEADER_NO_LIVE + (self._paused_header or self._header_html(sample))
        if header != self.header.value:
            self.header.value = header
        meta = self._meta(sample)
        tl = self._timeline()
        if self.paused or tl is None or tl.n == 0:
            # The lines hold still; the controls still learn that a cell started or ended.
            self.chart.meta = meta
            return
        now = float(tl.t[tl.n - 1])
        until = self._history_until_s
        refresh = until is None or now - until >= HISTORY_REFRESH_S
        if refresh:
            until = self._history_until_s = now
        t0 = self._t0_s
        keys = [s["key"] for s in self.chart.series if s["key"] not in self.series.cluster_keys]
        # One message per tick: every changed trait together. A trait set to an equal
        # value sends nothing.
        with self.chart.hold_sync():
            if refresh:
                self.chart.history = {k: points(tl, k, t0, HISTORY_POINTS, until_s=until)
                                      for k in keys}
            # The recent part starts at the history's last point, so they join.
            self.chart.recent = {k: points(tl, k, t0, HISTORY_POINTS, since_s=until)
                                 for k in keys}
            self.chart.marks = self._marks(t0)
            self.chart.meta = meta
            self._draw_cluster(t0)
        self.draws += 1

    def _send_acks(self) -> None:
        """Tell the page which requests are handled, after the draw that shows their effect
        (the device's lines, the cleanup's report), so it never shows the old state again."""
        acks, self._acks = self._acks, []
        for rid in acks:
            self.chart.send(done(rid))

    def _draw_cluster(self, t0: float) -> None:
        """``%gpumem watch --cluster``: the feed's named per-GPU lines, dotted, each its own
        series (added the first time a GPU shows up; the feed keeps their length bounded).
        They travel in ``extra``, resent only when the feed has new points."""
        feed = getattr(self.monitor, "cluster_feed", None)
        if feed is None or self.replay is not None:
            return
        drawn = (id(feed), feed.version, t0)
        if drawn == self._cluster_drawn:
            return  # no collection since the last draw: nothing to build or compare
        self._cluster_drawn = drawn
        lines = feed.series(t0)
        names = tuple(lines)
        if names != self.series.cluster_keys:
            self.series.cluster_keys = names
            self.chart.series = self.series.specs()
        self.chart.extra = {name: [xs, ys] for name, (xs, ys) in lines.items()}

    def _marks(self, t0: float) -> list[list[float | str]]:
        if self.replay is not None:
            return []
        marks: list[CellMark] = list(self.monitor.marks)[-MAX_MARKS:]
        return [[round(m.t_s - t0, 3), mark_label(m)] for m in marks]


    # -- producers: enqueue, never draw ------------------------------------------------------
    def _post(self, fn: Callable[[], None]) -> None:
        self._inbox.append(fn)
        if self.feed.running:
            self.feed.request_tick()
        else:
            self._draw(self.feed.latest())

    def _on_record(self, record: CellRecord, verdict: Verdict | None) -> None:
        if verdict is not None:
            self._post(lambda: self._show_banner(verdict))

    def _show_banner(self, v: Verdict) -> None:
        holders = "".join(
            f"<li><code>{html.escape(h.name)}</code>: {html.escape(held_text(h))} "
            f"({html.escape(h.kind)})</li>" for h in v.holders)
        label = f"[{v.execution_count}]" if v.execution_count is not None else v.cell_key
        self.banner.value = (
            f"<div class='gpumem-banner' style='{BANNER_STYLE}'>"
            f"<b>Cell {html.escape(label)} keeps growing</b>: "
            f"+{format_bytes(v.growth_bytes)} on run {v.runs}, <b>{html.escape(v.cause)}</b>."
            f"<div>{html.escape(v.message)}</div>"
            + (f"<ul style='margin:2px 0'>{holders}</ul>" if holders else "") + "</div>")
        self.banner.layout.display = "block"

    # -- the controls' requests (livechart.js) ------------------------------------------------
    def _on_message(self, _widget: object, content: object, _buffers: object) -> None:
        """A request from the page (``messages.py``), answered with ``done`` once handled."""
        request = read_request(content)
        if isinstance(request, CleanupAsked):
            self.request_cleanup(request.id)
        elif isinstance(request, DeviceAsked):
            self.choose_device(request.value, request.id)

    def _ack(self, rid: str | None) -> None:
        """Producer side: answer ``rid`` after the next draw."""
        if rid is not None:
            self._post(lambda: self._acks.append(rid))

    def request_cleanup(self, rid: str | None = None) -> None:
        """The Clean up button. A request that reaches the kernel while a cell runs (with
        ipykernel's subshells; otherwise it waits for the cell like every message) runs when
        that cell ends, as the page says."""
        if self.monitor.cell_running:
            self.monitor.after_cell.append(lambda: self._cleanup_now(rid))
            return
        self._cleanup_now(rid)

    def _cleanup_now(self, rid: str | None) -> None:
        try:
            # A Ctrl-C shows what was done until then, and goes on: the page's button still
            # stops waiting.
            report = self.monitor.cleanup(CleanupRequest(), on_interrupt=self._show_report)
        except (RuntimeError, ValueError) as e:
            text = f"<i>{html.escape(str(e))}</i>"
            self._post(lambda: setattr(self.report, "value", text))
        else:
            self._show_report(report)
        finally:
            self._ack(rid)

    def _show_report(self, report: CleanupReport) -> None:
        page = report._repr_html_()
        self._report_text = str(report)
        self._post(lambda: setattr(self.report, "value", page))

    def _on_pause(self, change: Mapping[str, object]) -> None:
        """The page froze its view already; the kernel stops sending the lines, and the
        header says so."""
        self.paused = bool(change["new"])
        self._post(lambda: None)  # a draw: the header's "(paused)", the controls' state

    def choose_device(self, value: Any, rid: str | None = None) -> None:
        """The device selector asks the monitor, the one owner of the setting; the chart
        follows through ``_on_settings`` like it does for ``%gpumem config --device``. A
        replay's selector only picks which recorded GPU to show."""
        if not any(value == v and type(value) is int for _, v in self.device_options):
            self._ack(rid)  # not one of the choices offered: nothing changes
            return
        device = None if value == ALL_DEVICES else int(value)
        if self.replay is not None:
            self._post(lambda: self._switch(device))
        elif device != self.monitor.config.device:
            try:
                self.monitor.configure(device=device)
            except ValueError as e:
                text = f"<i>{html.escape(str(e))}</i>"
                self._post(lambda: setattr(self.report, "value", text))
        self._ack(rid)

    def _on_settings(self, config: Config) -> None:
        if self.replay is None and config.device != self.device:
            self._post(lambda: self._switch(config.device))

    def _switch(self, device: int | None) -> None:
        self.device = device
        self._history_until_s = None  # the other device's history, in full

    # -- display and lifecycle ---------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """The widget view, plus the static picture of the chart as it is now and the numbers'
        table: what a frontend without the widget's JavaScript shows (an untrusted notebook,
        GitHub), and what replaces the view when the chart ends (``close``)."""
        bundle = dict(self.box._repr_mimebundle_(**kwargs) or {})
        bundle.update(self.plain_bundle())
        return bundle

    def display(self, show: Callable[..., Any], shell: object) -> None:
        """Show the chart as two outputs: the live view (with an empty ``text/html``, so a
        frontend that cannot draw it shows nothing there), then its picture, which the page
        hides while the view shows (``PICTURE_STYLE``) and which every cell's end brings up
        to date (``ChartPicture.after_cell``): what a notebook saved while the chart is live,
        by the page or by nbclient, shows in nbconvert's HTML offline. ``show`` is IPython's
        ``display`` and ``shell`` the kernel's shell, both from the IPython layer (the only
        one that imports IPython)."""
        view = {k: v for k, v in self.box._repr_mimebundle_().items() if k == WIDGET_VIEW}
        view["text/html"] = ""
        self.picture.show(view, show, shell)

    def picture_bundle(self) -> dict[str, str]:
        """The picture's own output: the plain bundle, its HTML marked for ``PICTURE_STYLE``."""
        return self.picture.bundle()

    @property
    def display_id(self) -> str:
        return self.picture.display_id

    @property
    def picture_id(self) -> str:
        return self.picture.picture_id

    @property
    def display_handle(self) -> Any:
        return self.picture.display_handle

    @display_handle.setter
    def display_handle(self, handle: Any) -> None:
        self.picture.display_handle = handle

    @property
    def picture_handle(self) -> Any:
        return self.picture.picture_handle

    @picture_handle.setter
    def picture_handle(self, handle: Any) -> None:
        self.picture.picture_handle = handle

    def refresh_static(self) -> bool:
        """Update the displayed outputs' static picture to the chart as it is now, the chart
        staying live. Needs the handle ``%gpumem watch`` displayed the chart with."""
        self._draw(self.feed.latest())  # header and buttons land in the saved state too
        return self.picture.refresh()

    def close(self, *, kernel_exiting: bool = False) -> None:
        """End the chart: every output showing it becomes its plain picture (see the module
        docstring), then every widget closes. Safe from any thread, more than once.

        ``kernel_exiting``: the kernel is shutting down or restarting. The widgets are left
        open then: a restarting JupyterLab has already dropped their comms, and a close
        message for each would log "Comm not found" in the browser console (23 per restart
        with plotly's chart); the kernel's exit closes them anyway."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.picture.ended = True
        self.feed.remove_listener(self._on_sample)
        if self._on_record in self.monitor.on_record:
            self.monitor.on_record.remove(self._on_record)
        if self._on_settings in self.monitor.settings_listeners:
            self.monitor.settings_listeners.remove(self._on_settings)
        try:
            self.picture.end()
        finally:
            if not kernel_exiting:
                self._close_widgets()

    def _close_widgets(self) -> None:
        with self._lock:
            # Every widget, not just the box: ipywidgets keeps each open widget in a global
            # registry, and the buttons' handlers would keep this chart and its monitor alive.
            _close_tree(self.box)


def _close_tree(w: Any) -> None:
    """Close a widget, its children, and the layout and style widgets each one owns (those
    are registered widgets too, and nothing else closes them)."""
    for child in getattr(w, "children", ()):
        _close_tree(child)
    for part in ("layout", "style"):
        owned = getattr(w, part, None)
        if isinstance(owned, widgets.Widget):
            owned.close()
    w.close()


def show(monitor: ChartHost) -> MemoryWidget:
    """The kernel's one chart, created on first use (the monitor drops it when the feed
    changes between live and a replay)."""
    if monitor.widget is None:
        monitor.widget = MemoryWidget(monitor)
    widget: MemoryWidget = monitor.widget
    return widget
