"""The dry run of an advised cut (``holders/verify.py``) among a million tracked objects: `del
flush_loop` for an event loop whose scheduled callbacks keep the tensors (KINDS7's
event_loop_call_later_args). The search climbs through the loop's own parts, which refer to
each other; each level was one heap pass, and on the H100 the check's 0.3 s ran out.

    python benchmarks/bench_cut_check.py [--objects 1000000] [--repeat 3]

No GPU or torch is needed: the tensors are the test suite's fakes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import emit

GiB = 1 << 30


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--objects", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    from gpumem_nb.holders import Scanner
    from gpumem_nb.holders.retention import RootContext
    from gpumem_nb.holders.verify import check_cuts
    from tests.fakes import FakeTensor, fake_torch

    class Rec:
        def __init__(self, i: int) -> None:
            self.i = i
            self.tags = [i]

    gc.disable()
    ns: dict[str, Any] = {"filler": [Rec(i) for i in range(args.objects // 2)]}
    loop = asyncio.new_event_loop()
    for epoch in range(4):
        loop.call_later(600, print, FakeTensor(GiB), f"/tmp/preds_{epoch}.pt")
    ns["flush_loop"] = loop
    del loop
    tracked = len(gc.get_objects())
    storage_of = Scanner({"torch": fake_torch()})._tensor_info
    runs: list[float] = []
    check: Any = None
    for _ in range(args.repeat):
        tensors = [o for o in gc.get_objects() if type(o) is FakeTensor]
        t0 = time.perf_counter()
        check = check_cuts({"flush_loop": tensors}, {"flush_loop": ["flush_loop"]},
                           RootContext(user_ns=ns), storage_of, budget_s=10.0)["flush_loop"]
        runs.append(time.perf_counter() - t0)
        tensors.clear()
    ns["flush_loop"].close()
    emit("bench_cut_check", {
        "tracked_objects": tracked,
        "cpus": os.cpu_count(),
        "load_1min": os.getloadavg()[0],
        "check_s": [round(x, 3) for x in runs],
        "checked": not check.why,
        "collect": check.collect,
        "others": [r.name for r in check.others],
    })


if __name__ == "__main__":
    main()
