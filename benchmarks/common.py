"""Small timing helpers shared by the benchmark scripts (not tests: they print figures)."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any


def time_calls(fn: Callable[[], Any], n: int, warmup: int = 50) -> dict[str, float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    samples.sort()
    return {
        "median_us": statistics.median(samples) / 1e3,
        "p99_us": samples[int(0.99 * (len(samples) - 1))] / 1e3,
        "n": n,
    }


def emit(name: str, results: dict[str, Any]) -> None:
    print(f"== {name}")
    print(json.dumps(results, indent=2))
    out = os.environ.get("BENCH_OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(results, f, indent=2)
