"""What a picture shows: each series' style (checked where it is made: it reaches the browser
as SVG attributes), the live chart's own styles, and its ``ChartData``, built from a
``Timeline`` by ``chart_data``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..model import CellMark

if TYPE_CHECKING:  # a type only: importing timeline at run time would import numpy
    from ..timeline import Timeline

__all__ = [
    "DRAW_ORDER",
    "GIB",
    "LEGEND_ORDER",
    "MAX_POINTS_PER_SERIES",
    "MAX_WIDTH_PX",
    "STYLES",
    "TOTAL_COLOR",
    "ChartData",
    "Point",
    "SeriesStyle",
    "chart_data",
    "mark_label",
]


GIB = float(1 << 30)
# Each series keeps at most this many points: min and max per bucket, so spikes survive.
MAX_POINTS_PER_SERIES = 600


# What a series' colour and dash may be. Both reach the browser as SVG attributes and CSS
# values: anything else (a quote, an angle bracket, a url()) is refused where it is made.
_COLOR = re.compile(r"#(?:[0-9a-fA-F]{3,4}|[0-9a-fA-F]{6}|[0-9a-fA-F]{8})|[a-zA-Z]{1,32}"
                    r"|(?:rgb|rgba|hsl|hsla)\([0-9.,%\s/]{1,64}\)")
_DASH = re.compile(r"[0-9.,\s]{0,64}")
MAX_WIDTH_PX = 20.0


@dataclass(frozen=True)
class SeriesStyle:
    name: str
    color: str  # a CSS colour: #rgb, #rrggbb(aa), a name, rgb()/hsl()
    width_px: float
    dash: str = ""  # an SVG stroke-dasharray; "" is solid

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ValueError(f"a series name is text, not {self.name!r}")
        if not isinstance(self.color, str) or not _COLOR.fullmatch(self.color):
            raise ValueError(f"a series colour is a CSS colour such as '#1f77b4' or 'teal', "
                             f"not {self.color!r}")
        width = self.width_px
        if (not isinstance(width, int | float) or isinstance(width, bool)
                or not 0 < width <= MAX_WIDTH_PX):
            raise ValueError(f"a series width is more than 0 and at most {MAX_WIDTH_PX:g} px, "
                             f"not {width!r}")
        if not isinstance(self.dash, str) or not _DASH.fullmatch(self.dash):
            raise ValueError(f"a series dash is an SVG dash array such as '6 3', "
                             f"not {self.dash!r}")


# Same names and colours as the live chart. Visual hierarchy: wide lines underneath, thin on
# top, and NVML's whole-GPU line last and dashed, so where it equals "this process" (no other
# process on the GPU) both stay visible instead of grey vanishing under purple.
STYLES: dict[str, SeriesStyle] = {
    "nvml_used": SeriesStyle("NVML used (whole GPU)", "#7f7f7f", 1.5, "6 3"),
    "process": SeriesStyle("this process (NVML)", "#9467bd", 3.5),
    "reserved": SeriesStyle("reserved (PyTorch cache)", "#ff7f0e", 3.0),
    "allocated": SeriesStyle("allocated (live tensors)", "#1f77b4", 1.5),
    "rss": SeriesStyle("host RAM (RSS)", "#2ca02c", 2.0),
}
LEGEND_ORDER = ("nvml_used", "process", "reserved", "allocated", "rss")
DRAW_ORDER = ("rss", "reserved", "allocated", "process", "nvml_used")
TOTAL_COLOR = "#d62728"

Point = tuple[float, float | None]  # (seconds since load, bytes or None when unknown)


@dataclass(frozen=True)
class ChartData:
    """What the picture shows. Series keys are those of ``STYLES``; a series without a known
    value is left out, legend included."""

    series: dict[str, list[Point]]
    marks: list[tuple[float, str]] = field(default_factory=list)  # (seconds, "[12]")
    total_bytes: int | None = None
    title: str = ""
    replay: str | None = None  # the recording's name when the chart plays one back
    x_title: str = "seconds since %load_ext gpumem_nb"

    def known(self, key: str) -> list[tuple[float, float]]:
        return [(t, v) for t, v in self.series.get(key, ()) if v is not None]


def mark_label(mark: CellMark) -> str:
    return f"[{'*' if mark.execution_count is None else mark.execution_count}]"


def chart_data(timeline: Timeline | None, t0_s: float, marks: Iterable[CellMark], *,
               total_bytes: int | None = None, title: str = "", replay: str | None = None,
               include_rss: bool = False, x_title: str = ChartData.x_title,
               max_points: int = MAX_POINTS_PER_SERIES) -> ChartData:
    """ChartData from one device's ``Timeline`` (values in GiB) and the monitor's marks.

    ``include_rss``: host RAM is charted only without a GPU, as the live chart does.
    """
    keys = ("nvml_used", "process", "reserved", "allocated") + (("rss",) if include_rss else ())
    series: dict[str, list[Point]] = {}
    if timeline is not None and timeline.n:
        for key in keys:
            a = timeline.arrays(key, t0_s, max_points)
            series[key] = [(float(t), None if math.isnan(v) else float(v) * GIB)
                           for t, v in zip(a.x.tolist(), a.y.tolist(), strict=True)]
    return ChartData(series=series, marks=[(m.t_s - t0_s, mark_label(m)) for m in marks],
                     total_bytes=total_bytes, title=title, replay=replay, x_title=x_title)
