"""`%gpumem who --gc` and `%gpumem cleanup` on a large heap (reliability 2026-12-05 A3):
the time each takes at 1,000,000 and 5,000,000 garbage-collector-tracked objects, with one
fake GPU tensor the walk from the names does not reach (so the heap is searched) and a
stored exception (so cleanup's referrer search runs). CPU only: the fake GPU of the tests.
Each is run 3 times (a stored exception raised before each) and the least time is kept.

Two shapes of heap: ``lists``, n empty lists in a module global the walk does not enter, and
``dict``, one dict of n empty lists in the notebook's namespace (``{i: [] for i in range(n)}``,
the attack36 round's shape: 10,000,000 referents in one object).

    python benchmarks/bench_heap.py [--label before|after] [--sizes 1000000,5000000]
                                    [--shapes lists,dict]

Writes benchmarks/results/bench_heap_<label>.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _world() -> Any:
    from gpumem_nb.kernel import monitor as monitor_mod
    from gpumem_nb.sources.live import LiveSource
    from gpumem_nb.sources.nvml import NvmlSource
    from tests.fakes import FakeCuda, FakeCudaDevice, FakeGpu, FakePynvml, fake_torch

    gpu = FakeGpu("GPU-aaaa-1111")
    nvml = FakePynvml([gpu])
    cuda = FakeCuda([FakeCudaDevice("aaaa-1111")], initialized=True)
    cuda.link([gpu])
    sys.modules["torch"] = fake_torch(cuda)
    monitor_mod.make_source = lambda: LiveSource(nvml=NvmlSource(module=nvml))  # type: ignore
    return cuda


REPEATS = 3


def measure(n: int, shape: str = "lists") -> dict[str, Any]:
    from IPython.core.interactiveshell import InteractiveShell

    cuda = _world()
    ip = InteractiveShell.instance()
    ip.run_cell("%load_ext gpumem_nb", store_history=True)
    ip.user_ns["cuda"] = cuda
    # The heap: n empty lists, each tracked by the collector, none reachable from a name
    # the walk enters (a module global of a module the walk does not go into).
    holder = type(sys)("bench_heap_junk")
    if shape == "dict":
        ip.user_ns["junk"] = {i: [] for i in range(n)}
    else:
        holder.junk = [[] for _ in range(n)]  # type: ignore[attr-defined]
    holder.hidden = cuda.tensor(1 << 30)  # type: ignore[attr-defined]
    sys.modules["bench_heap_junk"] = holder
    ip.run_cell("x = cuda.tensor(1 << 20)\nraise ValueError('stored')", store_history=True)
    tracked = len(gc.get_objects())
    row: dict[str, Any] = {"objects": n, "shape": shape, "gc_tracked": tracked}
    for what, line in (("who --gc", "who --gc -o"), ("cleanup", "cleanup -o")):
        times = []
        for _ in range(REPEATS):  # the machine is shared: the least of a few is the figure
            ip.run_cell("raise ValueError('stored again')", store_history=True)
            t0 = time.perf_counter()
            try:
                ip.run_line_magic("gpumem", line)
            except Exception as e:
                row[f"{what} error"] = repr(e)
            times.append(round(time.perf_counter() - t0, 3))
        row[f"{what} s"] = min(times)
        row[f"{what} runs s"] = times
    report = ip.run_line_magic("gpumem", "who --gc -o")
    row["who --gc says"] = [line for line in str(report).splitlines()
                            if "not searched" in line or "heap" in line][:4]
    ip.run_cell("raise ValueError('stored again')", store_history=True)
    cleanup = ip.run_line_magic("gpumem", "cleanup -o")
    row["cleanup says"] = [s.did for s in cleanup.steps if s.step == "last exception"]
    del sys.modules["bench_heap_junk"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", default="after")
    ap.add_argument("--sizes", default="1000000,5000000")
    ap.add_argument("--shapes", default="lists,dict")
    ap.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--shape", default="lists", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            row = measure(args.one, args.shape)
        print(json.dumps(row))
        return
    import subprocess

    rows = []
    load_at_start = os.getloadavg()
    for shape in args.shapes.split(","):
        for n in (int(s) for s in args.sizes.split(",")):
            out = subprocess.run([sys.executable, __file__, "--one", str(n), "--shape", shape],
                                 capture_output=True, text=True, cwd=ROOT, timeout=900)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
            rows.append(json.loads(lines[-1]) if lines else {
                "objects": n, "shape": shape, "error": out.stderr[-2000:]})
            print(rows[-1], flush=True)
    result = {"label": args.label, "load_at_start": load_at_start, "load": os.getloadavg(),
              "cpus": os.cpu_count(), "rows": rows}
    path = ROOT / "benchmarks" / "results" / f"bench_heap_{args.label}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(path)


if __name__ == "__main__":
    main()
