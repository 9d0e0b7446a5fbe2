"""What ``%gpumem cleanup --dry-run`` says empty_cache would give back, against what it gives
back, on the GPU machine, under each allocator backend; and the CUDA context's size as
LiveSource measures it (``idle_process_bytes``) against NVML's own listing.

    OUT=/some/dir python benchmarks/gpu_emptycache.py            # the GPU machine, <= 150 s
    OUT=/tmp/dry python benchmarks/gpu_emptycache.py --dry-run   # anywhere: CPU, the fakes

One fresh process per setting (defaults, ``expandable_segments:True``,
``backend:cudaMallocAsync``), each running three cases:

1. **context**: one tensor allocated, freed and emptied; then a LiveSource reading, which
   notes this process's NVML figure while PyTorch holds nothing.
2. **holes**: a 40 GiB tensor freed, 40 tensors of 1 GiB made in its place, every other one
   freed: 20 free holes of 1 GiB in a segment that still holds tensors (the H200 case of
   issue 20's review). The dry run's estimate, then ``empty_cache()``'s real drop in reserved.
   Native: both must be 0 B. Expandable segments: the estimate is the whole free 20 MiB pages
   and must equal the drop. cudaMallocAsync: the estimate is reserved - allocated, an upper
   bound of the pool's trim.
3. **whole**: everything freed: the estimate and the drop are the whole cache.

Results go to ``$OUT/emptycache_h200.json`` (one object per case, rewritten after each) and
``$OUT/emptycache_log.txt``. Nothing is asserted here; ``agrees`` says whether the estimate was
right by the backend's rule (equal, or for cudaMallocAsync at least the drop).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MiB, GiB = 1 << 20, 1 << 30
SETTINGS = ("", "expandable_segments:True", "backend:cudaMallocAsync")
CHILD_TIMEOUT_S = 45
RESULTS, LOG = "emptycache_h200.json", "emptycache_log.txt"


# ------------------------------------------------------------------------------------------
# The child: one allocator setting, real torch (or the test fakes for --dry-run)
# ------------------------------------------------------------------------------------------
class Device:
    """Tensors of ``nbytes`` on GPU 0, and the calls the cases need."""

    def __init__(self, dry: bool, setting: str) -> None:
        self.dry = dry
        if dry:
            from tests.fakes import (
                FakeCuda,
                FakeCudaDevice,
                FakeGpu,
                FakePynvml,
                fake_torch,
            )

            backend = "cudaMallocAsync" if "cudaMallocAsync" in setting else "native"
            self.cuda = FakeCuda([FakeCudaDevice("aaaa-1111")], initialized=True,
                                 backend=backend)
            self.cuda.expandable = "expandable_segments:True" in setting
            gpu = FakeGpu("GPU-aaaa-1111")
            self.cuda.link([gpu])
            sys.modules["torch"] = fake_torch(self.cuda)
            self.nvml: Any = FakePynvml([gpu])
        else:
            import torch

            torch.zeros(1, device="cuda:0")  # CUDA up, as the user's code would start it
            self.torch = torch
            self.nvml = None

    def tensor(self, nbytes: int) -> Any:
        if self.dry:
            return self.cuda.tensor(nbytes)
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda:0")

    def empty_cache(self) -> None:
        if self.dry:
            self.cuda.empty_cache()
        else:
            self.torch.cuda.empty_cache()

    def stats(self) -> dict[str, int]:
        if self.dry:
            d = self.cuda.devices[0]
            return {"allocated": d.allocated, "reserved": d.reserved,
                    "inactive_split": d.inactive_split}
        s = self.torch.cuda.memory_stats(0)
        return {"allocated": s.get("allocated_bytes.all.current", 0),
                "reserved": s.get("reserved_bytes.all.current", 0),
                "inactive_split": s.get("inactive_split_bytes.all.current", 0)}


def nvml_process_bytes(dev: Device) -> int | None:
    """NVML's own figure for this process on GPU 0 (None where PIDs are another namespace's)."""
    if dev.dry:
        nv = dev.nvml
    else:
        import pynvml as nv
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    listing = (getattr(nv, "nvmlDeviceGetComputeRunningProcesses", None)
               or nv.nvmlDeviceGetComputeRunningProcesses_v3)
    mine = [p.usedGpuMemory for p in listing(h) if p.pid == os.getpid()]
    return int(mine[0]) if mine and mine[0] is not None else None


def source(dev: Device) -> Any:
    from gpumem_nb.sources.live import LiveSource
    from gpumem_nb.sources.nvml import NvmlSource

    if dev.dry:
        return LiveSource(nvml=NvmlSource(module=dev.nvml))
    return LiveSource()


def dry_run_estimate(src: Any) -> dict[str, Any]:
    """``%gpumem cleanup --dry-run``'s empty_cache row, as the magic computes it."""
    from gpumem_nb import cleanup

    shell = SimpleNamespace(user_ns={}, user_ns_hidden={}, displayhook=None)
    t = time.perf_counter()
    report = cleanup.run(cleanup.CleanupRequest(dry_run=True), shell=shell, measure=src.read)
    took = time.perf_counter() - t
    row = next((s for s in report.steps if s.step == "empty_cache"), None)
    return {"estimate_bytes": row.freed_reserved_bytes if row else None,
            "did": row.did if row else None, "brief": row.brief if row else None,
            "dry_run_s": round(took, 4)}


def case(dev: Device, src: Any, name: str) -> dict[str, Any]:
    before = dev.stats()
    out: dict[str, Any] = {"case": name, "before": before}
    out.update(dry_run_estimate(src))
    from gpumem_nb.emptycache import from_stats
    from gpumem_nb.model import AllocatorReading

    out["stats_rule_bytes"] = from_stats(AllocatorReading(
        before["allocated"], before["reserved"], before["allocated"], before["inactive_split"],
        0, 0, 0, 0))
    dev.empty_cache()
    after = dev.stats()
    out["after"] = after
    out["freed_bytes"] = before["reserved"] - after["reserved"]
    return out


def child(setting: str, dry: bool) -> list[dict[str, Any]]:
    scale = MiB if dry else GiB
    dev = Device(dry, setting)
    src = source(dev)
    rows: list[dict[str, Any]] = []

    # 1. the context, measured while PyTorch holds nothing
    x = dev.tensor(scale)
    del x
    dev.empty_cache()
    src.read()
    rows.append({"case": "context", "idle_process_bytes": src.idle_process_bytes.get(0),
                 "nvml_process_bytes": nvml_process_bytes(dev), "stats": dev.stats()})

    # 2. holes: 20 free 1 GiB blocks in a 40 GiB segment that still holds tensors
    big = dev.tensor(40 * scale)
    del big  # the 40 GiB segment stays cached
    blocks = [dev.tensor(scale) for _ in range(40)]
    for i in range(0, 40, 2):
        blocks[i] = None
    row = case(dev, src, "holes")
    rows.append(row)

    # 3. whole: nothing left in any segment
    blocks.clear()
    rows.append(case(dev, src, "whole"))
    return rows


def agrees(setting: str, row: dict[str, Any]) -> bool | None:
    est, freed = row.get("estimate_bytes"), row.get("freed_bytes")
    if est is None or freed is None:
        return None
    if "cudaMallocAsync" in setting:
        return est >= freed
    return est == freed


# ------------------------------------------------------------------------------------------
# The parent: one fresh process per setting, results flushed after each
# ------------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.dry_run)))
        return 0
    out_dir = os.environ.get("OUT") or "/tmp/gpu_emptycache"
    os.makedirs(out_dir, exist_ok=True)
    results: dict[str, Any] = {"dry_run": args.dry_run, "settings": {}}
    with open(os.path.join(out_dir, LOG), "a", encoding="utf-8") as log:
        t0 = time.monotonic()
        for setting in SETTINGS:
            entry = run_setting(setting, args.dry_run, log)
            entry["wall_s"] = round(time.monotonic() - t0, 1)
            results["settings"][setting or "defaults"] = entry
            with open(os.path.join(out_dir, RESULTS), "w", encoding="utf-8") as f:
                json.dump(results, f, indent=1)
            log.flush()
            print(f"{setting or 'defaults'}: {json.dumps(entry)[:600]}", flush=True)
    return 0


def run_setting(setting: str, dry: bool, log: Any) -> dict[str, Any]:
    env = dict(os.environ, PYTORCH_ALLOC_CONF=setting,
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, __file__, "--child", setting] + (["--dry-run"] if dry else [])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              timeout=CHILD_TIMEOUT_S)
    except Exception as e:  # a hung or crashed child: the other settings still run
        return {"error": f"{type(e).__name__}: {e}"}
    log.write(f"== {setting or 'defaults'} rc={done.returncode}\n{done.stderr[-4000:]}\n")
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    for r in rows:
        if "estimate_bytes" in r:
            r["agrees"] = agrees(setting, r)
    return {"rows": rows}


if __name__ == "__main__":
    sys.exit(main())
