"""The live chart's cost: comm bytes per second at the default rate, kernel CPU per update,
and an hour at 10 Hz (points per series, memory). Issue 4 budgets: <= 20 KB/s once warmed up,
< 1% of one core, <= 2,000 points per series and flat memory after an hour.

Driven by the bundled H200 recording on an accelerated clock; the bytes are counted where the
widget hands them to its comm (JSON state plus binary buffers), as a kernel would send them.

    python benchmarks/bench_widget.py
"""

from __future__ import annotations

import json
import os
import sys
import time
import tracemalloc

sys.path.insert(0, ".")

import comm

from benchmarks.common import emit

SENT = {"bytes": 0, "messages": 0}


def _count(self, msg_type, data=None, metadata=None, buffers=None, **keys):  # type: ignore[no-untyped-def]
    SENT["messages"] += 1
    SENT["bytes"] += len(json.dumps(data, default=str)) + sum(
        memoryview(b).nbytes for b in (buffers or []))


comm.DummyComm.publish_msg = _count  # type: ignore[method-assign]


class Clock:
    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


def drive(monitor, clock: Clock, ticks: int, step_s: float) -> tuple[int, int, float]:
    b0, m0, cpu0 = SENT["bytes"], SENT["messages"], time.process_time()
    for _ in range(ticks):
        clock.now += step_s
        monitor.sampler.tick()
    return SENT["bytes"] - b0, SENT["messages"] - m0, time.process_time() - cpu0


def main() -> None:
    os.environ["GPUMEM_NB_CONFIG"] = "/nonexistent/gpumem_nb.json"
    from IPython.testing.globalipapp import start_ipython

    from gpumem_nb.chart.live import show
    from gpumem_nb.magics import current_monitor
    from gpumem_nb.model import CellMark
    from gpumem_nb.sampler import Sampler
    from gpumem_nb.sources.replay import ReplaySource

    ip = start_ipython()
    ip.run_cell("%load_ext gpumem_nb")
    mon = current_monitor(ip)
    clock = Clock()
    mon.sampler.stop()
    # The recording, looping, on a clock the benchmark moves: an hour in seconds.
    mon.source = ReplaySource.from_file(None, clock=clock, loop=True)
    mon.sampler = Sampler(mon.source, interval_s=0.5, clock=clock)
    mon.feeds.sampler = mon.sampler  # the chart draws the monitor's feed
    mon.started_t_s = clock.now
    widget = show(mon)
    results: dict[str, object] = {}

    # Default rate (0.5 s): warm up 2 minutes, then measure 10 minutes of updates.
    drive(mon, clock, 240, 0.5)
    nbytes, msgs, cpu = drive(mon, clock, 1200, 0.5)
    results["default_rate"] = {
        "interval_s": 0.5, "simulated_s": 600, "bytes": nbytes, "messages": msgs,
        "kb_per_s": round(nbytes / 600 / 1000, 2),
        "kernel_cpu_ms_per_update": round(1e3 * cpu / 1200, 3),
        "percent_of_one_core": round(100 * cpu / 600, 3),
    }
    # With cells: a boundary mark every 10 s, as a busy notebook would make.
    b0 = SENT["bytes"]
    for i in range(60):
        mon.marks.append(CellMark(clock.now, 100 + i))
        drive(mon, clock, 20, 0.5)
    results["default_rate_with_a_cell_every_10s_kb_per_s"] = round(
        (SENT["bytes"] - b0) / 600 / 1000, 2)

    # One hour at 10 Hz. The sampler's own ring buffer (14,400 samples) fills in the first
    # 24 minutes by design; after that every structure is full and memory must stay flat.
    tracemalloc.start()
    drive(mon, clock, 18000, 0.1)  # first 30 minutes
    mid = tracemalloc.get_traced_memory()[0]
    nbytes, msgs, cpu = drive(mon, clock, 18000, 0.1)  # the other 30
    end = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    chart = widget.chart
    points = [len(chart.history[k][0]) + len(chart.recent[k][0]) for k in chart.history]
    results["hour_at_10hz"] = {
        "points_per_series_history_plus_recent": points,
        "timeline_samples_kept": widget.timelines[0].n,
        "python_heap_growth_last_30_min_kb": round((end - mid) / 1000, 1),
        "kernel_cpu_ms_per_update": round(1e3 * cpu / 18000, 3),
        "kb_per_s": round(nbytes / 1800 / 1000, 2),
    }
    emit("bench_widget", results)


if __name__ == "__main__":
    main()
