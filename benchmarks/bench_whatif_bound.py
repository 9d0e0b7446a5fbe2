"""The what-if at its entry bound (issue 37, review F1): a history of 1,000,000 entries.

Targets on the 2-core development machine (shared: the load average is written beside each
figure, and each figure is the best of 3):

- reading and preparing it (the pickle read, ``trace_input``, ``compile_trace``): 3 s;
- one replay under one setting: 2 s;
- ``--fit`` for 4 settings (reading included): 20 s;
- the OOM explainer's line while a 1,000,000-entry session is recorded: 100 ms
  (``bench_whatif_oom_line.json``).

    python benchmarks/bench_whatif_bound.py      # BENCH_OUT=dir also writes the JSON

Two histories: the review's (allocations of 5 sizes, a third of them freed, written as a
``_dump_snapshot`` pickle without stacks, 43 MB) and the training loop of
``bench_whatif.py`` grown to 1,000,000 entries.
"""

from __future__ import annotations

import os
import pickle
import random
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, ".")

from benchmarks.bench_whatif import training_history
from benchmarks.common import emit

MiB = 1 << 20
ENTRIES = 1_000_000
FIT_SETTINGS = ("", "expandable_segments:True", "max_split_size_mb:128",
                "roundup_power2_divisions:4")


def review_history(entries: int = ENTRIES, seed: int = 0) -> list[dict[str, Any]]:
    """Allocations of 5 sizes, a third of them freed (each free two entries), in random
    order: the review's file."""
    rng = random.Random(seed)
    sizes = (512, 65536, 700_000, 3 * MiB, 12 * MiB)
    out: list[dict[str, Any]] = []
    live: list[tuple[int, int]] = []
    addr = 0x7F00_0000_0000
    t = 1_000_000.0
    while len(out) < entries:
        t += 3.0
        if live and rng.random() < 0.2:
            a, size = live.pop(rng.randrange(len(live)))
            for action in ("free_requested", "free_completed"):
                out.append({"action": action, "addr": a, "size": size, "stream": 0,
                            "time_us": t})
            continue
        size = rng.choice(sizes)
        out.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": t})
        live.append((addr, size))
        addr += 1 << 24
    return out[:entries]


def snapshot_of(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """As ``_dump_snapshot`` writes it (no start record: the start is rebuilt)."""
    return {"segments": [], "device_traces": [entries],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}


def load_avg() -> float:
    return round(os.getloadavg()[0], 2)


CPU_RUNS: list[float] = []  # each best_of's CPU times (process_time), read by measure()


def best_of(n: int, fn: Any) -> tuple[float, list[float], list[float], Any]:
    """Wall time, best of ``n``; the CPU times (``time.process_time``: what the process
    itself spent, less what the shared machine's other jobs took) go to ``CPU_RUNS``."""
    runs, loads, out = [], [], None
    CPU_RUNS.clear()
    for _ in range(n):
        loads.append(load_avg())
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        CPU_RUNS.append(round(time.process_time() - c0, 3))
        runs.append(round(time.perf_counter() - t0, 3))
    return min(runs), runs, loads, out


def measure(name: str, entries: list[dict[str, Any]], repeats: int = 3,
            fit: bool = True) -> dict[str, Any]:
    from gpumem_nb.whatif import api
    from gpumem_nb.whatif.config import parse_settings
    from gpumem_nb.whatif.replay import compile_trace, replay

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "history.pickle")
        with open(path, "wb") as f:
            pickle.dump(snapshot_of(entries), f, protocol=pickle.HIGHEST_PROTOCOL)
        file_mb = round(os.path.getsize(path) / 1e6, 1)

        def prepare() -> Any:
            ti = api.trace_input(api.load(path), None)
            return ti, compile_trace(ti.entries)

        read_s, read_runs, read_loads, (ti, trace) = best_of(repeats, prepare)
        read_cpu = list(CPU_RUNS)
        defaults = parse_settings("")
        st = ti.start

        def one() -> Any:
            return replay(trace, defaults, start_segments=st.segments, device=ti.device)

        replay_s, replay_runs, replay_loads, r = best_of(repeats, one)
        replay_cpu = list(CPU_RUNS)
        out: dict[str, Any] = {
            "history": name, "entries": len(entries), "file_mb": file_mb,
            "events": len(trace.events),
            "read_and_prepare_s": read_s, "read_runs_s": read_runs, "read_loads": read_loads,
            "read_target_s": 3.0, "read_cpu_s": min(read_cpu), "read_cpu_runs_s": read_cpu,
            "replay_one_setting_s": replay_s, "replay_runs_s": replay_runs,
            "replay_loads": replay_loads, "replay_target_s": 2.0,
            "replay_cpu_s": min(replay_cpu), "replay_cpu_runs_s": replay_cpu,
            "peak_reserved_mib": r.peak_reserved_bytes / MiB,
        }
        if fit:
            def fitted() -> Any:
                return api.whatif(path, list(FIT_SETTINGS), fit=True)

            fit_s, fit_runs, fit_loads, w = best_of(repeats, fitted)
            out.update({
                "fit_4_settings_s": fit_s, "fit_runs_s": fit_runs, "fit_loads": fit_loads,
                "fit_target_s": 20.0, "fit_cpu_s": min(CPU_RUNS),
                "fit_cpu_runs_s": list(CPU_RUNS),
                "fit_rows": [{"setting": f.label, "min_mib": (f.min_bytes or 0) / MiB,
                              "replays": f.replays} for f in w.fit.rows]})
        return out


def oom_line(repeats: int = 5) -> dict[str, Any]:
    """The OOM explainer's expandable line while a session is recorded: at the entry bound
    (left out, said in a sentence) and at the line's own bound (replayed)."""
    from gpumem_nb.whatif import api
    from gpumem_nb.whatif.snapshot import SESSION_KEY

    out: dict[str, Any] = {"target_ms": 100.0, "max_entries_replayed": api.OOM_LINE_MAX_ENTRIES}
    for name, n, make in (("review", ENTRIES, review_history),
                          ("review", api.OOM_LINE_MAX_ENTRIES, review_history),
                          ("training", api.OOM_LINE_MAX_ENTRIES, training_history)):
        snap = snapshot_of(make(n))
        snap["gpumem_start"] = {"segments": [], "devices": {"0": {
            "total_bytes": 80 << 30, "free_bytes": 80 << 30}}}
        snap[SESSION_KEY] = {"since_us": 0.0, "dropped": 0, "max_entries": n}
        best, runs, loads, line = best_of(repeats, lambda s=snap: api.expandable_oom_line(
            s, device=0, capacity_bytes=40 << 30))
        out[f"{name}_{n}"] = {"best_ms": round(best * 1e3, 1),
                              "runs_ms": [round(x * 1e3, 1) for x in runs], "loads": loads,
                              "line": line}
    return out


def main() -> None:
    repeats = int(os.environ.get("BENCH_REPEATS", "3"))
    which = os.environ.get("BENCH_HISTORY", "review,training,oomline").split(",")
    if "oomline" in which:
        emit("bench_whatif_oom_line", oom_line())
    results = []
    start_load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if "review" in which:
        results.append(measure("review (5 sizes, a third freed)", review_history(), repeats))
    if "training" in which:
        results.append(measure("training loop", training_history(ENTRIES), repeats))
    emit("bench_whatif_bound", {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                "results": results, "load_at_start_end": [
                                    start_load, " ".join(f"{x:.2f}" for x in os.getloadavg())]})


if __name__ == "__main__":
    main()
