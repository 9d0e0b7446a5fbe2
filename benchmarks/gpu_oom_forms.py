"""Every form of running out of GPU memory this machine can produce, and what gpumem_nb says
for each (issue 36): the exception's type and message, the explanation's kind, whether it says
the kernel must restart, its first action, and whether that action recovered.

    python3 benchmarks/gpu_oom_forms.py --out $OUT [--budget-s 240] [--form-timeout-s 45]
        [--only FORM,...]
    python3 benchmarks/gpu_oom_forms.py --dry-run [--out DIR]

Each form runs in its own child process (several leave CUDA unusable): a real IPython shell
(``IPython.testing.globalipapp.start_ipython``, as ``gpu_diagnosis3.py``'s child) with
``%load_ext gpumem_nb``, the form's setup cells, then its failing cell; the explanation is
``current_monitor(ip).oom.last``. Then a probe cell (``torch.zeros(1, device='cuda')``) says
whether CUDA still works, and where the explanation's first action is ``%gpumem cleanup`` it
is run and the failing cell run again (``recovered``). Sizes come from
``torch.cuda.mem_get_info()``. CuPy and JAX forms run only where they import, else their row
says "not installed". A form whose setup does not produce an error says so
(``produced: false``) with whatever it did raise.

Writes ``oom_forms_<card>.json`` and ``oom_forms_<card>.md`` (a table) under ``--out`` after
every form, so a timeout keeps the rows so far. The whole run stays within ``--budget-s``
(default 240 s): a form that would start past it is recorded as skipped. Expected: about 12 s
per form (child start, torch and IPython import, the extension's load) and 10 forms, about
2-3 minutes on an H100 or H200.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

ROW = "OOMFORM-ROW "
MiB = 1 << 20

# Cells run in the child's shell. Names every cell may use: torch, G (the GPU's total bytes),
# MiB, and fill(margin): allocates what is free less ``margin`` bytes then frees it, so that
# PyTorch's cache holds it (reserved, unallocated) and CUDA has ``margin`` left.
# In halving chunks, not one block: one block of "free less margin" fails on the H200, as the
# allocator rounds it up past what is free (139.19 GiB asked, 139.19 GiB free).
FILL_SRC = """
def fill(margin, keep=False):
    torch.cuda.synchronize()
    xs = []
    chunk = 1 << 30
    while chunk >= 2 * MiB:
        if torch.cuda.mem_get_info()[0] - chunk < margin:
            chunk //= 2
            continue
        try:
            xs.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            chunk //= 2
    if keep:
        return xs
    del xs
    return None
"""


@dataclass(frozen=True)
class Form:
    name: str
    expect: str  # the form of error the cells are meant to produce
    setup: tuple[str, ...]
    fail: str
    env: tuple[tuple[str, str], ...] = ()
    needs: str = ""  # a module that must import ("cupy", "jax")
    hog_free_bytes: int | None = None  # a second process takes all but this much first
    source: str = ""  # where the form's message text comes from, for forms seldom produced


FORMS: tuple[Form, ...] = (
    Form("torch allocator", "torch.OutOfMemoryError (the baseline)", (),
         "x = torch.empty(2 * G, dtype=torch.uint8, device='cuda')"),
    Form("cuda runtime: context", "CUDA error: out of memory at CUDA's start-up",
         (), "torch.zeros(1, device='cuda')", hog_free_bytes=64 * MiB,
         source="c10/cuda/CUDAException.cpp"),
    Form("cuda runtime: capped cat", "torch.AcceleratorError: CUDA error: out of memory "
         "(seen on an H100 with a memory fraction)",
         ("torch.cuda.set_per_process_memory_fraction(0.5)",
          "parts = [torch.empty(int(G * 0.1), dtype=torch.uint8, device='cuda') "
          "for _ in range(4)]"),
         "y = torch.cat(parts * 2)"),
    Form("cublas", "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
         ("a = torch.randn(64, 64, device='cuda')", "fill(2 * MiB)"),
         # A new thread gets its own cuBLAS handle: its error is raised again in the cell.
         "import threading\nbox = []\ndef work():\n    try:\n        box.append(a @ a)\n"
         "    except BaseException as e:\n        box.append(e)\n"
         "t = threading.Thread(target=work); t.start(); t.join()\n"
         "got = box.pop()\nif isinstance(got, BaseException):\n    raise got",
         source="aten/src/ATen/cuda/Exceptions.h"),
    Form("cublas: main thread", "CUBLAS_STATUS_ALLOC_FAILED at the first matmul",
         ("a = torch.randn(64, 64, device='cuda')", "fill(2 * MiB)"), "b = a @ a",
         source="aten/src/ATen/cuda/Exceptions.h"),
    Form("cudnn", "cuDNN error (NOT_SUPPORTED, ALLOC_FAILED or no engine) for want of workspace",
         ("conv = torch.nn.Conv2d(64, 64, 7).cuda()",
          "inp = torch.randn(32, 64, 256, 256, device='cuda')", "fill(2 * MiB)"),
         "out = conv(inp)", source="aten/src/ATen/cudnn/Exceptions.h"),
    Form("expandable segments", "torch OOM, or pytorch#188008's !handles_.at(i) assert on the "
         "next allocation",
         ("keep = fill(64 * MiB, keep=True)",),
         "try:\n    y = torch.empty(256 * MiB, dtype=torch.uint8, device='cuda')\n"
         "except torch.OutOfMemoryError:\n    pass\ndel keep\n"
         "z = torch.empty(G // 2, dtype=torch.uint8, device='cuda')\n"
         "w = torch.empty(G, dtype=torch.uint8, device='cuda')",
         env=(("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),),
         source="c10/cuda/CUDACachingAllocator.cpp ExpandableSegment::map; pytorch#188008"),
    Form("nccl", "NCCL error ... ncclUnhandledCudaError ... Cuda failure 'out of memory'",
         ("import torch.distributed as dist",
          # No device_id: the communicator is made at the first collective, after the fill.
          "dist.init_process_group('nccl', store=dist.HashStore(), rank=0, world_size=1)",
          "torch.cuda.set_device(0)",
          "t = torch.ones(1024, device='cuda')", "keep = fill(2 * MiB, keep=True)"),
         "dist.all_reduce(t); torch.cuda.synchronize()",
         source="torch/csrc/distributed/c10d/NCCLUtils.hpp; NCCL src/include/alloc.h"),
    Form("mempool", "an allocation under use_mem_pool while the default pool caches the memory "
         "(pytorch#159674)",
         ("fill(512 * MiB)", "pool = torch.cuda.MemPool()"),
         "with torch.cuda.use_mem_pool(pool):\n"
         "    y = torch.empty(int(torch.cuda.memory_reserved() * 0.9), dtype=torch.uint8, "
         "device='cuda')",
         source="pytorch/pytorch#159674"),
    Form("cupy", "cupy.cuda.memory.OutOfMemoryError while PyTorch's cache holds the memory",
         ("import cupy", "fill(256 * MiB)"),
         "c = cupy.empty(int(torch.cuda.memory_reserved() * 0.5), dtype=cupy.uint8)",
         needs="cupy", source="cupy/cuda/memory.pyx"),
    Form("jax", "RESOURCE_EXHAUSTED: Out of memory while trying to allocate N bytes",
         ("import jax, jax.numpy as jnp",),
         "j = jnp.zeros((2 * G,), dtype=jnp.uint8).block_until_ready()",
         needs="jax",
         source="xla/stream_executor/integrations/tf_allocator_adapter.cc"),
)


def card_slug(name: str) -> str:
    """"NVIDIA H200" → "h200", "NVIDIA H100 80GB HBM3" → "h100"."""
    m = re.search(r"\b([A-Z]{1,3}\d{2,4}[A-Za-z]?)\b", name)
    if m:
        return m.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "unknown"


# ---- the child -----------------------------------------------------------------------------
def _cut(text: Any, n: int = 1500) -> str:
    s = str(text)
    return s if len(s) <= n else s[:n] + "…"


def child(name: str) -> None:
    import importlib.util

    form = {f.name: f for f in FORMS}[name]
    row: dict[str, Any] = {"form": name, "expect": form.expect, "source": form.source}
    if form.needs and importlib.util.find_spec(form.needs) is None:
        row.update(status="not installed", produced=False)
        print(ROW + json.dumps(row), flush=True)
        return
    import torch
    from IPython.testing.globalipapp import start_ipython

    from gpumem_nb.magics import current_monitor

    ip = start_ipython()
    row.update(torch=torch.__version__)
    ip.user_ns.update(torch=torch, MiB=MiB)
    exec(FILL_SRC, ip.user_ns)
    ip.run_cell("%load_ext gpumem_nb", store_history=True)
    if form.hog_free_bytes is None:
        torch.zeros(1, device="cuda")
        total = int(torch.cuda.mem_get_info()[1])
        row.update(gpu=torch.cuda.get_device_name(0), gpu_total_bytes=total)
    else:
        # CUDA must not start here before the failing cell: the parent's hog holds the GPU.
        total = int(os.environ.get("OOMFORMS_TOTAL", "0"))
        row.update(gpu=os.environ.get("OOMFORMS_GPU", ""), gpu_total_bytes=total)
    ip.user_ns["G"] = total
    ip.run_cell("warm = 1", store_history=True)
    for cell in form.setup:
        err = ip.run_cell(cell, store_history=True).error_in_exec
        if err is not None:
            row.update(status="setup failed", produced=False,
                       error_type=f"{type(err).__module__}.{type(err).__qualname__}",
                       message=_cut(err))
            print(ROW + json.dumps(row), flush=True)
            return
    mon = current_monitor(ip)
    if mon is not None:
        mon.oom.last = None
    t0 = time.perf_counter()
    err = ip.run_cell(form.fail, store_history=True).error_in_exec
    row["fail_cell_s"] = round(time.perf_counter() - t0, 3)
    if err is None:
        row.update(status="no error", produced=False)
    else:
        row.update(status="raised", error_type=f"{type(err).__module__}.{type(err).__qualname__}",
                   message=_cut(err))
        e = mon.oom.last if mon is not None else None
        row["recognised"] = e is not None
        if e is not None:
            row.update(kind=e.kind or "torch allocator", restart=e.restart,
                       header=e.header(), kind_lines=list(e.kind_lines),
                       first_action=e.actions[0].text if e.actions else "",
                       first_code=e.actions[0].code if e.actions else "",
                       causes=[c.kind for c in e.causes], added_s=round(e.added_s, 3))
    release = os.environ.get("OOMFORMS_RELEASE")
    if release:  # the hog lets go, so that the probe says whether CUDA itself can go on
        open(release, "w").close()
        deadline = time.monotonic() + 20
        while not os.path.exists(release + ".done") and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # its context goes as it exits
        row["hog_released"] = os.path.exists(release + ".done")
    probe = ip.run_cell("_p = torch.zeros(1, device='cuda'); torch.cuda.synchronize()",
                        store_history=False).error_in_exec
    row["cuda_after"] = "works" if probe is None else _cut(f"{type(probe).__name__}: {probe}",
                                                           300)
    if err is not None and row.get("first_code") == "%gpumem cleanup":
        ip.run_cell("%gpumem cleanup", store_history=True)
        again = ip.run_cell(form.fail, store_history=True).error_in_exec
        row["recovered"] = again is None
        if again is not None:
            row["after_action"] = _cut(f"{type(again).__name__}: {again}", 300)
    print(ROW + json.dumps(row, default=str), flush=True)


def hog(free_bytes: int) -> None:
    """Take all the GPU's memory but ``free_bytes``, say so, and hold it until the child asks
    for it back (the file ``$OOMFORMS_RELEASE`` appears) or two minutes pass; then exit."""
    import torch

    torch.zeros(1, device="cuda")
    free, total = torch.cuda.mem_get_info()
    keep = [torch.empty(max(int(free) - free_bytes, 0), dtype=torch.uint8, device="cuda")]
    torch.cuda.synchronize()
    print("HOG " + json.dumps({"gpu": torch.cuda.get_device_name(0), "total": int(total),
                               "free": int(torch.cuda.mem_get_info()[0])}), flush=True)
    release = os.environ.get("OOMFORMS_RELEASE", "")
    deadline = time.monotonic() + 120
    while not (release and os.path.exists(release)) and time.monotonic() < deadline:
        time.sleep(0.1)
    keep.clear()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    if release:
        open(release + ".done", "w").close()


# ---- the parent ----------------------------------------------------------------------------
def run_form(form: Form, timeout_s: float) -> dict[str, Any]:
    env = dict(os.environ, **dict(form.env))
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    hog_proc = None
    t0 = time.perf_counter()
    try:
        if form.hog_free_bytes is not None:
            env["OOMFORMS_RELEASE"] = os.path.join(
                tempfile.gettempdir(), f"oomforms_release_{os.getpid()}_{time.time_ns()}")
            hog_proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--hog",
                                         str(form.hog_free_bytes)], stdout=subprocess.PIPE,
                                        text=True, env=env)
            assert hog_proc.stdout is not None
            line = hog_proc.stdout.readline()
            if not line.startswith("HOG "):
                return {"form": form.name, "status": "hog failed", "produced": False}
            info = json.loads(line[4:])
            env.update(OOMFORMS_TOTAL=str(info["total"]), OOMFORMS_GPU=info["gpu"])
        left = max(timeout_s - (time.perf_counter() - t0), 5.0)
        try:
            done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                                   form.name], capture_output=True, text=True, env=env,
                                  timeout=left, cwd=ROOT)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            rows = [ln for ln in out.splitlines() if ln.startswith(ROW)]
            if rows:
                return json.loads(rows[-1][len(ROW):]) | {"note": "child timed out after"}
            return {"form": form.name, "status": f"timed out after {timeout_s:.0f} s",
                    "produced": False, "stderr_tail": str(e.stderr)[-600:]}
        rows = [ln for ln in done.stdout.splitlines() if ln.startswith(ROW)]
        if not rows:
            return {"form": form.name, "status": f"child exited {done.returncode} with no row",
                    "produced": False, "stderr_tail": done.stderr[-1500:]}
        row: dict[str, Any] = json.loads(rows[-1][len(ROW):])
        if done.returncode not in (0, None):
            row["child_exit"] = done.returncode
        return row
    finally:
        if hog_proc is not None:
            hog_proc.kill()
            hog_proc.wait(30)
        row_s = time.perf_counter() - t0
        _last_times[form.name] = round(row_s, 1)


_last_times: dict[str, float] = {}


def table(rows: list[dict[str, Any]]) -> str:
    def cell(x: Any) -> str:
        return str(x if x is not None else "").replace("|", "\\|").replace("\n", " ")[:220]

    head = ("| form | produced | exception | message (start) | gpumem_nb kind | restart | "
            "first action | CUDA after | recovered | s |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
    body = "".join(
        f"| {cell(r.get('form'))} | {cell(r.get('status'))} | {cell(r.get('error_type'))} | "
        f"{cell((r.get('message') or '')[:120])} | "
        f"{cell(r.get('kind') if r.get('recognised') else ('not recognised' if r.get('status') == 'raised' else ''))} | "  # noqa: E501
        f"{cell(r.get('restart'))} | {cell(r.get('first_action'))} | "
        f"{cell(r.get('cuda_after'))} | {cell(r.get('recovered'))} | "
        f"{cell(r.get('seconds'))} |\n" for r in rows)
    return head + body


def write(out: str, card: str, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"oom_forms_{card}.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)
    with open(os.path.join(out, f"oom_forms_{card}.md"), "w") as f:
        f.write(f"# OOM forms on {meta.get('gpu') or card}\n\n{table(rows)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--form-timeout-s", type=float, default=45.0)
    ap.add_argument("--only", default="")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--hog", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    if args.hog is not None:
        hog(args.hog)
        return
    forms = [f for f in FORMS if not args.only or f.name in args.only.split(",")]
    if args.dry_run:
        import importlib.util

        plan = [{"form": f.name, "status": "dry run", "expect": f.expect, "source": f.source,
                 "needs": f.needs or None,
                 "installed": (importlib.util.find_spec(f.needs) is not None) if f.needs
                 else None, "hog": f.hog_free_bytes is not None,
                 "env": dict(f.env)} for f in forms]
        for r in plan:
            print(f"{r['form']:<26} {r['expect']}")
        print(f"{len(forms)} forms; at most {args.form_timeout_s:.0f} s each, "
              f"{args.budget_s:.0f} s in all (about 12 s a form expected)")
        write(args.out, "dry_run", plan, {"dry_run": True, "budget_s": args.budget_s})
        return
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    card, meta = "unknown", {"budget_s": args.budget_s, "form_timeout_s": args.form_timeout_s}
    for f in forms:
        left = args.budget_s - (time.perf_counter() - t0)
        if left < 10:
            rows.append({"form": f.name, "status": "skipped: the budget ran out",
                         "produced": False, "source": f.source})
            continue
        row = run_form(f, min(args.form_timeout_s, left))
        row["seconds"] = _last_times.get(f.name)
        row.setdefault("produced", row.get("status") == "raised")
        rows.append(row)
        if row.get("gpu") and card == "unknown":
            card = card_slug(row["gpu"])
            meta.update(gpu=row["gpu"], gpu_total_bytes=row.get("gpu_total_bytes"),
                        torch=row.get("torch"))
        meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
        write(args.out, card, rows, meta)
        print(f"{f.name:<26} {row.get('status')}: {row.get('error_type', '')} "
              f"kind={row.get('kind')} restart={row.get('restart')} "
              f"recovered={row.get('recovered')} ({row['seconds']} s)", flush=True)
    if card != "unknown":
        stale = os.path.join(args.out, "oom_forms_unknown.json")
        if os.path.exists(stale):
            os.remove(stale)
            os.remove(stale[:-5] + ".md")
    print(f"done in {time.perf_counter() - t0:.0f} s; {args.out}/oom_forms_{card}.json")


if __name__ == "__main__":
    main()
