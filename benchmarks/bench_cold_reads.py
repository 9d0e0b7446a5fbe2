"""Why a sampler tick costs more than a read: the same hot-path read, back to back and after
an idle 0.1 s, on the main thread and on a background thread.

On the H200 machine (a Firecracker VM), 2026-11-30, with 1,000 tensors allocated:
back to back, one read cost 40.7 µs on the main thread and 56.7 µs on a thread; after 0.1 s
of sleep, 333 µs and 339 µs; a bare 0.1 s sleep cost 60 µs of CPU. The difference is cold
caches and wake-up on that machine, not the thread: back-to-back figures are the optimistic
ones, and a tick at 10 Hz pays the cold price.

    python benchmarks/bench_cold_reads.py
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, ".")

from benchmarks.common import emit


def per_call_us(fn: Callable[[], Any], n: int = 200) -> tuple[float, float]:
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return (round((time.thread_time() - cpu0) / n * 1e6, 1),
            round((time.perf_counter() - wall0) / n * 1e6, 1))


def after_sleep_us(fn: Callable[[], Any], n: int = 50) -> tuple[float, float]:
    cpu0, wall = time.thread_time(), 0.0
    for _ in range(n):
        time.sleep(0.1)
        t0 = time.perf_counter()
        fn()
        wall += time.perf_counter() - t0
    return round((time.thread_time() - cpu0) / n * 1e6, 1), round(wall / n * 1e6, 1)


def on_thread(fn: Callable[[], Any]) -> Any:
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(fn()))
    t.start()
    t.join()
    return box[0]


def main() -> None:
    import torch

    from gpumem_nb.sources.live import LiveSource

    src = LiveSource()
    src.start()
    keep = [torch.empty(2**20 * (1 + i % 64), device="cuda") for i in range(1000)]
    torch.cuda.synchronize()

    def read() -> Any:
        return src.read(processes=False)

    cpu0 = time.thread_time()
    for _ in range(50):
        time.sleep(0.1)
    emit("bench_cold_reads", {
        "units": "(cpu_us, wall_us) per call",
        "back_to_back_main": per_call_us(read),
        "back_to_back_thread": on_thread(lambda: per_call_us(read)),
        "after_0.1s_sleep_main": after_sleep_us(read),
        "after_0.1s_sleep_thread": on_thread(lambda: after_sleep_us(read)),
        "bare_0.1s_sleep_cpu_us": round((time.thread_time() - cpu0) / 50 * 1e6, 1),
        "tensors_held": len(keep),
    })


if __name__ == "__main__":
    main()
