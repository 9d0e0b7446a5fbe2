"""The compact reading (``%gpumem watch --compact``): one line per GPU, small enough to keep at
the top of a notebook. Pure: what each line says, and its text and HTML without the widget.

A line holds NVML's used and total, the allocator's reserved and allocated, the headroom
(total minus used), a sparkline of the recent "used" readings and the last cell's reserved
delta. Without a GPU it is one line of host RAM. The figures are formatted here, once, so the
live view (compact.js) and the static fallback read the same.
"""

from __future__ import annotations

import html
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..model import CellRecord, DeviceSample, Sample
from ..units import format_bytes

__all__ = [
    "SPARK_BARS",
    "SPARK_POINTS",
    "CompactLine",
    "SparkHistory",
    "compact_html",
    "compact_lines",
    "compact_text",
    "spark_text",
]

# About 30 s of readings at the default 0.5 s interval: enough to see a trend, and few enough
# that an update stays a few hundred bytes a GPU.
SPARK_POINTS = 60
SPARK_LEVELS = 100  # the sparkline travels as integers 0..100 of its own top
SPARK_BARS = "▁▂▃▄▅▆▇█"
HOST = -1  # the key of host RAM's sparkline, without a GPU


@dataclass(frozen=True)
class CompactLine:
    """One GPU's line (or host RAM's), every figure already formatted."""

    label: str
    used: str
    total: str
    reserved: str
    allocated: str
    headroom: str
    spark: tuple[int, ...] = ()  # 0..SPARK_LEVELS, of spark_top
    spark_top: str = ""
    delta: str = ""  # "[12] reserved +1.00 GiB", "" before any cell
    fill: float = 0.0  # used / total, 0..1: how full, for the colour of the line

    def as_json(self) -> dict[str, Any]:
        return {"label": self.label, "used": self.used, "total": self.total,
                "reserved": self.reserved, "allocated": self.allocated,
                "headroom": self.headroom, "spark": list(self.spark),
                "spark_top": self.spark_top, "delta": self.delta,
                "fill": round(self.fill, 3)}


@dataclass
class SparkHistory:
    """The recent readings each line's sparkline draws: per GPU (``HOST`` without one)."""

    points: int = SPARK_POINTS
    values: dict[int, deque[float]] = field(default_factory=dict)

    def add(self, sample: Sample) -> None:
        if not sample.devices:
            self._push(HOST, sample.rss_bytes)
        for d in sample.devices:
            self._push(d.index, _used_bytes(d))

    def _push(self, key: int, value: int | None) -> None:
        if value is None:
            return
        q = self.values.get(key)
        if q is None:
            q = self.values[key] = deque(maxlen=self.points)
        q.append(float(value))

    def scaled(self, key: int) -> tuple[tuple[int, ...], float]:
        """The line's readings as 0..SPARK_LEVELS of their top, and that top in bytes."""
        q = self.values.get(key, ())
        top = max(q, default=0.0)
        if top <= 0:
            return tuple(0 for _ in q), 0.0
        return tuple(round(v / top * SPARK_LEVELS) for v in q), top


def _used_bytes(d: DeviceSample) -> int | None:
    """NVML's whole-GPU "used", else what PyTorch reserved (no NVML: ROCm, a container)."""
    if d.nvml is not None and d.nvml.used_bytes is not None:
        return d.nvml.used_bytes
    return d.allocator.reserved_bytes if d.allocator is not None else None


def _delta(last: CellRecord | None, index: int | None) -> str:
    if last is None:
        return ""
    label = f"[{'*' if last.execution_count is None else last.execution_count}]"
    if index is None:
        return f"{label} host RAM {format_bytes(last.rss_delta_bytes, signed=True)}"
    cd = next((c for c in last.devices if c.index == index), None)
    if cd is None:
        return ""
    return f"{label} reserved {format_bytes(cd.reserved_delta_bytes, signed=True)}"


def compact_lines(sample: Sample | None, spark: SparkHistory,
                  last: CellRecord | None = None) -> list[CompactLine]:
    """One line per GPU of ``sample``, or one of host RAM when it has none."""
    if sample is None:
        return []
    if not sample.devices:
        scaled, top = spark.scaled(HOST)
        return [CompactLine(label="host RAM", used=format_bytes(sample.rss_bytes), total="",
                            reserved="", allocated="", headroom="", spark=scaled,
                            spark_top=format_bytes(top) if top else "",
                            delta=_delta(last, None))]
    out = []
    for d in sample.devices:
        total = d.nvml.total_bytes if d.nvml is not None else None
        used = _used_bytes(d)
        alloc = d.allocator
        headroom = total - used if total is not None and used is not None else None
        scaled, top = spark.scaled(d.index)
        out.append(CompactLine(
            label=f"GPU {d.index}", used=format_bytes(used), total=format_bytes(total),
            reserved=format_bytes(alloc.reserved_bytes if alloc else None),
            allocated=format_bytes(alloc.allocated_bytes if alloc else None),
            headroom=format_bytes(max(headroom, 0) if headroom is not None else None),
            spark=scaled, spark_top=format_bytes(top) if top else "",
            delta=_delta(last, d.index),
            fill=min(max(used / total, 0.0), 1.0) if used is not None and total else 0.0))
    return out


def spark_text(levels: Sequence[int], width: int = 20) -> str:
    """A sparkline in block characters (the last ``width`` readings): what text shows."""
    shown = list(levels)[-width:]
    n = len(SPARK_BARS) - 1
    return "".join(SPARK_BARS[min(round(v / SPARK_LEVELS * n), n)] for v in shown)


def _parts(line: CompactLine) -> list[str]:
    if not line.total and not line.reserved:  # host RAM
        parts = [f"{line.label} {line.used}"]
    else:
        parts = [f"{line.label} used {line.used} / {line.total}",
                 f"reserved {line.reserved}", f"allocated {line.allocated}",
                 f"headroom {line.headroom}"]
    if line.spark:
        parts.append(spark_text(line.spark))
    if line.delta:
        parts.append(f"last cell {line.delta}")
    return parts


def compact_text(lines: Iterable[CompactLine]) -> str:
    text = "\n".join(" · ".join(_parts(ln)) for ln in lines)
    return text or "gpumem_nb: no reading yet"


def compact_html(lines: Iterable[CompactLine], note: str = "") -> str:
    """The reading without the widget: one line per GPU, monospace figures; ``note`` (a
    sentence for when no live view shows) under it."""
    rows = "".join(
        "<div style='white-space:nowrap;overflow:hidden;text-overflow:ellipsis'>"
        + html.escape(" · ".join(_parts(ln))) + "</div>" for ln in lines)
    tail = (f"<div class='gpumem-no-live' style='font-size:11px;"
            f"color:var(--jp-ui-font-color2,#555)'>{note}</div>" if note else "")
    return (f"<div class='gpumem-compact-static' style='font-family:var(--jp-code-font-family,"
            f"monospace);font-size:12px'>{rows or 'gpumem_nb: no reading yet'}</div>{tail}")
