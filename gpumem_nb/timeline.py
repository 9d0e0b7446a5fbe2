"""The chart's data, kept apart from the chart: bounded series and what to send.

Plotly's FigureWidget has no "extend traces": every update resends whole arrays. So the
timeline keeps its own fixed-size numpy buffers (memory stays flat however long the kernel
runs) and prepares, per tick, the smallest arrays that draw the same picture:

- runs of equal values collapse to their two ends (memory is mostly flat between cells);
- beyond ``max_points``, older history is bucketed keeping each bucket's minimum and maximum,
  so a short spike survives downsampling instead of being averaged away.

Pure numpy; the only numpy importer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import Sample

SERIES = ("nvml_used", "process", "reserved", "allocated", "rss")
GIB = float(1 << 30)
MAX_POINTS = 2000


@dataclass(frozen=True)
class Arrays:
    """One trace's x (seconds) and y (GiB) as float arrays, ready for plotly."""

    x: np.ndarray
    y: np.ndarray

    def lists(self) -> tuple[list[float | None], list[float | None]]:
        """Plain lists for plotly, None for a gap.

        A FigureWidget must not hold numpy arrays: the browser echoes trace defaults back as
        typed-array dicts and plotly's ``_remove_overlapping_props`` then evaluates an array's
        truth value, raising in the kernel on every echo (plotly 6-7 with numpy 2).
        """
        return _plain(self.x, 3), _plain(self.y, 4)

    def same_as(self, other: Arrays | None) -> bool:
        return (other is not None and self.x.shape == other.x.shape
                and bool(np.array_equal(self.x, other.x))
                and bool(np.array_equal(self.y, other.y, equal_nan=True)))


def _plain(a: np.ndarray, digits: int) -> list[float | None]:
    return [None if v != v else v for v in np.round(a.astype(np.float64), digits).tolist()]


ALL_DEVICES = -1  # the timeline key of the sum over every recorded GPU


def values_of(sample: Sample, device: int | None) -> dict[str, float]:
    """A sample's values in GiB for one device, or summed over all when ``device`` is None;
    NaN where unknown (plotly leaves a gap)."""
    nan = float("nan")
    devices = sample.devices if device is None else [
        d for d in sample.devices if d.index == device]

    def total(values: list[int | None]) -> float:
        known = [v for v in values if v is not None]
        return nan if not known else sum(known) / GIB

    return {
        "nvml_used": total([d.nvml.used_bytes if d.nvml else None for d in devices]),
        "process": total([d.nvml.process_bytes if d.nvml else None for d in devices]),
        "reserved": total([d.allocator.reserved_bytes if d.allocator else None
                           for d in devices]),
        "allocated": total([d.allocator.allocated_bytes if d.allocator else None
                            for d in devices]),
        "rss": nan if sample.rss_bytes is None else sample.rss_bytes / GIB,
    }


def _bucket_extremes(y: np.ndarray, size: int) -> np.ndarray:
    """Per bucket of ``size`` consecutive points, the indices of its min and max (vectorised:
    the chart is redrawn on every tick)."""
    buckets = len(y) // size
    block = y[: buckets * size].reshape(buckets, size)
    nan = np.isnan(block)
    i_max = np.argmax(np.where(nan, -np.inf, block), axis=1)
    i_min = np.argmin(np.where(nan, np.inf, block), axis=1)
    base = np.arange(buckets) * size
    return np.concatenate([base + i_min, base + i_max])


def mark_arrays(xs: list[float], top: float) -> tuple[Arrays, Arrays]:
    """Vertical lines at each x (x, x, gap per mark) and label positions at their tops.

    As numpy arrays they travel as binary, where NaN gaps are fine; a NaN in a plain list
    would not be valid JSON.
    """
    x = np.asarray(xs, dtype=np.float32)
    line_x = np.repeat(x, 3)
    line_x[2::3] = np.nan
    line_y = np.tile(np.asarray([0.0, top, np.nan], dtype=np.float32), len(x))
    return Arrays(line_x, line_y), Arrays(x, np.full(len(x), top, dtype=np.float32))


def keep_peaks(x: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points``: the newest half as is, older ones as per-bucket min and max."""
    n = len(x)
    if n <= max_points:
        return x, y
    recent = max_points // 2
    old = n - recent
    size = -(-old // ((max_points - recent) // 2))  # ceil: at most that many buckets
    idx = np.unique(_bucket_extremes(y[:old], size))
    tail = old - (old // size) * size  # points that did not fill a whole bucket
    keep = np.concatenate([idx, np.arange(old - tail, n)])
    keep = keep[-max_points:] if len(keep) > max_points else keep
    return x[keep], y[keep]


def collapse_runs(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop the inner points of runs of equal values; the line looks the same."""
    n = len(y)
    if n <= 2:
        return x, y
    same_prev = np.empty(n, dtype=bool)
    same_next = np.empty(n, dtype=bool)
    eq = (y[1:] == y[:-1]) | (np.isnan(y[1:]) & np.isnan(y[:-1]))
    same_prev[0], same_prev[1:] = False, eq
    same_next[-1], same_next[:-1] = False, eq
    keep = ~(same_prev & same_next)
    return x[keep], y[keep]


class Timeline:
    """Fixed-capacity series for one device. When full, the older half is compacted by
    ``keep_peaks`` so an hour at 10 Hz costs the same memory as a minute.

    The columns are ``SERIES`` plus any named with ``add_series`` (another feature's lines);
    a value a sample does not give is unknown (NaN)."""

    def __init__(self, capacity: int = 8192) -> None:
        self.capacity = capacity
        self.t = np.empty(capacity)
        self.v = {name: np.empty(capacity) for name in SERIES}
        self.n = 0

    def add_series(self, name: str) -> None:
        """A new column, unknown for every point so far."""
        if name not in self.v:
            column = np.empty(self.capacity)
            column[: self.n] = np.nan
            self.v[name] = column

    def append(self, t_s: float, values: dict[str, float]) -> None:
        if self.n == self.capacity:
            self._compact()
        self.t[self.n] = t_s
        for name, column in self.v.items():
            column[self.n] = values.get(name, np.nan)
        self.n += 1

    def _compact(self) -> None:
        half = self.capacity // 2
        # Buckets of 32 keep at most 11 of 32 points (start, and each series' min and max),
        # so every compaction frees at least a third of the buffer.
        idx = _peak_indices(self.v, half, 32)
        keep = np.concatenate([idx, np.arange(half, self.n)])
        m = len(keep)
        self.t[:m] = self.t[keep]
        for column in self.v.values():
            column[:m] = column[keep]
        self.n = m

    def max_value(self, names: tuple[str, ...] = SERIES) -> float:
        """The highest known value of the named series, 0.0 when there is none."""
        tops = [np.nanmax(self.v[k][: self.n]) for k in names
                if self.n and not np.all(np.isnan(self.v[k][: self.n]))]
        return float(max(tops, default=0.0))

    def arrays(self, name: str, t0_s: float, max_points: int = MAX_POINTS, *,
               since_s: float | None = None, until_s: float | None = None) -> Arrays:
        """One series between two times (inclusive), as float32, collapsed and bounded.

        float32 halves what goes over the wire; seconds since load keep 0.25 ms resolution
        for a day.
        """
        t = self.t[: self.n]
        lo = 0 if since_s is None else int(np.searchsorted(t, since_s, side="left"))
        hi = self.n if until_s is None else int(np.searchsorted(t, until_s, side="right"))
        x = (t[lo:hi] - t0_s).astype(np.float32)
        y = self.v[name][lo:hi].astype(np.float32)
        x, y = collapse_runs(x, y)
        x, y = keep_peaks(x, y, max_points)
        return Arrays(x=x, y=y)


def _peak_indices(values: dict[str, np.ndarray], n: int, size: int) -> np.ndarray:
    """Indices in [0, n) that keep every series' per-bucket min and max."""
    parts = [np.arange(0, n - n % size, size)]
    parts += [_bucket_extremes(arr[:n], size) for arr in values.values()]
    parts.append(np.arange(n - n % size, n))
    return np.unique(np.concatenate(parts))
