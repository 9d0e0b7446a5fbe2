"""What naming the kernel's children costs the sampler (issue 19), on any machine.

The sampler classifies only the PIDs NVML lists besides its own, so the usual cost is nil; this
times the case with children on the GPU: ``ProcessTree.children_of`` for 1 and 8 forked
children (each a /proc ancestry walk; roles cached by PID and start time), the first call
(cmdline and environ read) and the cached one, an unrelated PID, and ``learn_roles`` (on
demand, main thread only: one collector walk) without and with torch's modules present, and
again for children already looked for (no walk).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import emit, time_calls
from gpumem_nb.sources.processes import ProcessTree


def main() -> None:
    ctx = multiprocessing.get_context("fork")
    kids = [ctx.Process(target=time.sleep, args=(120,), daemon=True) for _ in range(8)]
    for k in kids:
        k.start()
    try:
        results = {}
        for n in (1, 8):
            listing = [(k.pid, 1 << 30) for k in kids[:n]]
            t0 = time.perf_counter_ns()
            ProcessTree().children_of(listing)
            results[f"first_call_{n}_children_us"] = (time.perf_counter_ns() - t0) / 1e3
            tree = ProcessTree()
            tree.children_of(listing)
            results[f"cached_{n}_children"] = time_calls(lambda t=tree, li=listing:
                                                         t.children_of(li), 2000)
        tree = ProcessTree()
        other = os.getppid()  # a process that is not ours (our parent)
        results["unrelated_pid"] = time_calls(lambda: tree.children_of([(other, 1 << 30)]),
                                              2000)
        results["learn_roles"] = time_calls(tree.learn_roles, 20, warmup=2)
        results["gc_objects"] = len(__import__("gc").get_objects())
        try:  # torch's modules present: its classes to look for, and its objects to walk
            import torch.multiprocessing.spawn
            import torch.utils.data.dataloader  # noqa: F401
        except ImportError:
            pass
        else:
            tree = ProcessTree()
            results["learn_roles_torch"] = time_calls(tree.learn_roles, 20, warmup=2)
            pids = [k.pid for k in kids]
            # Each child looked for once: the OOM explainer's and %gpumem's later calls.
            results["learn_roles_torch_again"] = time_calls(lambda: tree.learn_roles(pids),
                                                            200, warmup=1)
            results["gc_objects_torch"] = len(__import__("gc").get_objects())
        emit("bench_children", results)
    finally:
        for k in kids:
            k.terminate()
            k.join(5)


if __name__ == "__main__":
    main()
