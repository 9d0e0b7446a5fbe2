"""The chart's series: a bounded timeline per device (and their sum), the lines other features
add, and the cluster's; what the front end is told to draw. Pure: no ipywidgets, no display,
testable on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..model import Sample
from ..svgchart.data import LEGEND_ORDER, STYLES, SeriesStyle
from ..timeline import ALL_DEVICES, GIB, SERIES, Timeline, values_by_device, values_of

__all__ = [
    "CLUSTER_COLORS",
    "DRAW_ORDER",
    "ChartSeries",
    "device_key",
    "points",
]

# Drawn in this order, so later lines sit on top: wide lines underneath, and NVML's whole-GPU
# line last and dashed, so where it equals "this process" both stay visible. Names and colours
# are the static picture's (svgchart.STYLES).
DRAW_ORDER = ("rss", "reserved", "allocated", "process", "nvml_used")
# The cluster's lines (%gpumem watch --cluster), dotted, in colours the chart's own series do
# not use.
CLUSTER_COLORS = ("#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#393b79")


@dataclass(frozen=True)
class _Extra:
    """A series another feature added: its style and how to read it from a sample."""

    style: SeriesStyle
    value: Callable[[Sample], float | None]  # bytes, None when unknown
    hidden: bool


def _spec(key: str, style: SeriesStyle, hidden: bool, legend: int) -> dict[str, Any]:
    # The anywidget's own record of a line (livechart.SeriesSpec), as plain JSON.
    return {"key": key, "name": style.name, "color": style.color, "width": style.width_px,
            "dash": style.dash, "hidden": hidden, "legend": legend}


class ChartSeries:
    """The chart's data: each device's timeline (``ALL_DEVICES``: their sum) and the series
    specs the front end draws. Not thread-safe on its own: the live view's one writer uses
    it."""

    def __init__(self, has_gpu: bool) -> None:
        self.has_gpu = has_gpu
        self.timelines: dict[int, Timeline] = {}
        self.extra: dict[str, _Extra] = {}
        self.cluster_keys: tuple[str, ...] = ()
        self.played_s: float | None = None  # a replay: its last recorded point appended

    def keys(self) -> list[str]:
        return [k for k in DRAW_ORDER if k != "rss" or not self.has_gpu] + list(self.extra)

    def specs(self) -> list[dict[str, Any]]:
        """Drawn in DRAW_ORDER; listed in the legend in the picture's order (LEGEND_ORDER),
        then the lines other features added, then the cluster's."""
        specs = [_spec(k, STYLES[k], hidden=False, legend=LEGEND_ORDER.index(k))
                 for k in DRAW_ORDER if k != "rss" or not self.has_gpu]
        if self.has_gpu:  # host RAM is one legend click away, not drawn by default
            specs.insert(0, _spec("rss", STYLES["rss"], hidden=True,
                                  legend=LEGEND_ORDER.index("rss")))
        n = len(LEGEND_ORDER)
        specs += [_spec(k, e.style, e.hidden, legend=n + i)
                  for i, (k, e) in enumerate(self.extra.items())]
        n += len(self.extra)
        specs += [_spec(name, SeriesStyle(name, CLUSTER_COLORS[i % len(CLUSTER_COLORS)], 1.5,
                                          "2 3"), hidden=False, legend=n + i)
                  for i, name in enumerate(self.cluster_keys)]
        return specs

    def add(self, key: str, style: SeriesStyle, value: Callable[[Sample], float | None],
            hidden: bool = False) -> None:
        if key in SERIES:
            raise ValueError(f"{key!r} is one of the chart's own series")
        self.extra[key] = _Extra(style, value, hidden)
        for tl in self.timelines.values():
            tl.add_series(key)

    def remove(self, key: str) -> bool:
        return self.extra.pop(key, None) is not None

    def append(self, sample: Sample) -> None:
        indices = [d.index for d in sample.devices] or [0]
        if len(sample.devices) > 1:
            indices.append(ALL_DEVICES)
        extra = {k: _gib(e.value, sample) for k, e in self.extra.items()}
        values = values_by_device(sample)
        for i in indices:
            tl = self.timelines.get(i)
            if tl is None:
                tl = self.timelines[i] = Timeline()
                for k in self.extra:
                    tl.add_series(k)
            if tl.n and sample.t_s <= tl.t[tl.n - 1]:
                continue  # a replay that has ended repeats its last reading
            tl.append(sample.t_s, {**(values[i] if i in values else values_of(sample, i)),
                                   **extra})

    def append_played(self, source: Any, latest: Callable[[], Sample | None]) -> None:
        """A replay: every recorded point played since the last call, at its own time (a
        0.5 s sampler would miss the recording's 0.25 s spikes and draw them late)."""
        played = getattr(source, "played", None)
        if played is None:  # a source that plays no recording of its own
            sample = latest()
            if sample is not None:
                self.append(sample)
            return
        pts = played(self.played_s)
        for s in pts:
            self.append(s)
        if pts:
            self.played_s = pts[-1].t_s

    def timeline(self, device: int | None) -> Timeline | None:
        tl = self.timelines.get(device_key(device))
        if tl is None and len(self.timelines) == 1:
            tl = next(iter(self.timelines.values()))  # "all" of one GPU is that GPU
        return tl

    @staticmethod
    def recording_timeline(recording: Sequence[Sample], device: int | None) -> Timeline:
        """A whole recording's timeline for one device (None: all), for its picture."""
        tl = Timeline(capacity=max(len(recording), 16))
        for s in recording:
            tl.append(s.t_s, values_of(s, device))
        return tl


def _gib(value: Callable[[Sample], float | None], sample: Sample) -> float:
    v = value(sample)
    return float("nan") if v is None else v / GIB


def points(tl: Timeline, key: str, t0: float, max_points: int, *,
           since_s: float | None = None, until_s: float | None = None) -> list[Any]:
    xs, ys = tl.arrays(key, t0, max_points, since_s=since_s, until_s=until_s).lists()
    return [xs, ys]


def device_key(device: int | None) -> int:
    return ALL_DEVICES if device is None else device
