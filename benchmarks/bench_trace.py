"""The traced cell's own analysis (``trace.analyze``) on a 100,000-entry history shaped as a
kernel records it: each allocation with 29 Python frames (the cell's line, then IPython's
machinery), freed at once (alloc, free_requested, free_completed).

    python benchmarks/bench_trace.py       # BENCH_OUT=dir also writes bench_trace.json

On the H200 this analysis was 1.5 s of a 100,000-entry traced cell before it read only the
frames a site needs (``benchmarks/results/trace_cost_h200.json``, ``ours_ms``).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(0, ".")

from benchmarks.common import emit

ENTRIES = 100_000
DEPTH = 28


def kernel_history(entries: int = ENTRIES) -> list[dict[str, Any]]:
    import IPython

    ipy = os.path.dirname(IPython.__file__)
    outer = [{"filename": f"{ipy}/core/interactiveshell.py", "line": 3600 + i,
              "name": "run_code"} for i in range(DEPTH)]
    out: list[dict[str, Any]] = []
    for i in range(entries // 3):
        addr = 0x7F00_0000_0000 + (i % 7) * 16384
        t = 1e15 + 3 * i
        frames = [{"filename": "/tmp/ipykernel_123/456.py", "line": 2, "name": "<module>"},
                  *(dict(f) for f in outer)]
        out += [{"action": "alloc", "addr": addr, "size": 16384, "stream": 0, "time_us": t,
                 "frames": frames},
                {"action": "free_requested", "addr": addr, "size": 16384, "stream": 0,
                 "time_us": t + 1, "frames": []},
                {"action": "free_completed", "addr": addr, "size": 16384, "stream": 0,
                 "time_us": t + 2, "frames": []}]
    return out


def main() -> None:
    from gpumem_nb.trace import analyze, library_dirs

    history = kernel_history()
    skip = library_dirs()
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        d = analyze(history, skip=skip)
        runs.append(time.perf_counter() - t0)
    emit("bench_trace", {"entries": len(history), "frames_per_allocation": DEPTH + 1,
                         "seconds": [round(x, 3) for x in runs], "best_s": round(min(runs), 3),
                         "sites_at_peak": [s.label for s in d.at_peak]})


if __name__ == "__main__":
    main()
