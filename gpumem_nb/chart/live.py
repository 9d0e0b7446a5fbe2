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

import dataclasses
import html
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import ipywidgets as widgets

from ..analysis import held_text
from ..cleanup import CleanupReport, CleanupRequest
from ..model import CellMark, CellRecord, Sample, SourceStatus, Verdict
from ..records import History, format_peak
from ..sampler import Sampler
from ..settings import Config
from ..svgchart import SeriesStyle, chart_data, mark_label
from ..svgchart import static_bundle as svg_static_bundle
from ..timeline import ALL_DEVICES, GIB, SERIES, Timeline
from ..units import format_bytes, shown_name
from ..views import Snapshot, children_html, device_row
from .livechart import LiveChart
from .messages import CleanupAsked, DeviceAsked, done, read_request
from .picture import HEADER_NO_LIVE, WIDGET_VIEW, ChartPicture
from .series import ChartSeries, device_key, points

__all__ = ["ChartHost", "MemoryWidget", "show"]


class ChartReplay(Protocol):
    label: str
    source: Any
    sampler: Sampler


class ChartHost(Protocol):
    """What the chart needs from the monitor, and nothing more."""

    config: Config
    started_t_s: float
    widget: Any

    @property
    def marks(self) -> Any: ...  # a deque of CellMark
    @property
    def on_record(self) -> list[Callable[[CellRecord, Verdict | None], None]]: ...
    @property
    def settings_listeners(self) -> list[Callable[[Config], None]]: ...
    @property
    def history(self) -> History: ...
    @property
    def feed(self) -> Sampler: ...
    @property
    def replay(self) -> ChartReplay | None: ...
    @property
    def cell_running(self) -> bool: ...
    @property
    def after_cell(self) -> list[Callable[[], None]]: ...
    def gpu_count(self) -> int: ...
    def read(self) -> Sample: ...
    def marks_for_picture(self, last: int) -> list[CellMark]: ...
    def cleanup(self, request: CleanupRequest,
                on_interrupt: Callable[[CleanupReport], None] | None = None,
                ) -> CleanupReport: ...
    def configure(self, *, device: Any = ...) -> Config: ...


# Cell labels closer than this fraction of the visible time span are thinned out in the static
# picture; the live front end thins by pixels.
MAX_MARKS = 100
# The long, downsampled history is resent only every HISTORY_REFRESH_S; each tick resends just
# the points since then, so live traffic stays at a few KB/s however long the session.
HISTORY_REFRESH_S = 10.0
# Per series: about two points per pixel of a wide chart, with every bucket's minimum and
# maximum kept (timeline.keep_peaks), and few enough that a saved chart stays small.
HISTORY_POINTS = 1200
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
REPLAY_MARK = "replay here"  # where a replay that has not ended stood, on its picture
MAX_TITLE_NAMES = 4  # the GPU names the picture's title lists, each cut (units.shown_name)


class MemoryWidget:
    """The live view: the ipywidgets box around the anywidget chart, its one writer (the
    sampler thread draws; everything else enqueues), and the controls' requests. Its data is
    ``series`` (``ChartSeries``) and its outputs ``picture`` (``ChartPicture``). Shown with
    ``display`` and ended with ``close``, each safe to call again, under one lock."""

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

    @property
    def _t0_s(self) -> float:
        # A replay's timeline holds the recording's own points at their times into it.
        return self.t0_s if self.replay is None else 0.0

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

    def _timeline(self) -> Timeline | None:
        return self.series.timeline(self.device)

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

    def _marks(self, t0: float) -> list[list[Any]]:
        if self.replay is not None:
            return []
        marks: list[CellMark] = list(self.monitor.marks)[-MAX_MARKS:]
        return [[round(m.t_s - t0, 3), mark_label(m)] for m in marks]

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

    def _devices_shown(self, sample: Sample | None) -> list[Any]:
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
    def _on_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
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

    def _on_pause(self, change: dict[str, Any]) -> None:
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

    def display(self, show: Callable[..., Any], shell: Any) -> None:
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

