"""In-kernel cost of the cell hooks and of %%gpumem (issue 3 budgets: <= 200 us per cell,
%%gpumem <= 1 ms), measured as get_ipython().run_cell('pass') with and without the extension
in the same process.

    python benchmarks/bench_hooks.py
"""

from __future__ import annotations

import statistics
import sys
import time

sys.path.insert(0, ".")

from benchmarks.common import emit


def cell_cost_us(ip, source: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        ip.run_cell(source, store_history=True)
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


def main(n: int = 3000) -> None:
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    results: dict[str, object] = {}
    try:
        import torch

        if torch.cuda.is_available():
            ip.user_ns["torch"] = torch
            ip.run_cell("keep = [torch.empty(2**20 * (1 + i % 64), device='cuda') "
                        "for i in range(1000)]")
            results["torch_initialized"] = torch.cuda.is_initialized()
    except ImportError:
        results["torch_initialized"] = False
    ip.run_cell("pass")
    cell_cost_us(ip, "pass", 300)  # warm up
    # Interleave blocks so drift affects both arms alike.
    without: list[float] = []
    with_ext: list[float] = []
    magic: list[float] = []
    plain_in_magic_shape: list[float] = []
    one_gpu: list[float] = []
    for _ in range(5):
        without += cell_cost_us(ip, "pass", n // 5)
        ip.run_cell("%load_ext gpumem_nb")
        ip.run_cell("%gpumem stop")  # the sampler is measured on its own in bench_sources
        with_ext += cell_cost_us(ip, "pass", n // 5)
        magic += cell_cost_us(ip, "%%gpumem -q\npass", n // 10)
        plain_in_magic_shape += cell_cost_us(ip, "%%capture\npass", n // 10)
        if ip.run_cell("%gpumem config --device 0").success:  # one GPU, on any host
            one_gpu += cell_cost_us(ip, "pass", n // 5)
            ip.run_cell("%gpumem config --device all")
        ip.run_cell("%unload_ext gpumem_nb")
    med = statistics.median
    results.update({
        "run_cell_pass_without_us": med(without),
        "run_cell_pass_with_us": med(with_ext),
        "hooks_added_us": med(with_ext) - med(without),
        "hooks_added_device_0_only_us": (med(one_gpu) - med(without)) if one_gpu else None,
        "cell_magic_gpumem_q_pass_us": med(magic),
        "cell_magic_capture_pass_us": med(plain_in_magic_shape),
        "gpumem_cell_magic_added_over_capture_us": med(magic) - med(plain_in_magic_shape),
        "n_per_arm": len(without),
    })
    emit("bench_hooks", results)


if __name__ == "__main__":
    main()
