"""A cluster's per-GPU lines for the live chart, collected off every cell's path.

The feed's own thread asks the collector at the sampler's pace, but at most once a second (a
collection reaches every worker), each time bounded by that pace. The chart reads only what
the last collection left (``series``): drawing never waits on the cluster, and a scheduler
that does not answer shows as a gap, not as a stale line. A closed client ends the feed.

The chart's side is one function returning named series, so any chart can draw them. Its cost
is bounded however large the cluster: at most ``MAX_GPU_LINES`` GPUs get lines of their own (a
larger cluster is drawn as its sums, and ``%gpumem cluster`` lists every GPU), each line is
sent as at most ``CHART_POINTS`` points (older ones bucketed keeping their minimum and
maximum), and the lines are built once per collection (``version``), not on every draw.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from ..timeline import NAN, collapse_runs, keep_peaks
from . import ROW_OK, ClusterReading, Collector

__all__ = [
    "CHART_POINTS",
    "GIB",
    "MAX_GPU_LINES",
    "MAX_POINTS",
    "MIN_PACE_S",
    "SUM_ALLOCATED",
    "SUM_USED",
    "USED_SUFFIX",
    "ClusterFeed",
    "Series",
]

MIN_PACE_S = 1.0
MAX_POINTS = 600  # kept per line: ten minutes at one a second
CHART_POINTS = 200  # sent per line: the lines are resent whole after each collection
# Per-GPU lines for at most this many GPUs (two lines each); a larger cluster is drawn as two
# lines, its sums. 64 GPUs' 128 lines cost the sampler's thread about 0.2 s a tick.
MAX_GPU_LINES = 8
USED_SUFFIX = ": NVML used"
SUM_USED = "cluster, sum over its GPUs" + USED_SUFFIX
SUM_ALLOCATED = "cluster, sum over its GPUs: allocated (its workers)"
GIB = float(1 << 30)

Series = dict[str, tuple[list[float], list[float | None]]]


class ClusterFeed:
    def __init__(self, collector: Collector, interval_s: Callable[[], float],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.collector = collector
        self._interval_s = interval_s
        self._clock = clock
        self.latest: ClusterReading | None = None
        self.collections = 0
        self.ended = ""  # why the feed stopped by itself (the client closed)
        self._lines: dict[str, deque[tuple[float, float | None]]] = {}
        self.summed = False  # more GPUs than MAX_GPU_LINES were seen: the lines are sums
        self.version = 0  # one more for each collection recorded
        self._series: tuple[int, float, Series] | None = None  # (version, t0, lines)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def pace_s(self) -> float:
        return max(float(self._interval_s()), MIN_PACE_S)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpumem_nb-cluster-feed",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> bool:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        gone = thread is None or not thread.is_alive()
        if gone:
            self._thread = None
        return gone

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = self._clock()
            self.poll_once()
            if self.ended:
                return
            self._stop.wait(max(self.pace_s - (self._clock() - t0), 0.05))

    def poll_once(self) -> ClusterReading:
        """One collection, stored; never raises (the thread's body, and the tests')."""
        try:
            reading = self.collector.collect(self.pace_s)
        except Exception as e:  # a collector must not raise; if one does, it is a gap
            reading = ClusterReading(t_s=self._clock(), rows=(), status="error",
                                     detail=f"{type(e).__name__}: {e}"[:200])
        self.collections += 1
        try:
            self._record(reading)
        except Exception as e:  # answers are checked (cluster.answer); this is the backstop
            # Before: an answer the checks missed ended the feed's thread, and the chart's
            # cluster lines just stopped. Now it is a gap, and ``latest`` says why.
            reading = ClusterReading(t_s=reading.t_s, rows=(), status="error",
                                     detail=f"an answer could not be drawn: "
                                            f"{type(e).__name__}: {e}"[:200])
            with self._lock:
                self.latest = reading
                for points in self._lines.values():
                    points.append((reading.t_s, None))
                self.version += 1
        if getattr(self.collector, "closed", False):
            self.ended = reading.detail or "the client is closed"
        return reading

    def _record(self, reading: ClusterReading) -> None:
        t = reading.t_s
        with self._lock:
            self.latest = reading
            self.version += 1
            devices = reading.devices()
            named = {n: d for d in devices for n in _names(d.uuid, d.host, d.gpu_name)}
            if not self.summed and len(set(self._lines) | set(named)) > 2 * MAX_GPU_LINES:
                # More GPUs than lines allowed, at once or over time (adaptive scaling): the
                # per-GPU lines give way to the sums, for the rest of the feed.
                self.summed = True
                self._lines.clear()
            seen: set[str] = set()
            if self.summed:
                if devices:
                    used = [d.used_bytes for d in devices if d.used_bytes is not None]
                    self._add(SUM_USED, t, sum(used) if used else None)
                    self._add(SUM_ALLOCATED, t, _allocated(reading, None))
                    seen.update((SUM_USED, SUM_ALLOCATED))
            else:
                for name, d in named.items():
                    self._add(name, t, d.used_bytes if name.endswith(USED_SUFFIX)
                              else _allocated(reading, d.uuid))
                seen.update(named)
            for name, points in self._lines.items():
                if name not in seen:  # no answer for this GPU now: a gap, not its last value
                    points.append((t, None))

    def _add(self, name: str, t: float, value: int | None) -> None:
        line = self._lines.get(name)
        if line is None:
            line = self._lines[name] = deque(maxlen=MAX_POINTS)
        line.append((t, None if value is None else value / GIB))

    def series(self, t0_s: float) -> Series:
        """Named lines for the chart: x in seconds since ``t0_s``, y in GiB, None a gap; at
        most ``CHART_POINTS`` a line, built once per collection."""
        with self._lock:
            cached = self._series
            if cached is not None and cached[:2] == (self.version, t0_s):
                return cached[2]
            out: Series = {}
            for name, pts in self._lines.items():
                xs, ys = collapse_runs([t - t0_s for t, _ in pts],
                                       [NAN if v is None else v for _, v in pts])
                xs, ys = keep_peaks(xs, ys, CHART_POINTS)
                out[name] = ([round(x, 3) for x in xs],
                             [None if y != y else round(y, 4) for y in ys])
            self._series = (self.version, t0_s, out)
            return out

    def close(self) -> None:
        self.stop()
        self.collector.close()


def _allocated(reading: ClusterReading, uuid: str | None) -> int | None:
    """The allocated bytes of the workers on ``uuid`` (every GPU: None), None if none said."""
    values = [r.allocated_bytes for r in reading.rows
              if r.status == ROW_OK and r.allocated_bytes is not None and r.uuid
              and (uuid is None or r.uuid == uuid)]
    return sum(values) if values else None


def _names(uuid: str, host: str, gpu_name: str) -> tuple[str, str]:
    where = f"{host} " if host else ""
    label = f"{where}{gpu_name or 'GPU'} {uuid[:12]}"
    return f"cluster {label}{USED_SUFFIX}", f"cluster {label}: allocated (its workers)"
