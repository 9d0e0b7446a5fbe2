"""Where a cleanup after a CUDA out-of-memory error stops: on the H200 at 141344a,
`%gpumem cleanup` after tutorial 04's and 11's OOMs never returned from the `gc.collect()`
that follows dropping the stored exception (cleanup.py's ``record``; faulthandler showed no
Python frame above it, so the wait is in C: a tensor's deallocation, or the collector).

Each variant runs in a fresh process, an IPython shell without a kernel, with a timeout; on a
timeout the process's Python stacks (faulthandler) and its native ones (gdb where installed,
else ``native_stacks.dump``: /proc states, a signal-driven backtrace, py-spy) are saved in
OUT. A variant is LOAD:WORKLOAD:ACTION: gpumem_nb loaded or not; a plain tensor kept by the
failing frame ("empty") or tutorial 04-41's MLP whose activations outgrow the GPU ("mlp"); the
stored exception dropped by hand and collected ("gc") or ``%gpumem cleanup``:

    python3 benchmarks/gpu_cleanup_hang.py OUT [--timeout-s 60] [VARIANT ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from native_stacks import arm_source, dump  # noqa: E402

EMPTY = '''
import torch
free, total = torch.cuda.mem_get_info()
def step():
    kept = torch.empty(int(free * 0.5), dtype=torch.uint8, device="cuda")
    more = torch.empty(int(free * 0.6), dtype=torch.uint8, device="cuda")
    return kept, more
'''

MLP = '''
import torch
from torch import nn
total = torch.cuda.mem_get_info()[1]
mlp = nn.Sequential(*[nn.Linear(8192, 8192) for _ in range(8)]).cuda()
def mlp_step(batch):
    x = torch.randn(batch, 8192, device="cuda")
    mlp(x).square().mean().backward()
mlp_step(1024)
mlp.zero_grad(set_to_none=True)
big_batch = 4 * total // (8 * 8192 * 4) // 1024 * 1024
'''

DROP = '''
import sys, gc
for n in ("last_exc", "last_type", "last_value", "last_traceback"):
    if hasattr(sys, n): delattr(sys, n)
get_ipython().InteractiveTB.tb = None
gc.collect()
print("collected; allocated now", torch.cuda.memory_allocated())
'''

CHILD = r'''
import faulthandler, os, sys, time
exec(os.environ["HANG_ARM"])
faulthandler.dump_traceback_later(float(os.environ["HANG_DUMP_S"]), repeat=True,
                                  file=open(os.environ["HANG_STACKS"], "w"))
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
load, workload, action = os.environ["HANG_VARIANT"].split(":")
def cell(src):
    t = time.perf_counter(); ip.run_cell(src)
    print(f"[{time.perf_counter() - t:.2f} s] {src.strip().splitlines()[0][:70]}", flush=True)
if load == "loaded":
    cell("%load_ext gpumem_nb")
cell(os.environ["HANG_" + workload.upper()])
cell("step()" if workload == "empty" else "mlp_step(big_batch)")
cell("x = 1")
cell(os.environ["HANG_DROP"] if action == "gc" else "%gpumem cleanup")
print("DONE", flush=True)
'''

VARIANTS = {
    "plain": "plain:empty:gc", "loaded_gc": "loaded:empty:gc", "loaded": "loaded:empty:cleanup",
    "mlp_plain": "plain:mlp:gc", "mlp_loaded_gc": "loaded:mlp:gc",
    "mlp_loaded": "loaded:mlp:cleanup",
}


def native_stacks(pid: int, out: Path, signalled: Path) -> str:
    gdb = shutil.which("gdb")
    if gdb is None:
        return dump(pid, out, signalled)
    r = subprocess.run([gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt 30"],
                       capture_output=True, text=True, timeout=60)
    out.write_text(r.stdout + r.stderr)
    return str(out)


def run(variant: str, out: Path, timeout_s: float) -> dict[str, object]:
    stacks = out / f"stacks_{variant}.txt"
    signalled = out / f"signalled_{variant}.txt"
    env = {**os.environ, "HANG_VARIANT": VARIANTS[variant], "HANG_STACKS": str(stacks),
           "HANG_ARM": arm_source(signalled), "HANG_EMPTY": EMPTY, "HANG_MLP": MLP,
           "HANG_DROP": DROP, "HANG_DUMP_S": str(max(5.0, timeout_s / 3)),
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        text, _ = p.communicate(timeout=timeout_s)
        hung = False
    except subprocess.TimeoutExpired:
        hung = True
        native = native_stacks(p.pid, out / f"native_{variant}.txt", signalled)
        p.kill()
        text, _ = p.communicate()
        text += f"\n(hung; native stacks: {native})"
    row = {"variant": variant, "hung": hung, "wall_s": round(time.monotonic() - t0, 1),
           "done": "DONE" in text, "tail": text[-3000:]}
    print(json.dumps(row)[:4000], flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--timeout-s", type=float, default=60)
    a = ap.parse_intermixed_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows = [run(v, a.out, a.timeout_s) for v in a.variants]
    (a.out / "cleanup_hang.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
