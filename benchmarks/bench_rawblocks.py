"""What the raw-block pass of the OOM explanation costs (``oom/rawpart.py``): on a heap of
1,000,000 tracked objects, with fake segments of many blocks, holders with many storages, this
process's own modules (IPython and the project loaded) and a helper module keeping raw
pointers. The pass reads no object of the heap: its cost is the segments' blocks, the holders'
storages and the namespaces' dicts. Also what the explained case pays: one ledger, no read.

    PYTHONPATH=$PWD python benchmarks/bench_rawblocks.py
"""

from __future__ import annotations

import statistics
import sys
import time
import types
from typing import Any

GiB, MiB = 1 << 30, 1 << 20
BASE = 0x7F00_0000_0000


def main() -> None:
    import IPython  # noqa: F401  (a notebook's modules, for the globals the search reads)

    import gpumem_nb  # noqa: F401
    from gpumem_nb.ledger import ledger
    from gpumem_nb.model import Holder
    from gpumem_nb.oom.rawpart import find_raw_blocks, raw_lines, with_raw_blocks

    heap = [{"i": i} for i in range(1_000_000)]  # the tracked objects a session carries
    # 2,000 segments of 10 blocks of 2 MiB: 20,000 allocated blocks, 19,990 under tensors.
    segments: list[dict[str, Any]] = []
    storages = []
    at = BASE
    for _ in range(2000):
        blocks = [{"size": 2 * MiB, "state": "active_allocated"} for _ in range(10)]
        segments.append({"device": 0, "address": at, "total_size": 20 * MiB,
                         "blocks": blocks})
        storages += [(at + k * 2 * MiB, 2 * MiB) for k in range(10)]
        at += 20 * MiB
    raw = storages[-10:]  # the last 10 blocks: raw workspaces
    storages = storages[:-10]
    chunks = [tuple(storages[i:i + 1000]) for i in range(0, len(storages), 1000)]
    holders = [Holder(name=f"t{i}", kind="variable", device="cuda:0",
                      nbytes=2 * MiB * len(chunk), storages=chunk)
               for i, chunk in enumerate(chunks)]
    kernels = types.ModuleType("bench_raw_kernels")
    kernels._WORKSPACES = {f"attn{i}": a for i, (a, _) in enumerate(raw)}  # type: ignore[attr-defined]
    sys.modules["bench_raw_kernels"] = kernels
    ns = {f"v{i}": i for i in range(2000)}
    ns["kernels"] = kernels  # type: ignore[assignment]
    allocated = 2 * MiB * 20_000
    led0 = ledger("cuda:0", allocated, holders)
    print(f"heap {len(heap):,} objects, {len(sys.modules):,} modules, "
          f"{sum(len(s['blocks']) for s in segments):,} blocks, "
          f"{sum(len(h.storages) for h in holders):,} storages; "
          f"not found {led0.not_found_bytes / MiB:.0f} MiB")
    times = []
    for _ in range(7):
        t = time.perf_counter()
        blocks = find_raw_blocks(segments, 0, holders, ns, sys.modules)
        led = with_raw_blocks(led0, blocks)
        lines = raw_lines(blocks)
        times.append(time.perf_counter() - t)
    named = sum(1 for b in blocks if b.path)
    print(f"raw-block pass: median {statistics.median(times) * 1e3:.1f} ms, "
          f"max {max(times) * 1e3:.1f} ms; {len(blocks)} blocks, {named} named, "
          f"{len(lines)} line(s); not found after {led.not_found_bytes / MiB:.0f} MiB")
    # The explained case: one ledger, then nothing (shows_not_found is False).
    explained = ledger("cuda:0", allocated - 20 * MiB, holders)
    times = []
    for _ in range(7):
        t = time.perf_counter()
        ledger("cuda:0", allocated - 20 * MiB, holders)
        times.append(time.perf_counter() - t)
    print(f"explained case (shows_not_found={explained.shows_not_found}): the ledger check "
          f"{statistics.median(times) * 1e3:.3f} ms")
    del heap


if __name__ == "__main__":
    main()
