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

import contextlib
import html
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import ipywidgets as widgets

from .analysis import held_text
from .cleanup import CleanupReport, CleanupRequest
from .livechart import LiveChart, SeriesSpec
from .model import CellMark, CellRecord, Sample, SourceStatus, Verdict
from .records import History, format_peak
from .sampler import Sampler
from .settings import Config
from .svgchart import LEGEND_ORDER, STYLES, SeriesStyle, chart_data, mark_label
from .svgchart import static_bundle as svg_static_bundle
from .timeline import ALL_DEVICES, GIB, SERIES, Timeline, values_of
from .units import format_bytes, shown_name
from .views import Snapshot, children_html, device_row


class ChartReplay(Protocol):
    label: str
    source: Any
    sampler: Sampler


class ChartHost(Protocol):
    """What the chart needs from the monitor, and nothing more."""

    config: Config
    marks: Any  # a deque of CellMark
    on_record: list[Callable[[CellRecord, Verdict | None], None]]
    settings_listeners: list[Callable[[Config], None]]
    started_t_s: float
    widget: Any

    @property
    def history(self) -> History: ...
    @property
    def feed(self) -> Sampler: ...
    @property
    def replay(self) -> ChartReplay | None: ...
    @property
    def cell_running(self) -> bool: ...
    after_cell: list[Callable[[], None]]
    def gpu_count(self) -> int: ...
    def read(self) -> Sample: ...
    def marks_for_picture(self, last: int) -> list[CellMark]: ...
    def cleanup(self, request: CleanupRequest,
                on_interrupt: Callable[[CleanupReport], None] | None = None,
                ) -> CleanupReport: ...
    def configure(self, *, device: Any = ...) -> Config: ...


# Drawn in this order, so later lines sit on top: wide lines underneath, and NVML's whole-GPU
# line last and dashed, so where it equals "this process" both stay visible. Names and colours
# are the static picture's (svgchart.STYLES).
DRAW_ORDER = ("rss", "reserved", "allocated", "process", "nvml_used")
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
# The cluster's lines (issue 19), dotted, in colours the chart's own series do not use.
CLUSTER_COLORS = ("#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#393b79")
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
MAX_TITLE_NAMES = 4  # the GPU names the picture's title lists, each cut (units.shown_name)
# At most one redraw of the picture per this many seconds on a cell's end (the main thread).
PICTURE_EVERY_S = 1.0
_log = logging.getLogger(__name__)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# The chart's picture is an output of its own, after the live view's (``display``): where a
# notebook holds widget state, nbconvert's HTML writes only the widget's script for an output
# that has a widget view and drops the rest of its bundle (``WidgetsDataTypeFilter``), so a
# picture beside the view would show nowhere offline. This rule, in the picture's own HTML,
# hides it wherever the output before it shows the chart: the live view (livechart.js's
# ``.gpumem-live``) or the picture the page saved in its place (``.gpumem-saved``), in
# JupyterLab, Notebook 7 and nbconvert's lab and classic HTML, whose outputs are siblings of
# these classes. Where that output shows nothing (offline, untrusted, no widget manager), no
# rule matches and the picture shows.
PICTURE_CLASS = "gpumem-picture"
# The view's output when the chart ends and its picture cannot be drawn (``close``).
ENDED_UNDRAWN = "gpumem_nb chart (ended; its picture could not be drawn)"
_SHOWN = ":has(.gpumem-live,.gpumem-saved)"
PICTURE_STYLE = ("<style>" + ",".join(
    f"{c}{_SHOWN}+{c}:has(.{PICTURE_CLASS})" for c in (".jp-OutputArea-child", ".output_area"))
    + "{display:none}</style>")


@dataclass(frozen=True)
class _Extra:
    """A series another feature added: its style and how to read it from a sample."""

    style: SeriesStyle
    value: Callable[[Sample], float | None]  # bytes, None when unknown
    hidden: bool


def _spec(key: str, style: SeriesStyle, hidden: bool, legend: int) -> dict[str, Any]:
    return SeriesSpec(key=key, name=style.name, color=style.color, width=style.width_px,
                      dash=style.dash, hidden=hidden, legend=legend).as_json()


class MemoryWidget:
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
        self.timelines: dict[int, Timeline] = {}
        self.t0_s = monitor.started_t_s
        self.paused = False
        self._shown: Sample | None = None  # the reading the header shows (frozen while paused)
        self._paused_header: str | None = None
        self._played_s: float | None = None  # a replay: its last recorded point appended
        self._acks: list[str] = []  # requests handled, answered after the next draw
        self.draws = 0
        self._extra: dict[str, _Extra] = {}
        self._history_until_s: float | None = None
        self._cluster_keys: tuple[str, ...] = ()
        self._cluster_drawn: tuple[int, int, float] | None = None  # (feed, version, t0)
        self._inbox: deque[Callable[[], None]] = deque()
        self._draw_lock = threading.Lock()
        self._closed = False
        # Every display of this chart shares one id, so closing it replaces them all.
        self.display_id = f"gpumem-chart-{uuid.uuid4().hex}"
        # Set by ``display`` (``%gpumem watch``): the live view's output and the picture's,
        # so the picture can follow the chart and both can become the picture at its end.
        self.display_handle: Any = None
        self.picture_id = f"{self.display_id}-picture"
        self.picture_handle: Any = None
        self._picture_sent: dict[str, str] | None = None
        self._picture_at_s = float("-inf")  # when a cell's end last redrew the picture
        self._picture_dirty = False  # a cell ended since, within PICTURE_EVERY_S of that
        self._picture_lock = threading.Lock()  # the main thread's and the sampler's sends
        self._shell: Any = None  # whose post_run_cell refreshes the picture

        gpus = status.gpu_count
        # The device choices the chart offers (none with one GPU): (label, value) pairs.
        self.device_options: list[tuple[str, int]] = []
        if gpus > 1:
            self.device_options = [(f"GPU {i}", i) for i in range(gpus)]
            if self.replay is None:
                self.device_options.insert(0, ("all GPUs (sum)", ALL_DEVICES))

        self.chart = LiveChart(series=self._series_specs(), meta=self._meta(None))
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
                self._append(s)
        self.feed.add_listener(self._on_sample)
        monitor.on_record.append(self._on_record)
        monitor.settings_listeners.append(self._on_settings)
        self._draw(self.feed.latest())

    @property
    def _t0_s(self) -> float:
        # A replay's timeline holds the recording's own points at their times into it.
        return self.t0_s if self.replay is None else 0.0

    # -- series --------------------------------------------------------------------------------
    def _keys(self) -> list[str]:
        return [k for k in DRAW_ORDER if k != "rss" or not self.has_gpu] + list(self._extra)

    def _series_specs(self) -> list[dict[str, Any]]:
        # Drawn in DRAW_ORDER; listed in the legend in the picture's order (LEGEND_ORDER),
        # then the lines other features added.
        specs = [_spec(k, STYLES[k], hidden=False, legend=LEGEND_ORDER.index(k))
                 for k in DRAW_ORDER if k != "rss" or not self.has_gpu]
        if self.has_gpu:  # host RAM is one legend click away, not drawn by default
            specs.insert(0, _spec("rss", STYLES["rss"], hidden=True,
                                  legend=LEGEND_ORDER.index("rss")))
        n = len(LEGEND_ORDER)
        specs += [_spec(k, e.style, e.hidden, legend=n + i)
                  for i, (k, e) in enumerate(self._extra.items())]
        n += len(self._extra)
        specs += [_spec(name, SeriesStyle(name, CLUSTER_COLORS[i % len(CLUSTER_COLORS)], 1.5,
                                          "2 3"), hidden=False, legend=n + i)
                  for i, name in enumerate(self._cluster_keys)]
        return specs

    def add_series(self, key: str, style: SeriesStyle,
                   value: Callable[[Sample], float | None], *, hidden: bool = False) -> None:
        """Draw another line from now on: ``value(sample)`` gives its bytes (None when
        unknown) for each reading of the feed, whichever device is shown. Issue 19's cluster
        lines are one use. Safe from any thread: the sampler thread applies it."""
        if key in SERIES:
            raise ValueError(f"{key!r} is one of the chart's own series")

        def apply() -> None:
            self._extra[key] = _Extra(style, value, hidden)
            for tl in self.timelines.values():
                tl.add_series(key)
            self.chart.series = self._series_specs()
            self._history_until_s = None  # resend the history with the new series

        self._post(apply)

    def remove_series(self, key: str) -> None:
        def apply() -> None:
            if self._extra.pop(key, None) is not None:
                self.chart.series = self._series_specs()
                self._history_until_s = None

        self._post(apply)

    # -- the one writer ----------------------------------------------------------------------
    def _append(self, sample: Sample) -> None:
        indices = [d.index for d in sample.devices] or [0]
        if len(sample.devices) > 1:
            indices.append(ALL_DEVICES)
        extra = {k: _gib(e.value, sample) for k, e in self._extra.items()}
        for i in indices:
            tl = self.timelines.get(i)
            if tl is None:
                tl = self.timelines[i] = Timeline()
                for k in self._extra:
                    tl.add_series(k)
            if tl.n and sample.t_s <= tl.t[tl.n - 1]:
                continue  # a replay that has ended repeats its last reading
            tl.append(sample.t_s, {**values_of(sample, None if i == ALL_DEVICES else i),
                                   **extra})

    def _append_played(self) -> None:
        """A replay: every recorded point played since the last call, at its own time (a
        0.5 s sampler would miss the recording's 0.25 s spikes and draw them late)."""
        source = self.replay.source if self.replay is not None else None
        played = getattr(source, "played", None)
        if played is None:  # a source that plays no recording of its own
            latest = self.feed.latest()
            if latest is not None:
                self._append(latest)
            return
        points = played(self._played_s)
        for s in points:
            self._append(s)
        if points:
            self._played_s = points[-1].t_s

    def _on_sample(self, sample: Sample) -> None:
        """Sampler thread: record, then draw (paused: the header and controls only)."""
        if self.replay is not None:
            self._append_played()
        else:
            self._append(sample)
        self._draw(sample)
        if self._picture_dirty and self._shell is not None and \
                time.monotonic() - self._picture_at_s >= PICTURE_EVERY_S:
            self._send_picture()  # the cells that ended too soon after the last redraw

    def _drain(self) -> None:
        while self._inbox:
            self._inbox.popleft()()

    def _timeline(self) -> Timeline | None:
        tl = self.timelines.get(_key(self.device))
        if tl is None and len(self.timelines) == 1:
            tl = next(iter(self.timelines.values()))  # "all" of one GPU is that GPU
        return tl

    def _draw(self, sample: Sample | None) -> None:
        if self._closed:
            return
        with self._draw_lock:
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
        header = self._paused_header or self._header_html(sample)
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
        keys = [s["key"] for s in self.chart.series if s["key"] not in self._cluster_keys]
        # One message per tick: every changed trait together. A trait set to an equal
        # value sends nothing.
        with self.chart.hold_sync():
            if refresh:
                self.chart.history = {k: _points(tl, k, t0, HISTORY_POINTS, until_s=until)
                                      for k in keys}
            # The recent part starts at the history's last point, so they join.
            self.chart.recent = {k: _points(tl, k, t0, HISTORY_POINTS, since_s=until)
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
            self.chart.send({"kind": "done", "id": rid})

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
        if names != self._cluster_keys:
            self._cluster_keys = names
            self.chart.series = self._series_specs()
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
                "devices": [list(o) for o in self.device_options] or None,
                "device": _key(self.device)}

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
        """A request from the page: ``{"kind": "cleanup" | "device", "id": ..., "value": ...}``.
        Each is answered with ``{"kind": "done", "id": ...}`` once handled."""
        if not isinstance(content, dict):
            return
        rid = content.get("id")
        rid = rid if isinstance(rid, str) and 0 < len(rid) <= 64 else None
        kind = content.get("kind")
        if kind == "cleanup":
            self.request_cleanup(rid)
        elif kind == "device":
            self.choose_device(content.get("value"), rid)

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
        to date (``_after_cell``): what a notebook saved while the chart is live, by the page
        or by nbclient, shows in nbconvert's HTML offline. ``show`` is IPython's ``display``
        and ``shell`` the kernel's shell, both from the magics (the one module that imports
        IPython)."""
        view = {k: v for k, v in self.box._repr_mimebundle_().items() if k == WIDGET_VIEW}
        view["text/html"] = ""
        self.display_handle = show(view, raw=True, display_id=self.display_id)
        try:
            picture = self.picture_bundle()
        except Exception as e:  # the live chart still works: no traceback, no picture
            _log.warning("gpumem_nb: the chart's picture could not be drawn (%s); the live "
                         "chart shows, but a saved notebook's export will not", e)
            _log.debug("the picture's failure", exc_info=True)
            return
        self.picture_handle = show(picture, raw=True, display_id=self.picture_id)
        self._picture_sent = picture
        self._follow_cells(shell)

    def picture_bundle(self) -> dict[str, str]:
        """The picture's own output: the plain bundle, its HTML marked for ``PICTURE_STYLE``."""
        bundle = self.plain_bundle()
        bundle["text/html"] = (f"<div class='{PICTURE_CLASS}'>{PICTURE_STYLE}"
                               f"{bundle['text/html']}</div>")
        return bundle

    def _follow_cells(self, shell: Any) -> None:
        if self._shell is not None:
            return
        events = getattr(shell, "events", None)
        # Only in a kernel: a terminal's display updates would print the picture's text
        # after every cell.
        if events is None or getattr(shell, "kernel", None) is None:
            return
        events.register("post_run_cell", self._after_cell)
        self._shell = shell

    def _unfollow_cells(self) -> None:
        shell, self._shell = self._shell, None
        if shell is not None:
            with contextlib.suppress(ValueError):
                shell.events.unregister("post_run_cell", self._after_cell)

    def _after_cell(self, _result: Any = None) -> None:
        """At each cell's end, on the kernel's main thread, inside that cell's execution:
        nbclient (``jupyter nbconvert --execute``) keeps only the messages a cell sends
        before it is idle, and a page's save shows the picture as of the last cell. Sent
        only when the picture changed, and redrawn at most once per ``PICTURE_EVERY_S``
        here: drawing costs about 3 ms, thirty times the hooks' whole budget, so cells run
        back to back leave it to the sampler thread (``_on_sample``), after their reply."""
        if self.picture_handle is None or self._closed:
            return
        if time.monotonic() - self._picture_at_s < PICTURE_EVERY_S:
            self._picture_dirty = True
            return
        self._send_picture()

    def _send_picture(self) -> None:
        handle = self.picture_handle
        if handle is None or self._closed:
            return
        try:
            with self._picture_lock:
                self._picture_at_s, self._picture_dirty = time.monotonic(), False
                picture = self.picture_bundle()
                if picture != self._picture_sent:
                    handle.update(picture, raw=True)
                    self._picture_sent = picture
        except Exception as e:  # never a traceback under a cell: the picture stops following
            # A plain sentence: ipykernel prints a warning's traceback into the user's cell.
            _log.warning("gpumem_nb: the chart's picture stopped following the cells (%s)", e)
            _log.debug("the picture's failure", exc_info=True)
            self._unfollow_cells()

    def plain_bundle(self) -> dict[str, str]:
        """The chart without the widget: text, the picture (SVG) and the numbers."""
        # A replay's picture is its whole recording: its table is the recording's end, the
        # point the picture ends at, not wherever the playback happened to be (issue 27).
        end = self._recording_end() if self.replay is not None else None
        latest = end or self.feed.latest() or self.monitor.read()
        snap = Snapshot(status=self.status, sample=latest)
        static = self.static_bundle(latest)
        # The Clean up button's report stays with the picture: it was the user's only
        # account of what was freed, and ``watch --stop`` used to wipe it with the chart.
        report_html = self.report.value or ""
        report_text = f"\n{self._report_text}" if report_html and self._report_text else ""
        return {"text/plain": "gpumem_nb chart (a static picture; live with a kernel)\n"
                              + str(snap) + report_text,
                "text/html": static["text/html"] + snap._repr_html_() + report_html,
                "image/svg+xml": static["image/svg+xml"]}

    def static_bundle(self, sample: Sample | None) -> dict[str, str]:
        """The chart as a static SVG: ``image/svg+xml`` and an ``<img>`` for ``text/html``.
        A replay's picture is its whole recording: the story, however little has played."""
        with self._draw_lock:
            tl = self._timeline()
            marks = [] if self.replay is not None else self.monitor.marks_for_picture(MAX_MARKS)
            t0 = self._t0_s
            if self.replay is not None:
                tl, t0 = self._recording_timeline()
                # Named and totalled as the recording, not this machine: the picture plots
                # the recorded GPU's lines, as the live chart's header names it (issue 27).
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
        return svg_static_bundle(data)

    def _recording_end(self) -> Sample | None:
        recording = getattr(self.replay.source if self.replay else None, "recording", None)
        return recording[-1] if recording else None

    def _recording_timeline(self) -> tuple[Timeline | None, float]:
        recording = getattr(self.replay.source if self.replay else None, "recording", None)
        if not recording:
            return self._timeline(), self._t0_s
        tl = Timeline(capacity=max(len(recording), 16))
        dev = None if self.device is None else self.device
        for s in recording:
            tl.append(s.t_s, values_of(s, dev))
        return tl, recording[0].t_s

    def refresh_static(self) -> bool:
        """Update the displayed outputs' static picture to the chart as it is now, the chart
        staying live. Needs the handle ``%gpumem watch`` displayed the chart with."""
        self._draw(self.feed.latest())  # header and buttons land in the saved state too
        handle = self.picture_handle
        if handle is None:
            return False
        self._picture_sent = picture = self.picture_bundle()
        handle.update(picture, raw=True)
        return True

    def close(self, *, kernel_exiting: bool = False) -> None:
        """End the chart: every output showing it becomes its plain picture (see the module
        docstring), then every widget closes. Safe from any thread, more than once.

        ``kernel_exiting``: the kernel is shutting down or restarting. The widgets are left
        open then: a restarting JupyterLab has already dropped their comms, and a close
        message for each would log "Comm not found" in the browser console (23 per restart
        with plotly's chart); the kernel's exit closes them anyway."""
        with self._draw_lock:
            if self._closed:
                return
            self._closed = True
        self.feed.remove_listener(self._on_sample)
        if self._on_record in self.monitor.on_record:
            self.monitor.on_record.remove(self._on_record)
        if self._on_settings in self.monitor.settings_listeners:
            self.monitor.settings_listeners.remove(self._on_settings)
        self._unfollow_cells()
        handle, self.display_handle = self.display_handle, None
        picture, self.picture_handle = self.picture_handle, None
        try:
            try:
                plain: dict[str, str] | None = self.plain_bundle()
            except Exception as e:
                _log.warning("gpumem_nb: the chart's picture could not be drawn at its end "
                             "(%s); its last picture stays", e)
                _log.debug("the picture's failure", exc_info=True)
                plain = None
            # The picture's output empties first, so the two never show the picture at once;
            # the view's output becomes the picture, where the chart was. With no picture to
            # draw, the last one drawn stays and the view becomes a line of text: no widget
            # view left to read "model not found", and the rule no longer hides that picture.
            if picture is not None and plain is not None:
                picture.update({"text/html": ""}, raw=True)
            if handle is not None:
                handle.update(plain or {"text/plain": ENDED_UNDRAWN, "text/html": ""},
                              raw=True)
        finally:
            if not kernel_exiting:
                self._close_widgets()

    def _close_widgets(self) -> None:
        with self._draw_lock:
            # Every widget, not just the box: ipywidgets keeps each open widget in a global
            # registry, and the buttons' handlers would keep this chart and its monitor alive.
            _close_tree(self.box)


def _gib(value: Callable[[Sample], float | None], sample: Sample) -> float:
    v = value(sample)
    return float("nan") if v is None else v / GIB


def _points(tl: Timeline, key: str, t0: float, max_points: int, *,
            since_s: float | None = None, until_s: float | None = None) -> list[Any]:
    xs, ys = tl.arrays(key, t0, max_points, since_s=since_s, until_s=until_s).lists()
    return [xs, ys]


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


def _key(device: int | None) -> int:
    return ALL_DEVICES if device is None else device


def show(monitor: ChartHost) -> MemoryWidget:
    """The kernel's one chart, created on first use (the monitor drops it when the feed
    changes between live and a replay)."""
    if monitor.widget is None:
        monitor.widget = MemoryWidget(monitor)
    widget: MemoryWidget = monitor.widget
    return widget

