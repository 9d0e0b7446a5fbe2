"""A shortened soak: many cells with the sampler fast and the chart shown. One sampler
thread, buffers at their caps, and the RSS cost per cell printed (with against without).

The full-length run (10,000 cells) is ``GPUMEM_NB_SOAK_CELLS=10000 pytest tests/test_soak.py``.
"""

from __future__ import annotations

import gc
import os
import threading
from typing import Any

import pytest

from gpumem_nb.kernel import current_monitor

pytestmark = pytest.mark.slow  # hundreds of cells in one session

CELLS = int(os.environ.get("GPUMEM_NB_SOAK_CELLS", "1500"))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def sampler_threads() -> int:
    return sum(t.name.startswith("gpumem_nb") and t.is_alive() for t in threading.enumerate())


def run_cells(shell: Any, n: int, tick: Any = None) -> int:
    """RSS growth over ``n`` cells after a warm-up, with the sampler ticking between cells."""
    for i in range(50):
        shell.run_cell(f"v = {i}", store_history=True)
    gc.collect()
    start = rss_bytes()
    for i in range(n):
        shell.run_cell(f"v = {i}", store_history=True)
        if tick is not None and i % 4 == 0:
            tick()
    gc.collect()
    return rss_bytes() - start


def test_soak_keeps_one_thread_bounded_buffers_and_little_memory_per_cell(
        shell, fake_gpu, capsys):
    without = run_cells(shell, CELLS)
    shell.run_cell("%load_ext gpumem_nb")
    shell.run_cell("%gpumem config --interval 0.05")
    shell.run_cell("%gpumem watch")
    mon = current_monitor(shell)
    mon.history._records = type(mon.history._records)(maxlen=200)  # reach the cap quickly
    mon.cells.marks = type(mon.marks)(maxlen=300)
    with_ext = run_cells(shell, CELLS, tick=mon.sampler.tick)
    assert sampler_threads() == 1
    assert len(mon.history) == 200 and len(mon.marks) == 300
    assert len(mon.cells._done) <= 64
    widget = mon.widget
    assert all(tl.n <= tl.capacity for tl in widget.timelines.values())
    per_10k = (with_ext - without) / CELLS * 10_000
    with capsys.disabled():
        print(f"\nsoak: {CELLS} cells, {mon.sampler.ticks} sampler ticks, "
              f"{widget.draws} chart draws; RSS growth without {without / 2**20:.2f} MiB, "
              f"with {with_ext / 2**20:.2f} MiB; extension's share per 10k cells "
              f"{per_10k / 2**20:+.1f} MiB")
    # Bounded buffers: once they are full, memory must not keep climbing with cells.
    assert per_10k < 64 * 2**20
