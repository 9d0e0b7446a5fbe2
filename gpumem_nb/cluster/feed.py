"""A cluster's per-GPU lines for the live chart, collected off every cell's path.

The feed's own thread asks the collector at the sampler's pace, but at most once a second (a
collection reaches every worker), each time bounded by that pace. The chart reads only what
the last collection left (``series``): drawing never waits on the cluster, and a scheduler
that does not answer shows as a gap, not as a stale line. A closed client ends the feed.

The chart's side is one function returning named series, so any chart can draw them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from . import ROW_OK, ClusterReading, Collector

MIN_PACE_S = 1.0
MAX_POINTS = 600  # per line: ten minutes at one a second; the array is resent on each draw
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
        self._record(reading)
        if getattr(self.collector, "closed", False):
            self.ended = reading.detail or "the client is closed"
        return reading

    def _record(self, reading: ClusterReading) -> None:
        t = reading.t_s
        with self._lock:
            self.latest = reading
            seen: set[str] = set()
            for d in reading.devices():
                used_name, alloc_name = _names(d.uuid, d.host, d.gpu_name)
                allocated = [r.allocated_bytes for r in reading.rows
                             if r.uuid == d.uuid and r.status == ROW_OK
                             and r.allocated_bytes is not None]
                self._add(used_name, t, d.used_bytes)
                self._add(alloc_name, t, sum(allocated) if allocated else None)
                seen.update((used_name, alloc_name))
            for name, points in self._lines.items():
                if name not in seen:  # no answer for this GPU now: a gap, not its last value
                    points.append((t, None))

    def _add(self, name: str, t: float, value: int | None) -> None:
        line = self._lines.get(name)
        if line is None:
            line = self._lines[name] = deque(maxlen=MAX_POINTS)
        line.append((t, None if value is None else value / GIB))

    def series(self, t0_s: float) -> Series:
        """Named lines for the chart: x in seconds since ``t0_s``, y in GiB, None a gap."""
        with self._lock:
            return {name: ([round(t - t0_s, 3) for t, _ in pts],
                           [None if v is None else round(v, 4) for _, v in pts])
                    for name, pts in self._lines.items()}

    def close(self) -> None:
        self.stop()
        self.collector.close()


def _names(uuid: str, host: str, gpu_name: str) -> tuple[str, str]:
    where = f"{host} " if host else ""
    label = f"{where}{gpu_name or 'GPU'} {uuid[:12]}"
    return f"cluster {label}: NVML used", f"cluster {label}: allocated (its workers)"
