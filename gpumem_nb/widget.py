"""The live chart: NVML usage beside PyTorch's allocated and reserved, a mark at every cell.

The only module that imports ipywidgets and plotly. One writer for the UI: the sampler thread
draws (``_on_sample``); cell hooks and button clicks only enqueue work and ask for a tick, so
a click arriving on a comm thread while a cell runs (JupyterLab >= 4.4 with ipykernel 7's
subshells) never races the drawing. Widget updates sent from that thread reach the browser
while a cell is still running, which is what keeps the chart live during a long cell.

One widget per kernel: a plotly FigureWidget carries a 5 MB script per instance, so
``%gpumem watch`` displays the same instance again.
"""

from __future__ import annotations

import html
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import ipywidgets as widgets
import plotly.graph_objects as go

from .analysis import held_text
from .cleanup import CleanupReport, CleanupRequest
from .model import CellMark, CellRecord, Sample, SourceStatus, Verdict
from .records import History, format_peak
from .sampler import Sampler
from .settings import Config
from .svgchart import chart_data, thin_labels
from .svgchart import static_bundle as svg_static_bundle
from .timeline import (
    ALL_DEVICES,
    GIB,
    MAX_POINTS,
    SERIES,
    Arrays,
    Timeline,
    mark_arrays,
    values_of,
)
from .units import format_bytes
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
    def gpu_count(self) -> int: ...
    def read(self) -> Sample: ...
    def cleanup(self, request: CleanupRequest) -> CleanupReport: ...
    def configure(self, *, device: Any = ...) -> Config: ...


# Drawn in this order, so later lines sit on top. "NVML used" is a dashed line above the
# solid "this process" line: on a GPU this process has to itself the two are equal, and the
# dashes let both show.
_TRACES = {
    "process": ("this process (NVML)", "#9467bd"),
    "reserved": ("reserved (PyTorch cache)", "#ff7f0e"),
    "allocated": ("allocated (live tensors)", "#1f77b4"),
    "rss": ("host RAM (RSS)", "#2ca02c"),
    "nvml_used": ("NVML used (whole GPU)", "#555555"),
}
_ORDER = tuple(_TRACES)
_STYLE: dict[str, dict[str, Any]] = {
    "process": {"width": 4}, "nvml_used": {"width": 1.5, "dash": "dash"}}
# Cell labels closer than this fraction of the visible time span are thinned out (the newest
# wins), so a long session's labels stay readable.
LABEL_MIN_GAP = 1 / 14
# Trace layout: one "history" and one "recent" trace per series, then cell marks and labels.
_RECENT = len(SERIES)
_MARKS, _LABELS = 2 * len(SERIES), 2 * len(SERIES) + 1
MAX_MARKS = 100
# FigureWidget resends whole arrays on every change. The long, downsampled history is resent
# only every HISTORY_REFRESH_S; each tick resends just the few points since then. At the
# default 0.5 s interval that keeps comm traffic around a few KB/s even for a busy GPU.
HISTORY_REFRESH_S = 10.0
HISTORY_POINTS = MAX_POINTS - 200
_HEADER = ("GPU", "used / total", "this process", "reserved", "allocated", "last cell peak",
           "outside PyTorch")


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
        self.draws = 0
        self._sent: dict[int, Arrays] = {}
        self._history_until_s: float | None = None
        self._marks_sent: tuple[Any, ...] = ()
        self._cluster_traces: dict[str, Any] = {}
        self._inbox: deque[Callable[[], None]] = deque()
        self._draw_lock = threading.Lock()
        self._closed = False
        # Set by ``%gpumem watch``: the display it made, so the static picture can follow.
        self.display_handle: Any = None

        def series(k: str, recent: bool) -> go.Scatter:
            return go.Scatter(
                x=[], y=[], name=_TRACES[k][0], mode="lines", legendgroup=k,
                showlegend=not recent,
                line={"color": _TRACES[k][1], "width": 2, "shape": "hv", **_STYLE.get(k, {})},
                hovertemplate="%{y:.2f} GiB<extra>" + _TRACES[k][0] + "</extra>",
                visible=True if (k != "rss" or not self.has_gpu) else "legendonly")

        self.fig = go.FigureWidget(
            data=[series(k, False) for k in _ORDER] + [series(k, True) for k in _ORDER]
            + [go.Scatter(x=[], y=[], name="cells", mode="lines", hoverinfo="skip",
                          line={"color": "rgba(0,0,0,0.25)", "width": 1, "dash": "dot"},
                          showlegend=False),
               go.Scatter(x=[], y=[], text=[], mode="text", textposition="top center",
                          name="cell", showlegend=False, textfont={"size": 10},
                          cliponaxis=False,
                          hovertemplate="cell %{text}<extra></extra>")],
            layout=go.Layout(
                height=380, margin={"l": 50, "r": 20, "t": 34, "b": 40},
                xaxis={"title": {"text": "seconds since %load_ext gpumem_nb"
                                 if self.replay is None else "seconds into the recording"}},
                yaxis={"title": {"text": "GiB"}, "rangemode": "tozero"},
                legend={"orientation": "h", "y": -0.22, "x": 0},
                hovermode="x unified", template="plotly_white",
            ),
        )
        self.header = widgets.HTML()
        self.banner = widgets.HTML(layout=widgets.Layout(display="none"))
        self.report = widgets.HTML()
        self.cleanup_button = widgets.Button(
            description="Clean up", icon="broom", layout=widgets.Layout(width="auto"),
            tooltip="Drop the stored exception, gc.collect(), empty_cache(); never deletes "
                    "your variables")
        self.cleanup_button.on_click(self._on_cleanup_click)
        self.pause_button = widgets.ToggleButton(description="Pause", icon="pause")
        self.pause_button.observe(self._on_pause, names="value")
        gpus = status.gpu_count
        options: list[tuple[str, int]] = [(f"GPU {i}", i) for i in range(max(gpus, 1))]
        if gpus > 1 and self.replay is None:
            options.insert(0, ("all GPUs (sum)", ALL_DEVICES))
        self.selector = widgets.Dropdown(
            options=options, value=_key(self.device) if gpus > 1 else 0,
            description="device", layout=widgets.Layout(
                width="230px", display="flex" if gpus > 1 else "none"))
        self.selector.observe(self._on_select, names="value")
        controls = widgets.HBox([self.selector, self.pause_button, self.cleanup_button])
        self.box = widgets.VBox([self.header, self.banner, self.fig, controls, self.report])

        for s in self.feed.samples():  # what happened before the chart was shown
            self._append(s)
        self.feed.add_listener(self._on_sample)
        monitor.on_record.append(self._on_record)
        monitor.settings_listeners.append(self._on_settings)
        self._draw(self.feed.latest())

    @property
    def _t0_s(self) -> float:
        if self.replay is None:
            return self.t0_s
        first = self.feed.samples()[:1]
        return first[0].t_s if first else 0.0

    # -- the one writer ----------------------------------------------------------------------
    def _append(self, sample: Sample) -> None:
        indices = [d.index for d in sample.devices] or [0]
        if len(sample.devices) > 1:
            indices.append(ALL_DEVICES)
        for i in indices:
            tl = self.timelines.get(i)
            if tl is None:
                tl = self.timelines[i] = Timeline()
            tl.append(sample.t_s, values_of(sample, None if i == ALL_DEVICES else i))

    def _on_sample(self, sample: Sample) -> None:
        """Sampler thread: record, then draw unless paused."""
        self._append(sample)
        if not self.paused:
            self._draw(sample)
        else:
            self._drain()

    def _drain(self) -> None:
        while self._inbox:
            self._inbox.popleft()()

    def _draw(self, sample: Sample | None) -> None:
        if self._closed:
            return
        with self._draw_lock:
            self._drain()
            tl = self.timelines.get(_key(self.device))
            if tl is None and self.device is None and len(self.timelines) == 1:
                tl = next(iter(self.timelines.values()))  # "all" of one GPU is that GPU
            running = self.monitor.cell_running
            label = "Clean up (a cell is running)" if running else "Clean up"
            if self.cleanup_button.description != label:
                self.cleanup_button.description = label
            header = self._header_html(sample)
            if header != self.header.value:
                self.header.value = header
            if tl is None or tl.n == 0:
                return
            now = float(tl.t[tl.n - 1])
            until = self._history_until_s
            refresh = until is None or now - until >= HISTORY_REFRESH_S
            if refresh:
                until = self._history_until_s = now
            t0 = self._t0_s
            with self.fig.batch_update():
                for i, name in enumerate(_ORDER):
                    if refresh:
                        self._set(i, tl.arrays(name, t0, HISTORY_POINTS, until_s=until))
                    # The recent trace starts at the history's last point, so they join.
                    self._set(_RECENT + i, tl.arrays(name, t0, since_s=until))
                self._draw_marks(sample, tl, t0)
            self._draw_cluster(t0)  # outside the batch: plotly adds no trace inside one
            self.draws += 1

    def _draw_cluster(self, t0: float) -> None:
        """``%gpumem watch --cluster``: the feed's named per-GPU lines, dotted, one trace each
        (added the first time a GPU shows up; the feed keeps their length bounded)."""
        feed = getattr(self.monitor, "cluster_feed", None)
        if feed is None or self.replay is not None:
            return
        for name, (xs, ys) in feed.series(t0).items():
            trace = self._cluster_traces.get(name)
            if trace is None:
                self.fig.add_scatter(x=xs, y=ys, name=name, mode="lines",
                                     line={"dash": "dot", "width": 1.5, "shape": "hv"})
                self._cluster_traces[name] = self.fig.data[-1]
            elif list(trace.x or ()) != xs:
                trace.x, trace.y = xs, ys

    def _set(self, index: int, arrays: Arrays) -> None:
        if not arrays.same_as(self._sent.get(index)):
            trace = self.fig.data[index]
            trace.x, trace.y = arrays.lists()
            self._sent[index] = arrays

    def _draw_marks(self, sample: Sample | None, tl: Timeline, t0: float) -> None:
        """Cell marks, the y range and the total/headroom note: resent only when they change.

        The y axis follows the data, not the device total: a 141 GiB axis would flatten a
        notebook's few GiB into the floor. The total is drawn once it is in range and always
        named, with the headroom, in the corner.
        """
        shown = SERIES if not self.has_gpu else tuple(k for k in SERIES if k != "rss")
        top = round(max(tl.max_value(shown), 0.01) * 1.15, 3)
        total = self._total_gib(sample)
        used = self._used_gib(sample)
        all_marks: list[CellMark] = [] if self.replay is not None else list(self.monitor.marks)
        last = all_marks[-1] if all_marks else None
        span_s = float(tl.t[tl.n - 1] - tl.t[0]) if tl.n else 0.0
        key = (len(all_marks), last.execution_count if last else None, top, total,
               round(used, 2), round(span_s * LABEL_MIN_GAP, 1))
        if key == self._marks_sent:
            return
        self._marks_sent = key
        marks = all_marks[-MAX_MARKS:]
        xs = [m.t_s - t0 for m in marks]
        lines, tops = mark_arrays(xs, top)
        self.fig.data[_MARKS].x, self.fig.data[_MARKS].y = lines.lists()
        keep = thin_labels(xs, span_s * LABEL_MIN_GAP)
        labels = self.fig.data[_LABELS]
        lx, ly = tops.lists()
        labels.x, labels.y = [lx[i] for i in keep], [ly[i] for i in keep]
        labels.text = [f"[{'*' if marks[i].execution_count is None else marks[i].execution_count}]"
                       for i in keep]
        self.fig.layout.yaxis.range = [0, max(top * 1.08, total * 1.02 if total <= top else 0)]
        if total and self.has_gpu:
            self.fig.layout.shapes = [{
                "type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": total, "y1": total,
                "line": {"color": "#d62728", "width": 1, "dash": "dash"}}] if total <= top else []
            self.fig.layout.annotations = [{
                "xref": "paper", "yref": "paper", "x": 1, "y": 1.04, "xanchor": "right",
                "yanchor": "bottom", "showarrow": False, "font": {"color": "#d62728", "size": 11},
                "text": f"total {total:.1f} GiB · headroom {max(total - used, 0):.1f} GiB"}]

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
            note = ("<div style='background:#e8f0fe;border-left:4px solid #1a73e8;"
                    "padding:4px 8px;margin:2px 0'><b>REPLAY</b>: "
                    f"{html.escape(self.replay.label)}. Not this machine's GPU: a demonstration"
                    " of the chart. Your own cells are still measured live "
                    "(<code>%gpumem history</code>); <code>%gpumem watch --live</code> "
                    "charts this machine.</div>")
        paused = " <b>(paused)</b>" if self.paused else ""
        return (f"{note}<table class='gpumem-header'><tr>{head}</tr>{body}</table>"
                f"{children_html(sample)}{paused}")

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
            "<div style='background:#fff3cd;border-left:4px solid #d39e00;padding:6px 10px'>"
            f"<b>Cell {html.escape(label)} keeps growing</b>: "
            f"+{format_bytes(v.growth_bytes)} on run {v.runs}, <b>{html.escape(v.cause)}</b>."
            f"<div>{html.escape(v.message)}</div>"
            + (f"<ul style='margin:2px 0'>{holders}</ul>" if holders else "") + "</div>")
        self.banner.layout.display = "block"

    def _on_cleanup_click(self, _button: Any = None) -> None:
        if self.monitor.cell_running:
            self._post(lambda: setattr(
                self.report, "value",
                "<i>A cell is running; cleanup waits until it finishes. Click again then.</i>"))
            return
        try:
            report = self.monitor.cleanup(CleanupRequest())
        except (RuntimeError, ValueError) as e:
            text = f"<i>{html.escape(str(e))}</i>"
            self._post(lambda: setattr(self.report, "value", text))
            return
        page = report._repr_html_()
        self._post(lambda: setattr(self.report, "value", page))

    def _on_pause(self, change: dict[str, Any]) -> None:
        self.paused = bool(change["new"])
        self.pause_button.description = "Resume" if self.paused else "Pause"
        self.pause_button.icon = "play" if self.paused else "pause"

    def _on_select(self, change: dict[str, Any]) -> None:
        """The dropdown asks the monitor, the one owner of the setting; the chart follows
        through ``_on_settings`` like it does for ``%gpumem config --device``. A replay's
        dropdown only picks which recorded GPU to show."""
        value = change["new"]
        device = None if value == ALL_DEVICES else int(value)
        if self.replay is not None:
            self._post(lambda: self._switch(device))
            return
        if device == self.monitor.config.device:
            return
        try:
            self.monitor.configure(device=device)
        except ValueError as e:
            text = f"<i>{html.escape(str(e))}</i>"
            self._post(lambda: setattr(self.report, "value", text))

    def _on_settings(self, config: Config) -> None:
        if self.replay is None and config.device != self.device:
            self._post(lambda: self._switch(config.device))

    def _switch(self, device: int | None) -> None:
        self.device = device
        if self.selector.value != _key(device):
            self.selector.value = _key(device)
        self._sent.clear()
        self._history_until_s = None
        self._marks_sent = ()

    # -- display and lifecycle ---------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """The widget view, plus a static picture of the chart as it is now and the numbers'
        table, for a saved notebook opened without a kernel (JupyterLab falls back to them
        when the widget's model is gone), nbviewer and GitHub."""
        bundle = dict(self.box._repr_mimebundle_(**kwargs) or {})
        latest = self.feed.latest() or self.monitor.read()
        snap = Snapshot(status=self.status, sample=latest)
        static = self.static_bundle(latest)
        bundle["text/plain"] = "gpumem_nb live chart (needs the widget frontend)\n" + str(snap)
        bundle["text/html"] = static["text/html"] + snap._repr_html_()
        bundle["image/svg+xml"] = static["image/svg+xml"]
        return bundle

    def static_bundle(self, sample: Sample | None) -> dict[str, str]:
        """The chart as a static SVG: ``image/svg+xml`` and an ``<img>`` for ``text/html``."""
        with self._draw_lock:
            tl = self.timelines.get(_key(self.device))
            if tl is None and len(self.timelines) == 1:
                tl = next(iter(self.timelines.values()))
            marks = [] if self.replay is not None else list(self.monitor.marks)[-MAX_MARKS:]
            total = self._total_gib(sample)
            shown = self._devices_shown(sample)
            where = (f"GPU {shown[0].index}" if len(shown) == 1
                     else "all GPUs" if shown else "host RAM")
            names = {d.nvml.name for d in shown if d.nvml and d.nvml.name}
            title = f"gpumem_nb chart: {where}" + (f" ({', '.join(sorted(names))})"
                                                   if names else "")
            data = chart_data(tl, self._t0_s, marks,
                              total_bytes=int(total * GIB) if total else None, title=title,
                              replay=self.replay.label if self.replay is not None else None,
                              include_rss=not self.has_gpu)
        return svg_static_bundle(data)

    def refresh_static(self) -> bool:
        """Update the displayed output's static picture to the chart as it is now, so a
        notebook saved after this shows the end of the run (``run_tutorials`` calls it as
        its last step). Needs the handle ``%gpumem watch`` displayed the chart with."""
        self._draw(self.feed.latest())  # header and buttons land in the saved state too
        with self._draw_lock:
            # plotly fills the figure's saved data (_widget_data) only while building its
            # own display bundle; the chart displays the box around it, so ask explicitly.
            self.fig._repr_mimebundle_()
        handle = self.display_handle
        if handle is None:
            return False
        handle.update(self)
        return True

    def close(self) -> None:
        self._closed = True
        self.feed.remove_listener(self._on_sample)
        if self._on_record in self.monitor.on_record:
            self.monitor.on_record.remove(self._on_record)
        if self._on_settings in self.monitor.settings_listeners:
            self.monitor.settings_listeners.remove(self._on_settings)
        with self._draw_lock:
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


def _key(device: int | None) -> int:
    return ALL_DEVICES if device is None else device


def show(monitor: ChartHost) -> MemoryWidget:
    """The kernel's one chart, created on first use (the monitor drops it when the feed
    changes between live and a replay)."""
    if monitor.widget is None:
        monitor.widget = MemoryWidget(monitor)
    widget: MemoryWidget = monitor.widget
    return widget
