"""The what-if replayed far past its cap: the review's history (``bench_whatif_bound``) cut
to 200,000 entries wants about 330 GiB; replayed under an 80 GiB cap it runs out thousands
of times, and before each OOM the allocator's last retry (``release_cached_blocks``) looks
for cached segments to give back. With the defaults, under ``garbage_collection_threshold``
(whose collection runs before each new segment once reserved is over the threshold), and
uncapped beside them (which must not get slower).

    python benchmarks/bench_whatif_capped.py      # BENCH_OUT=dir also writes the JSON

Each figure is the best of ``BENCH_REPEATS`` (capped runs: of ``BENCH_CAPPED_REPEATS``),
with the CPU time the process itself spent and the load average at each run (the 2-core
machine is shared). ``BENCH_ENTRIES`` changes the history's length.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(0, ".")

from benchmarks.bench_whatif_bound import review_history
from benchmarks.common import emit

GiB = 1 << 30
CAP_BYTES = 80 * GiB


def timed(n: int, fn: Any) -> dict[str, Any]:
    walls, cpus, loads, out = [], [], [], None
    for _ in range(n):
        loads.append(" ".join(f"{x:.2f}" for x in os.getloadavg()))
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        cpus.append(round(time.process_time() - c0, 3))
        walls.append(round(time.perf_counter() - t0, 3))
    return {"best_s": min(walls), "cpu_s": min(cpus), "runs_s": walls, "cpu_runs_s": cpus,
            "loads": loads, "result": out}


def main() -> None:
    from gpumem_nb.whatif.allocator import Limits
    from gpumem_nb.whatif.config import parse_settings
    from gpumem_nb.whatif.replay import compile_trace, replay

    entries = int(os.environ.get("BENCH_ENTRIES", "200000"))
    repeats = int(os.environ.get("BENCH_REPEATS", "3"))
    capped_repeats = int(os.environ.get("BENCH_CAPPED_REPEATS", "1"))
    trace = compile_trace(review_history(entries))
    cap = Limits(allowed_bytes=CAP_BYTES, capacity_bytes=CAP_BYTES)
    out: dict[str, Any] = {"entries": entries, "events": len(trace.events),
                           "cap_gib": CAP_BYTES / GiB, "cpus": os.cpu_count(),
                           "python": sys.version.split()[0], "runs": []}
    for label, setting, limits, n in (
            ("uncapped, defaults", "", None, repeats),
            ("capped 80 GiB, defaults", "", cap, capped_repeats),
            ("capped 80 GiB, garbage_collection_threshold:0.6",
             "garbage_collection_threshold:0.6", cap, capped_repeats)):
        if not n:
            continue  # BENCH_CAPPED_REPEATS=0: the uncapped replay only
        s = parse_settings(setting)
        got = timed(n, lambda s=s, limits=limits: replay(
            trace, s, limits=limits, device_total_bytes=CAP_BYTES))
        r = got.pop("result")
        out["runs"].append({
            "replay": label, **got, "peak_reserved_gib": round(r.peak_reserved_bytes / GiB, 3),
            "oom_event": r.oom_event, "num_alloc_retries": r.num_alloc_retries,
            "segment_frees": r.segment_frees})
        print(out["runs"][-1], flush=True)
    emit(os.environ.get("BENCH_NAME", "bench_whatif_capped"), out)


if __name__ == "__main__":
    main()
