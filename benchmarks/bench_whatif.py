"""The allocator what-if's speed: a 100,000-entry history replayed under six settings.

Target (issue 18): at most 2 s on the 2-core development machine; the fit search (issue
25, the same six settings, each setting's smallest GPU by bisection) at most 5 s.

    python benchmarks/bench_whatif.py            # BENCH_OUT=dir also writes bench_whatif.json

The history imitates a training loop: weights and optimizer state that stay, activations
made in the forward pass and freed in reverse in the backward pass, temporaries, small
tensors, a batch size that changes now and then, and a second stream.

Two worst cases follow, each a history that used to take quadratic time: a start rebuilt
from 8,000 segments, and 8,000 requests past 8,000 unmapped holes.
"""

from __future__ import annotations

import random
import sys
import time
from typing import Any

sys.path.insert(0, ".")

from benchmarks.common import emit

MiB = 1 << 20
ENTRIES = 100_000
SETTINGS = ("", "expandable_segments:True", "max_split_size_mb:64", "max_split_size_mb:512",
            "roundup_power2_divisions:4",
            "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5")


def training_history(entries: int = ENTRIES, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    t = [0.0]
    addr = [0x7F00_0000_0000]

    def alloc(size: int, stream: int = 0) -> tuple[int, int, int]:
        a = addr[0]
        addr[0] += 1 << 24
        t[0] += 3.0
        out.append({"action": "alloc", "addr": a, "size": size, "stream": stream,
                    "time_us": t[0]})
        return a, size, stream

    def free(x: tuple[int, int, int]) -> None:
        a, size, stream = x
        t[0] += 2.0
        for action in ("free_requested", "free_completed"):
            out.append({"action": action, "addr": a, "size": size, "stream": stream,
                        "time_us": t[0]})

    weights = [alloc(rng.choice((4, 16, 64)) * MiB) for _ in range(40)]
    weights += [alloc(rng.choice((2, 8)) * MiB) for _ in range(80)]  # optimizer state
    batch = 8
    while len(out) < entries:
        if rng.random() < 0.1:
            batch = rng.choice((6, 7, 8, 9, 10))
        acts = []
        for _layer in range(24):
            acts.append(alloc(batch * rng.choice((1, 3)) * MiB + rng.randrange(0, MiB, 512)))
            tmp = alloc(batch * 2 * MiB)
            small = alloc(rng.choice((512, 4096, 65536, 700_000)))
            free(tmp)
            free(small)
            if rng.random() < 0.05:
                free(alloc(5 * MiB, stream=7))  # a side stream's buffer
        for a in reversed(acts):
            grad = alloc(a[1])
            free(a)
            free(grad)
    del weights
    return out[:entries]


def rebuilt_start_history(n: int = 8000) -> dict[str, Any]:
    """A ``_dump_snapshot`` pickle whose start must be rebuilt: ``n`` frees of allocations
    made before the history and ``n`` segments it frees without having made them (matching
    each free to its segment was quadratic: 2.8 s for n = 8000)."""
    e: list[dict[str, Any]] = []
    for k in range(1, n + 1):
        for action in ("free_requested", "free_completed"):
            e.append({"action": action, "addr": k << 30, "size": 512, "stream": 0})
    e += [{"action": "segment_free", "addr": (k << 30) + (1 << 29), "size": 2 * MiB,
           "stream": 0} for k in range(1, n + 1)]
    return {"segments": [], "device_traces": [e]}


def unmapped_holes_history(n: int = 8000) -> dict[str, Any]:
    """Under expandable segments: 2n pages, every other one freed, the cache emptied (n
    unmapped holes between live pages), then n requests of two pages; PyTorch looks for room
    from the lowest address each time (16 s for n = 8000 before the model remembered where
    the last search found it)."""
    e: list[dict[str, Any]] = []
    for a in range(1, 2 * n + 1):
        e.append({"action": "alloc", "addr": a, "size": 20 * MiB, "stream": 0})
    for a in range(1, 2 * n + 1, 2):
        e += [{"action": action, "addr": a, "size": 20 * MiB, "stream": 0}
              for action in ("free_requested", "free_completed")]
    e.append({"action": "segment_unmap", "addr": 1, "size": 20 * MiB, "stream": 0})
    e += [{"action": "alloc", "addr": 2 * n + a, "size": 40 * MiB, "stream": 0}
          for a in range(1, n + 1)]
    return {"segments": [], "device_traces": [e], "gpumem_start": {"segments": []}}


def best_of(n: int, fn: Any) -> float:
    runs = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return round(min(runs), 3)


def main() -> None:
    from gpumem_nb.whatif import whatif

    history = training_history()
    snap = {"segments": [], "device_traces": [history],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""},
            "gpumem_start": {"segments": [], "devices": {"0": {
                "total_bytes": 8 << 30, "free_bytes": 8 << 30}}}}
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        result = whatif(snap, list(SETTINGS))
        runs.append(time.perf_counter() - t0)
    emit("bench_whatif", {
        "entries": len(history), "settings": len(SETTINGS),
        "seconds": [round(x, 3) for x in runs], "best_s": round(min(runs), 3),
        "target_s": 2.0, "within_target": min(runs) <= 2.0,
        "rows": [{"setting": r.label, "peak_reserved_mib": (r.peak_reserved_bytes or 0) / MiB,
                  "end_reserved_mib": (r.end_reserved_bytes or 0) / MiB,
                  "cudaMalloc": r.segment_allocs, "cudaFree": r.segment_frees}
                 for r in result],
    })
    # The fit search (issue 25): each setting's smallest GPU, by bisection on the replay.
    fit_runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        fitted = whatif(snap, list(SETTINGS), fit=40)
        fit_runs.append(time.perf_counter() - t0)
    emit("bench_whatif_fit", {
        "entries": len(history), "settings": len(SETTINGS),
        "seconds": [round(x, 3) for x in fit_runs], "best_s": round(min(fit_runs), 3),
        "target_s": 5.0, "within_target": min(fit_runs) <= 5.0,
        "rows": [{"setting": f.label, "min_mib": (f.min_bytes or 0) / MiB,
                  "replays": f.replays} for f in fitted.fit.rows],
        "sentence": fitted.fit.sentence(),
    })
    rebuilt, holes = rebuilt_start_history(), unmapped_holes_history()
    emit("bench_whatif_worst_cases", {
        "rebuilt_start_8000_segments_s": best_of(3, lambda: whatif(rebuilt, [""])),
        "expandable_8000_holes_s": best_of(3, lambda: whatif(holes,
                                                             ["expandable_segments:True"])),
    })


if __name__ == "__main__":
    main()
