"""The retention search over a heap of a million tracked objects (`%gpumem who --gc`, and the
OOM explainer's search for what the walk from the names missed): at most 1 s on the 2-core
development machine.

    python benchmarks/bench_retention.py [--objects 1000000]

No GPU or torch is needed: the tensors are the test suite's fakes, each standing for GPU
memory, placed where the walk from the names cannot reach them (a module's global, a class
attribute, a queue, an object array in an untracked dict, a live thread's locals, reference
cycles), among a million tracked objects that hold nothing.
"""

from __future__ import annotations

import argparse
import gc
import os
import queue
import sys
import threading
import time
import types
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import emit

GiB = 1 << 30


def build(n_objects: int) -> tuple[dict[str, Any], Any]:
    from tests.fakes import FakeTensor

    # Tracked objects that hold no tensor: dicts, lists and instances, as a notebook's
    # libraries and data make them.
    class Rec:
        def __init__(self, i: int) -> None:
            self.i = i
            self.tags = [i]

    filler = [Rec(i) for i in range(n_objects // 2)]
    ns: dict[str, Any] = {"filler": filler}
    featcache = types.ModuleType("featcache_bench")
    featcache.store = [FakeTensor(GiB) for _ in range(3)]  # type: ignore[attr-defined]
    sys.modules["featcache_bench"] = featcache
    ns["featcache"] = featcache
    q: queue.Queue[Any] = queue.Queue()
    for _ in range(4):
        q.put(FakeTensor(GiB))
    ns["q"] = q
    import numpy as np

    col = np.empty(5, dtype=object)
    col[2] = FakeTensor(2 * GiB)
    ns["frame"] = {"emb": col}

    class Node:
        pass

    for _ in range(3):
        n = Node()
        n.me = n  # type: ignore[attr-defined]
        n.t = FakeTensor(GiB)  # type: ignore[attr-defined]
    stop = threading.Event()

    def prefetch() -> None:
        batches = [FakeTensor(GiB) for _ in range(2)]  # noqa: F841
        stop.wait(60)

    th = threading.Thread(target=prefetch, name="prefetch", daemon=True)
    th.start()
    return ns, stop


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--objects", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    from gpumem_nb.holders import Scanner
    from gpumem_nb.holders.retention import RootContext
    from tests.fakes import fake_torch

    gc.disable()  # the cycles stay uncollected, as in a loop that made them
    ns, stop = build(args.objects)
    time.sleep(0.2)
    tracked = len(gc.get_objects())
    runs = []
    found: list[Any] = []
    for _ in range(args.repeat):
        scanner = Scanner({"torch": fake_torch()})
        t0 = time.perf_counter()
        found = scanner.scan(ns, include_gc=True, roots=RootContext(user_ns=ns))
        runs.append(time.perf_counter() - t0)
    stop.set()
    search = scanner.search
    emit("bench_retention", {
        "tracked_objects": tracked,
        "cpus": os.cpu_count(),
        "load_1min": os.getloadavg()[0],
        "who_gc_s": [round(x, 3) for x in runs],
        "search_s": round(search.elapsed_s, 3) if search else None,
        "search_levels": search.levels if search else None,
        "holders": [(h.name, h.kind, h.nbytes, h.code) for h in found],
    })


if __name__ == "__main__":
    main()
