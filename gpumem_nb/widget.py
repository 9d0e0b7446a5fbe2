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
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from .cleanup import CleanupRequest
from .model import CellRecord, Sample, Verdict
from .records import format_peak
from .snapshot import Snapshot, device_row
from .timeline import GIB, MAX_POINTS, SERIES, Arrays, Timeline, mark_arrays, values_of
from .units import format_bytes

_TRACES = {
    "nvml_used": ("NVML used (whole GPU)", "#7f7f7f"),
    "process": ("this process (NVML)", "#9467bd"),
    "reserved": ("reserved (PyTorch cache)", "#ff7f0e"),
    "allocated": ("allocated (live tensors)", "#1f77b4"),
    "rss": ("host RAM (RSS)", "#2ca02c"),
}
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
    def __init__(self, monitor: Any) -> None:
        self.monitor = monitor
        # Read once: the header needs only NVML's status line and whether this is a replay,
        # and neither changes without a new widget (a replay switch makes one).
        self.status = status = monitor.source.status()
        self.has_gpu = status.has_gpu
        self.device = monitor.config.device or 0
        self.timelines: dict[int, Timeline] = {}
        self.t0_s = monitor.started_t_s
        self.paused = False
        self.draws = 0
        self._sent: dict[int, Arrays] = {}
        self._history_until_s: float | None = None
        self._marks_sent: tuple[Any, ...] = ()
        self._inbox: deque[Callable[[], None]] = deque()
        self._draw_lock = threading.Lock()
        self._closed = False

        def series(k: str, recent: bool) -> go.Scatter:
            return go.Scatter(
                x=[], y=[], name=_TRACES[k][0], mode="lines", legendgroup=k,
                showlegend=not recent,
                line={"color": _TRACES[k][1], "width": 2, "shape": "hv"},
                hovertemplate="%{y:.2f} GiB<extra>" + _TRACES[k][0] + "</extra>",
                visible=True if (k != "rss" or not self.has_gpu) else "legendonly")

        self.fig = go.FigureWidget(
            data=[series(k, False) for k in SERIES] + [series(k, True) for k in SERIES]
            + [go.Scatter(x=[], y=[], name="cells", mode="lines", hoverinfo="skip",
                          line={"color": "rgba(0,0,0,0.25)", "width": 1, "dash": "dot"},
                          showlegend=False),
               go.Scatter(x=[], y=[], text=[], mode="text", textposition="top center",
                          name="cell", showlegend=False, textfont={"size": 10},
                          cliponaxis=False,
                          hovertemplate="cell %{text}<extra></extra>")],
            layout=go.Layout(
                height=380, margin={"l": 50, "r": 20, "t": 34, "b": 40},
                xaxis={"title": {"text": "seconds since %load_ext gpumem_nb"}},
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
        self.selector = widgets.Dropdown(
            options=[(f"GPU {i}", i) for i in range(max(gpus, 1))], value=self.device,
            description="device", layout=widgets.Layout(
                width="160px", display="flex" if gpus > 1 else "none"))
        self.selector.observe(self._on_select, names="value")
        controls = widgets.HBox([self.selector, self.pause_button, self.cleanup_button])
        self.box = widgets.VBox([self.header, self.banner, self.fig, controls, self.report])

        for s in monitor.sampler.samples():  # what happened before the chart was shown
            self._append(s)
        monitor.sampler.add_listener(self._on_sample)
        monitor.on_record.append(self._on_record)
        self._draw(monitor.sampler.latest())

    # -- the one writer ----------------------------------------------------------------------
    def _append(self, sample: Sample) -> None:
        indices = [d.index for d in sample.devices] or [0]
        for i in indices:
            tl = self.timelines.get(i)
            if tl is None:
                tl = self.timelines[i] = Timeline()
            tl.append(sample.t_s, values_of(sample, i))

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
            tl = self.timelines.get(self.device)
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
            with self.fig.batch_update():
                for i, name in enumerate(SERIES):
                    if refresh:
                        self._set(i, tl.arrays(name, self.t0_s, HISTORY_POINTS, until_s=until))
                    # The recent trace starts at the history's last point, so they join.
                    self._set(_RECENT + i, tl.arrays(name, self.t0_s, since_s=until))
                self._draw_marks(sample)
            self.draws += 1

    def _set(self, index: int, arrays: Arrays) -> None:
        if not arrays.same_as(self._sent.get(index)):
            trace = self.fig.data[index]
            trace.x, trace.y = arrays.x, arrays.y
            self._sent[index] = arrays

    def _draw_marks(self, sample: Sample | None) -> None:
        """Cell marks, the y range and the total/headroom note: resent only when they change.

        The y axis follows the data, not the device total: a 141 GiB axis would flatten a
        notebook's few GiB into the floor. The total is drawn once it is in range and always
        named, with the headroom, in the corner.
        """
        tl = self.timelines.get(self.device)
        shown = SERIES if not self.has_gpu else tuple(k for k in SERIES if k != "rss")
        top = round(max(tl.max_value(shown) if tl else 0.0, 0.01) * 1.15, 3)
        total = self._total_gib(sample)
        used = self._used_gib(sample)
        last = self.monitor.marks[-1] if self.monitor.marks else None
        key = (len(self.monitor.marks), last.execution_count if last else None, top, total,
               round(used, 2))
        if key == self._marks_sent:
            return
        self._marks_sent = key
        marks = list(self.monitor.marks)[-MAX_MARKS:]
        lines, tops = mark_arrays([m.t_s - self.t0_s for m in marks], top)
        self.fig.data[_MARKS].x, self.fig.data[_MARKS].y = lines.x, lines.y
        labels = self.fig.data[_LABELS]
        labels.x, labels.y = tops.x, tops.y
        labels.text = [f"[{'*' if m.execution_count is None else m.execution_count}]"
                       for m in marks]
        self.fig.layout.yaxis.range = [0, max(top * 1.08, total * 1.02 if total <= top else 0)]
        if total and self.has_gpu:
            self.fig.layout.shapes = [{
                "type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": total, "y1": total,
                "line": {"color": "#d62728", "width": 1, "dash": "dash"}}] if total <= top else []
            self.fig.layout.annotations = [{
                "xref": "paper", "yref": "paper", "x": 1, "y": 1.04, "xanchor": "right",
                "yanchor": "bottom", "showarrow": False, "font": {"color": "#d62728", "size": 11},
                "text": f"total {total:.1f} GiB · headroom {max(total - used, 0):.1f} GiB"}]

    def _total_gib(self, sample: Sample | None) -> float:
        d = sample.device(self.device) if sample else None
        if d is not None and d.nvml is not None and d.nvml.total_bytes:
            return d.nvml.total_bytes / GIB
        return 0.0

    def _used_gib(self, sample: Sample | None) -> float:
        d = sample.device(self.device) if sample else None
        if d is not None and d.nvml is not None and d.nvml.used_bytes is not None:
            return d.nvml.used_bytes / GIB
        return 0.0

    def _header_html(self, sample: Sample | None) -> str:
        status = self.status
        if sample is None:
            return "<div class='gpumem-header'>waiting for the first reading…</div>"
        if not sample.devices:
            return (f"<div class='gpumem-header'><b>No GPU visible</b>: "
                    f"{html.escape(status.nvml)}. Charting host RAM: "
                    f"{format_bytes(sample.rss_bytes)}.</div>")
        last = self.monitor.history.last()
        rows = []
        for d in sample.devices:
            r = device_row(d)
            peak = "—"
            if last is not None:
                cd = next((c for c in last.devices if c.index == d.index), None)
                peak = format_peak(cd) if cd else "—"
            rows.append([r[0], r[1], r[2], r[4], r[3], peak, r[6]])
        head = "".join(f"<th style='padding:0 8px'>{h}</th>" for h in _HEADER)
        body = "".join(
            "<tr>" + "".join(f"<td style='padding:0 8px'>{html.escape(c)}</td>" for c in row)
            + "</tr>" for row in rows)
        note = f"<div><i>{html.escape(status.nvml)}</i></div>" if status.torch == "replay" else ""
        paused = " <b>(paused)</b>" if self.paused else ""
        return (f"<table class='gpumem-header'><tr>{head}</tr>{body}</table>{note}{paused}")

    # -- producers: enqueue, never draw ------------------------------------------------------
    def _post(self, fn: Callable[[], None]) -> None:
        self._inbox.append(fn)
        if self.monitor.sampler.running:
            self.monitor.sampler.request_tick()
        else:
            self._draw(self.monitor.sampler.latest())

    def _on_record(self, record: CellRecord, verdict: Verdict | None) -> None:
        if verdict is not None:
            self._post(lambda: self._show_banner(verdict))

    def _show_banner(self, v: Verdict) -> None:
        holders = "".join(
            f"<li><code>{html.escape(h.name)}</code>: {format_bytes(h.nbytes)} "
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
        def switch() -> None:
            self.device = int(change["new"])
            self._sent.clear()
            self._history_until_s = None
            self._marks_sent = ()

        self._post(switch)

    # -- display and lifecycle ---------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """The widget view, plus text/plain and text/html of the current numbers for GitHub,
        nbviewer, terminals and any frontend without the widget's JavaScript."""
        bundle = dict(self.box._repr_mimebundle_(**kwargs) or {})
        latest = self.monitor.sampler.latest() or self.monitor.read()
        snap = Snapshot(status=self.monitor.source.status(), sample=latest)
        bundle["text/plain"] = "gpumem_nb live chart (needs the widget frontend)\n" + str(snap)
        bundle["text/html"] = snap._repr_html_()
        return bundle

    def close(self) -> None:
        self._closed = True
        self.monitor.sampler.remove_listener(self._on_sample)
        if self._on_record in self.monitor.on_record:
            self.monitor.on_record.remove(self._on_record)
        with self._draw_lock:
            self.box.close()
            self.fig.close()


def show(monitor: Any, replay: str | None = None) -> MemoryWidget:
    """The kernel's one chart, created on first use; ``replay`` drives it from a trace."""
    if replay:
        from .sources.replay import ReplaySource

        monitor.use_source(ReplaySource.from_file(None if replay == "bundled" else replay))
        if monitor.widget is not None:
            monitor.widget.close()
            monitor.widget = None
    if monitor.widget is None:
        monitor.widget = MemoryWidget(monitor)
    return monitor.widget
