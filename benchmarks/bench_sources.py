"""Cost of one sample, of each source, of the sampler thread, and of `import gpumem_nb`.

Budgets (issue 2): one sample of every source for one GPU <= 150 us median with torch
initialised and holding tensors; the sampler at 10 Hz < 0.5% of a core; import < 150 ms.

    python benchmarks/bench_sources.py
"""

from __future__ import annotations

import subprocess
import sys
import time

sys.path.insert(0, ".")

from benchmarks.common import emit, time_calls


def import_time_ms(runs: int = 7) -> float:
    best = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c",
             "import time; t=time.perf_counter(); import gpumem_nb; "
             "print((time.perf_counter()-t)*1e3)"],
            capture_output=True, text=True, check=True)
        best.append(float(out.stdout))
    return sorted(best)[len(best) // 2]


def main() -> None:
    results: dict[str, object] = {"import_gpumem_nb_ms_median": import_time_ms()}
    from gpumem_nb.sampler import Sampler
    from gpumem_nb.sources.live import LiveSource

    src = LiveSource()
    src.start()
    tensors = []
    try:
        import torch

        if torch.cuda.is_available():
            # Torch initialised and holding many tensors, as a training notebook would be.
            tensors = [torch.empty((1 << 20) * (1 + i % 64), device="cuda")
                       for i in range(1000)]
            torch.cuda.synchronize()
            results["torch_stats_nested_dict"] = time_calls(
                lambda: torch.cuda.memory.memory_stats_as_nested_dict(0), 2000)
            results["torch_memory_stats_flat"] = time_calls(
                lambda: torch.cuda.memory_stats(0), 2000)
            results["torch_memory_allocated"] = time_calls(
                lambda: torch.cuda.memory_allocated(0), 2000)
    except ImportError:
        pass
    dev = src.device_ids()[0] if src.device_ids() else None
    if dev is not None:
        h = src.nvml._handles[dev.nvml_index]
        results["nvml_memory_v2"] = time_calls(lambda: src.nvml._memory(h), 2000)
        results["nvml_processes"] = time_calls(lambda: src.nvml._list_processes(h), 2000)
    results["host_rss"] = time_calls(src.host.rss_bytes, 2000)
    results["one_sample_with_process_listing"] = time_calls(
        lambda: src.read(processes=True), 2000)
    results["one_sample_hot_path"] = time_calls(lambda: src.read(processes=False), 2000)
    results["gpus"] = len(src.device_ids())
    results["tensors_held"] = len(tensors)

    # The process's CPU with no sampler, then with one at 10 Hz: the difference is ours.
    # Other threads (CUDA's, torch's) also burn CPU, hence the baseline.
    t_cpu, t_wall = time.process_time(), time.monotonic()
    time.sleep(20)
    idle_pct = 100 * (time.process_time() - t_cpu) / (time.monotonic() - t_wall)
    sampler = Sampler(src, interval_s=0.1)
    t_cpu, t_wall = time.process_time(), time.monotonic()
    sampler.start()
    time.sleep(20)
    sampler.stop()
    cpu_s, wall_s = time.process_time() - t_cpu, time.monotonic() - t_wall
    results["sampler_10hz"] = {
        "ticks": sampler.ticks, "wall_s": round(wall_s, 2),
        "sampler_thread_cpu_s": round(sampler.cpu_s, 4),
        "sampler_thread_percent_of_one_core": round(100 * sampler.cpu_s / wall_s, 3),
        "process_percent_with_sampler": round(100 * cpu_s / wall_s, 3),
        "process_percent_idle_baseline": round(idle_pct, 3),
        "mean_tick_us": round(1e6 * sampler.cpu_s / max(sampler.ticks, 1), 1),
    }
    emit("bench_sources", results)


if __name__ == "__main__":
    main()
