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


# --------------------------------------------------------------------------------------------
# Summaries and run metadata (bench_kernel.py)
# --------------------------------------------------------------------------------------------
def percentile(sorted_samples: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on sorted data."""
    if not sorted_samples:
        return float("nan")
    pos = (len(sorted_samples) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_samples) - 1)
    return sorted_samples[lo] + (sorted_samples[hi] - sorted_samples[lo]) * (pos - lo)


def summarize(samples: list[float], digits: int = 1) -> dict[str, float | int]:
    """n, median, p90, mean, min, max of one list of samples (same unit in, same unit out)."""
    s = sorted(samples)
    if not s:
        return {"n": 0}
    return {
        "n": len(s),
        "median": round(statistics.median(s), digits),
        "p90": round(percentile(s, 0.9), digits),
        "mean": round(statistics.fmean(s), digits),
        "min": round(s[0], digits),
        "max": round(s[-1], digits),
    }


def git_commit(repo: str) -> str | None:
    """HEAD of the checkout being measured, with '-dirty' for uncommitted changes; the
    BENCH_COMMIT variable stands in where the tree was copied without .git."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return os.environ.get("BENCH_COMMIT")
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=repo, capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("BENCH_COMMIT")


def gpu_environment() -> dict[str, Any]:
    """GPU names, count and driver from NVML (never from torch: no CUDA context here)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:
        return {"gpu_count": 0, "gpus": [], "driver": None, "nvml": f"unavailable: {e}"}
    try:
        n = pynvml.nvmlDeviceGetCount()
        names = []
        for i in range(n):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        return {"gpu_count": n, "gpus": names, "driver": driver, "nvml": "ok"}
    finally:
        pynvml.nvmlShutdown()
