"""The chart's data, kept apart from the chart: bounded series and what to send.

The timeline keeps its own fixed-size buffers (memory stays flat however long the kernel runs)
and prepares, per tick, the smallest arrays that draw the same picture:

- runs of equal values collapse to their two ends (memory is mostly flat between cells);
- beyond ``max_points``, older history is bucketed keeping each bucket's minimum and maximum,
  so a short spike survives downsampling instead of being averaged away.

Pure standard library (``array``, ``bisect``): numpy costs the first ``%gpumem watch`` about
90 ms to import in a kernel that has not imported it yet, a third of the first chart's
0.3 s budget, and the work here is a few thousand numbers a tick at most.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from .model import DeviceSample, Sample

__all__ = [
    "ALL_DEVICES",
    "GIB",
    "MAX_POINTS",
    "NAN",
    "SERIES",
    "Arrays",
    "Timeline",
    "collapse_runs",
    "keep_peaks",
    "values_by_device",
    "values_of",
]

SERIES = ("nvml_used", "process", "reserved", "allocated", "rss")
GIB = float(1 << 30)
MAX_POINTS = 2000
NAN = float("nan")


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)  # NaN equals NaN here: both unknown


@dataclass(frozen=True)
class Arrays:
    """One series' x (seconds) and y (GiB), NaN for a gap."""

    x: array
    y: array

    def lists(self) -> tuple[list[float], list[float | None]]:
        """Plain, rounded lists for the browser, None for a gap (NaN is not JSON). The hover
        shows GiB to 2 decimals, and below 1 GiB MiB to 1 decimal: y keeps enough of each."""
        return ([round(v, 3) for v in self.x],
                [None if v != v else round(v, 4) if abs(v) >= 1 else round(v, 6)
                 for v in self.y])

    def same_as(self, other: Arrays | None) -> bool:
        return (other is not None and len(self.x) == len(other.x)
                and self.x == other.x
                and all(_same(a, b) for a, b in zip(self.y, other.y, strict=True)))


ALL_DEVICES = -1  # the timeline key of the sum over every recorded GPU


def values_of(sample: Sample, device: int | None) -> dict[str, float]:
    """A sample's values in GiB for one device, or summed over all when ``device`` is None;
    NaN where unknown (the chart leaves a gap)."""
    devices = sample.devices if device is None else [
        d for d in sample.devices if d.index == device]
    return _values(devices, sample.rss_bytes)


def values_by_device(sample: Sample) -> dict[int, dict[str, float]]:
    """``values_of`` for each device the sample names, and for ``ALL_DEVICES`` when it names
    more than one: the devices grouped in one pass (filtering them once per device made a
    sample of 20,000 GPUs cost 36.6 s)."""
    groups: dict[int, list[DeviceSample]] = {}
    for d in sample.devices:
        groups.setdefault(d.index, []).append(d)
    out = {i: _values(ds, sample.rss_bytes) for i, ds in groups.items()}
    if len(sample.devices) > 1:
        out[ALL_DEVICES] = _values(sample.devices, sample.rss_bytes)
    return out


def _values(devices: Sequence[DeviceSample], rss_bytes: int | None) -> dict[str, float]:
    def total(values: list[int | None]) -> float:
        known = [v for v in values if v is not None]
        return NAN if not known else sum(known) / GIB

    return {
        "nvml_used": total([d.nvml.used_bytes if d.nvml else None for d in devices]),
        "process": total([d.nvml.process_bytes if d.nvml else None for d in devices]),
        "reserved": total([d.allocator.reserved_bytes if d.allocator else None
                           for d in devices]),
        "allocated": total([d.allocator.allocated_bytes if d.allocator else None
                            for d in devices]),
        "rss": NAN if rss_bytes is None else rss_bytes / GIB,
    }


def _bucket_extremes(y: Sequence[float], start: int, stop: int) -> tuple[int, int]:
    """The indices of the minimum and maximum known value in ``y[start:stop]`` (the bucket's
    first index when none is known)."""
    lo_i = hi_i = start
    lo, hi = math.inf, -math.inf
    for i in range(start, stop):
        v = y[i]
        if v != v:
            continue
        if v < lo:
            lo, lo_i = v, i
        if v > hi:
            hi, hi_i = v, i
    return lo_i, hi_i


def keep_peaks(x: Sequence[float], y: Sequence[float],
               max_points: int) -> tuple[array, array]:
    """At most ``max_points``: the newest half as is, older ones as per-bucket min and max."""
    n = len(x)
    if n <= max_points:
        return array("d", x), array("d", y)
    recent = max_points // 2
    old = n - recent
    size = -(-old // ((max_points - recent) // 2))  # ceil: at most that many buckets
    keep: set[int] = set()
    whole = (old // size) * size
    for start in range(0, whole, size):
        keep.update(_bucket_extremes(y, start, start + size))
    idx = sorted(keep) + list(range(whole, n))  # and what did not fill a whole bucket
    idx = idx[-max_points:]
    return array("d", (x[i] for i in idx)), array("d", (y[i] for i in idx))


def collapse_runs(x: Sequence[float], y: Sequence[float]) -> tuple[array, array]:
    """Drop the inner points of runs of equal values; the line looks the same."""
    n = len(y)
    if n <= 2:
        return array("d", x), array("d", y)
    keep = [0] + [i for i in range(1, n - 1)
                  if not (_same(y[i], y[i - 1]) and _same(y[i], y[i + 1]))] + [n - 1]
    return array("d", (x[i] for i in keep)), array("d", (y[i] for i in keep))


class Timeline:
    """Fixed-capacity series for one device. When full, the older half is compacted to each
    bucket's extremes, so an hour at 10 Hz costs the same memory as a minute.

    The columns are ``SERIES`` plus any named with ``add_series`` (another feature's lines);
    a value a sample does not give is unknown (NaN)."""

    def __init__(self, capacity: int = 8192) -> None:
        self.capacity = capacity
        self.t = array("d")
        self.v = {name: array("d") for name in SERIES}

    @property
    def n(self) -> int:
        return len(self.t)

    def add_series(self, name: str) -> None:
        """A new column, unknown for every point so far."""
        if name not in self.v:
            self.v[name] = array("d", [NAN]) * self.n

    def append(self, t_s: float, values: dict[str, float]) -> None:
        if self.n == self.capacity:
            self._compact()
        self.t.append(t_s)
        for name, column in self.v.items():
            column.append(values.get(name, NAN))

    def _compact(self) -> None:
        half = self.capacity // 2
        # Buckets of 32 keep at most 11 of 32 points (start, and each series' min and max),
        # so every compaction frees at least a third of the buffer.
        keep: set[int] = set()
        whole = half - half % 32
        for start in range(0, whole, 32):
            keep.add(start)
            for column in self.v.values():
                keep.update(_bucket_extremes(column, start, start + 32))
        idx = sorted(keep) + list(range(whole, self.n))
        self.t = array("d", (self.t[i] for i in idx))
        for name, column in self.v.items():
            self.v[name] = array("d", (column[i] for i in idx))

    def max_value(self, names: tuple[str, ...] = SERIES) -> float:
        """The highest known value of the named series, 0.0 when there is none."""
        tops = [max((v for v in self.v[k] if v == v), default=-math.inf) for k in names]
        top = max(tops, default=-math.inf)
        return 0.0 if top == -math.inf else float(top)

    def arrays(self, name: str, t0_s: float, max_points: int = MAX_POINTS, *,
               since_s: float | None = None, until_s: float | None = None) -> Arrays:
        """One series between two times (inclusive), x relative to ``t0_s``, collapsed and
        bounded."""
        t = self.t
        lo = 0 if since_s is None else bisect.bisect_left(t, since_s)
        hi = self.n if until_s is None else bisect.bisect_right(t, until_s)
        x = [v - t0_s for v in t[lo:hi]]
        y = self.v[name][lo:hi]
        cx, cy = collapse_runs(x, y)
        kx, ky = keep_peaks(cx, cy, max_points)
        return Arrays(x=kx, y=ky)
