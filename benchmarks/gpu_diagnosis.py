"""The OOM explainer, `who` and cleanup on real workloads (issue 15): one row per workload and
allocator, with the cause a memory expert names (``expected``) beside the one the explainer
named (``verdict``), what `who` listed and what the cleanup then freed, and the times.

    python3 benchmarks/gpu_diagnosis.py              # the GPU machine: writes $OUT (or ./out)
    python3 benchmarks/gpu_diagnosis.py --dry-run    # anywhere: CPU torch, tiny sizes, and the
                                                     # OOMs raised by hand (the same code paths)

Writes ``diagnosis_h200.json`` (a list of rows, each naming the GPU it ran on) and
``diagnosis_log.txt`` under ``$OUT``, rewritten after every group, so a crash or a timeout still
returns the rows so far.

Each allocator setting needs a fresh process (the backend is read when torch is imported), so
every (allocator, group) runs in its own subprocess driving a real IPython shell with the
extension loaded; inside it, the workloads run one after another, each with a clean namespace
and a freshly loaded extension, each in its own try/except. A workload that finds more than
256 MiB allocated when it starts (what an earlier one left) is refused, not explained. OOM
workloads need the whole GPU, so nothing runs in parallel (CuPy and JAX keep their own
processes: their CUDA libraries are not asked to share one). Bound: ``--budget-s`` (295 s) in
all; a group that cannot start in time is recorded as skipped. The first H200 run took 131 s.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALLOCATORS = {"native": "", "expandable": "expandable_segments:True",
              "cudaMallocAsync": "backend:cudaMallocAsync"}
# What a memory expert would name, per workload (the explainer's cause words).
EXPECTED = {
    "gpt2_step_too_big": "working set",
    "mlp_8x8192_step_too_big": "working set",
    "mlp_inference_under_no_grad": "working set",
    "loss_list_keeping_graphs": "held by your session",
    "out_logits_rerun": "held by your session",
    "another_process": "other processes",
    "caught_oom_in_a_loop": "released",
    "cleanup_per_step": "per step",
    "cotenant_cupy": "outside PyTorch",
    "cotenant_jax": "outside PyTorch",
}
GROUPS = {
    "torch": ["gpt2_step_too_big", "mlp_8x8192_step_too_big", "mlp_inference_under_no_grad",
              "loss_list_keeping_graphs", "out_logits_rerun", "another_process",
              "caught_oom_in_a_loop", "cleanup_per_step"],
    "cupy": ["cotenant_cupy"],
    # Last: JAX keeps what it preallocated until the process ends.
    "jax": ["cotenant_jax"],
}
GROUP_LIMIT_S = {"torch": 150, "cupy": 45, "jax": 60}
ROW = "DIAGNOSIS-ROW "


# ============================================================================================
# The parent: one subprocess per (allocator, group), rows collected as they come
# ============================================================================================
def run_group(allocator: str, group: str, *, dry: bool, limit_s: float,
              log: list[str]) -> list[dict[str, Any]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env["DIAG_ALLOCATOR"] = allocator
    env["DIAG_DRY"] = "1" if dry else ""
    env.setdefault("GPUMEM_NB_CONFIG", os.path.join(ROOT, ".diag_config.json"))
    # PYTORCH_CUDA_ALLOC_CONF wins over PYTORCH_ALLOC_CONF when both are set: set it alone.
    env["PYTORCH_CUDA_ALLOC_CONF"] = "" if dry else ALLOCATORS[allocator]
    env["PYTORCH_ALLOC_CONF"] = ""
    if group == "jax":
        env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)  # JAX's default: what users meet
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", group],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT, start_new_session=True)
    rows: list[dict[str, Any]] = []
    deadline = time.monotonic() + limit_s
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ)
    timed_out = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        if not sel.select(timeout=min(left, 1.0)):
            if proc.poll() is not None:
                break
            continue
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(ROW):
            rows.append(json.loads(line[len(ROW):]))
        else:
            log.append(f"[{allocator}/{group}] {line.rstrip()}")
    if timed_out:
        os.killpg(proc.pid, signal.SIGKILL)  # the group's child and anything it started
        log.append(f"[{allocator}/{group}] killed after {limit_s:.0f} s")
    proc.wait()
    done = {r["workload"] for r in rows}
    for w in GROUPS[group]:
        if w not in done:
            rows.append({"workload": w, "allocator": allocator, "expected": EXPECTED[w],
                         "verdict": None, "error": "timed out" if timed_out else
                         f"the group's process ended (rc {proc.returncode}) before it"})
    return rows


def run_all(out_dir: str, *, dry: bool = False, budget_s: float = 295.0,
            allocators: list[str] | None = None,
            groups: list[str] | None = None) -> list[dict[str, Any]]:
    os.makedirs(out_dir, exist_ok=True)
    start = time.monotonic()
    rows: list[dict[str, Any]] = []
    log: list[str] = []
    for allocator in allocators or list(ALLOCATORS):
        for group in groups or list(GROUPS):
            left = budget_s - (time.monotonic() - start)
            if left < 10:
                rows += [{"workload": w, "allocator": allocator, "expected": EXPECTED[w],
                          "verdict": None, "error": "skipped: out of time"}
                         for w in GROUPS[group]]
                continue
            t0 = time.monotonic()
            rows += run_group(allocator, group, dry=dry, limit_s=min(GROUP_LIMIT_S[group], left),
                              log=log)
            log.append(f"== {allocator}/{group}: {time.monotonic() - t0:.1f} s")
            write(out_dir, rows, log)
    log.append(f"== total {time.monotonic() - start:.1f} s")
    write(out_dir, rows, log)
    return rows


def write(out_dir: str, rows: list[dict[str, Any]], log: list[str]) -> None:
    with open(os.path.join(out_dir, "diagnosis_h200.json"), "w") as f:
        json.dump(rows, f, indent=1, default=str)
    with open(os.path.join(out_dir, "diagnosis_log.txt"), "w") as f:
        f.write("\n".join(log[-20000:]) + "\n")


def summary(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'workload':<30} {'allocator':<16} {'expected':<22} {'verdict':<22} "
             f"{'explain ms':>10} {'who ms':>7} {'who/freed':>10}"]
    for r in rows:
        ratio = ""
        if r.get("who_bytes") is not None and r.get("freed_bytes"):
            ratio = f"{r['who_bytes'] / r['freed_bytes']:.0%}"
        ms = r.get("explain_ms")
        who = r.get("who_ms")
        lines.append(f"{r['workload']:<30} {r['allocator']:<16} {r['expected']:<22} "
                     f"{str(r.get('verdict') or r.get('error', ''))[:22]:<22} "
                     f"{'' if ms is None else f'{ms:.1f}':>10} "
                     f"{'' if who is None else f'{who:.1f}':>7} {ratio:>10}")
    right = sum(1 for r in rows if r.get("verdict") == r["expected"])
    lines.append(f"{right} of {len(rows)} as expected")
    return "\n".join(lines)


# ============================================================================================
# The child: a real IPython shell, the extension loaded, the workloads of one group
# ============================================================================================
# What a workload may find allocated when it starts: cuBLAS keeps a workspace per thread that
# ran a matmul (the first H200 run left 65 MiB after the GPT-2 step, forward and backward
# threads). Anything more is what an earlier workload left; the explainer names nothing under
# 256 MiB, so this much cannot change a verdict.
START_ALLOCATED_LIMIT_BYTES = 256 << 20


def release_everything(ip: Any) -> None:
    """Drop every reference the session keeps to earlier workloads' objects, then collect.

    The extension is unloaded first, so that the exception its monitor noted goes with it
    before the collection. Besides ``sys.last_*``, IPython keeps the last traceback it showed
    in ``InteractiveTB.tb`` and the last cell's result (with its ``error_in_exec``) in
    ``last_execution_result``; the first H200 run cleared only ``sys.last_*``, and the GPT-2
    step's 137 GiB traceback stayed allocated into the next three workloads."""
    ip.run_cell("%unload_ext gpumem_nb", store_history=True)
    ip.run_cell("%reset -f", store_history=False)
    for name in ("last_exc", "last_type", "last_value", "last_traceback"):
        if hasattr(sys, name):
            delattr(sys, name)
    itb = getattr(ip, "InteractiveTB", None)
    if itb is not None:
        itb.tb = None
    ip.last_execution_result = None
    ip.displayhook.flush()
    gc.collect()
    gc.collect()  # what the first pass's finalizers let go of


def child(group: str) -> None:
    import traceback

    import torch

    dry = os.environ.get("DIAG_DRY") == "1"
    dev = "cpu" if dry else "cuda"
    gib = 1 << 30
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    ip.displayhook.cache_size = 1000
    if not dry:
        # TF32 matmuls: the workloads fill the GPU several times over in fp32, and memory is
        # what is measured, not arithmetic; this keeps the whole run within its bound.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.zeros(1, device=dev)
        torch.cuda.synchronize()
        # The workloads were written for the H200 (139.8 GiB): on another card ``GiB`` is its
        # share of that card, as tests/gpu/helpers.py's scaled_gib (issue 36: any card).
        scale = int(torch.cuda.mem_get_info(0)[1]) / (139.8 * 2**30)
        if abs(scale - 1) >= 0.005:
            gib = max(1, round(2**30 * scale / 2**21)) * 2**21
    gpu = torch.cuda.get_device_name(0) if not dry else "dry run (CPU)"
    meta = {"gpu": gpu, "torch": torch.__version__, "python": sys.version.split()[0],
            "backend": (torch.cuda.get_allocator_backend() if not dry else "dry run")}

    from gpumem_nb.magics import current_monitor as _current
    from gpumem_nb.units import format_bytes

    def current_monitor(shell: Any) -> Any:
        return _current(shell)

    row_start: dict[str, int] = {}  # what the running workload found allocated

    def fresh() -> Any:
        """A clean namespace, no stored exception, nothing allocated or cached, and a new load
        of the extension (its history, verdicts and OOM record start empty). A workload that
        would start with memory the previous one left is refused, not explained."""
        release_everything(ip)
        if not dry:
            torch.cuda.empty_cache()
        left = allocated()
        if left > START_ALLOCATED_LIMIT_BYTES:
            raise RuntimeError(f"not run: the previous workload left {format_bytes(left)} "
                               "allocated after the namespace, the stored exception and the "
                               "garbage were cleared")
        row_start["allocated_bytes"] = left
        ip.run_cell("%load_ext gpumem_nb", store_history=True)
        ip.user_ns.update(torch=torch, GiB=gib, DEV=dev, DRY=dry, sim_oom=sim_oom,
                          allocated=allocated, free_now=free_now)
        ip.run_cell("warm = 1", store_history=True)  # the hooks attach the observer
        return current_monitor(ip)

    def run(src: str, cell_id: str | None = None) -> Any:
        return ip.run_cell(src, store_history=True, cell_id=cell_id)

    def allocated() -> int:
        return 0 if dry else int(torch.cuda.memory_allocated(0))

    def free_now() -> int:
        return 64 * gib if dry else int(torch.cuda.mem_get_info(0)[0])

    def sim_oom(requested: int, *, this_process: int = 0, others: tuple[Any, ...] = ()) -> None:
        """Dry run only: the OOM the GPU would raise here, in the native message's words."""
        if not dry:
            return
        procs = "".join(f"Process {pid} has {n / gib:.2f} GiB memory in use. "
                        for pid, n in others)
        msg = (f"CUDA out of memory. Tried to allocate {requested / gib:.2f} GiB. GPU 0 has a "
               f"total capacity of 139.80 GiB of which {free_now() / gib:.2f} GiB is free. "
               f"{procs}Including "
               f"non-PyTorch memory, this process has {this_process / gib:.2f} GiB memory in "
               "use. Of the allocated memory 1.00 GiB is allocated by PyTorch, and 0 bytes is "
               "reserved by PyTorch but unallocated.")
        raise torch.OutOfMemoryError(msg)

    def explanation(row: dict[str, Any]) -> Any:
        e = current_monitor(ip).oom.last
        if e is None:
            row["verdict"] = "no explanation"
            return None
        row.update(verdict=e.cause, explain_ms=round(e.added_s * 1e3, 2),
                   observer_ms=round(e.observer_s * 1e3, 2), stages=e.stages_text(),
                   source=e.source, text=str(e)[:4000],
                   first_action=e.actions[0].text if e.actions else "",
                   causes=[[c.kind, c.nbytes, c.covers] for c in e.causes],
                   cell_bytes=e.facts.cell_bytes, grad_enabled=e.facts.grad_enabled,
                   no_grad_advised=any("no_grad" in a.text for a in e.actions))
        return e

    def who(row: dict[str, Any], names: Any) -> Any:
        mon = current_monitor(ip)
        t0 = time.perf_counter()
        report = ip.run_line_magic("gpumem", "who -n 50 -o")
        row["who_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
        row["who_graph_ms"] = round(mon.last_scan_graph[0] * 1e3, 2)
        row["who_graph_nodes"] = mon.last_scan_graph[1]
        listed = [h for h in report.holders if names(h.name) and h.device.startswith(
            "cuda" if not dry else "cpu")]
        row["who_bytes"] = sum(h.held_bytes for h in listed)
        row["who_holders"] = [[h.name, h.nbytes, h.graph_bytes, h.graph_nodes] for h in listed]
        return report

    def cleanup(row: dict[str, Any], line: str, step: str) -> Any:
        report = ip.run_line_magic("gpumem", f"cleanup {line} -o")
        row["cleanup"] = {s.step: s.freed_allocated_bytes for s in report.steps}
        row["freed_bytes"] = row["cleanup"].get(step)
        return report

    # -- the workloads ---------------------------------------------------------------------
    def gpt2(mon: Any, *, training: bool) -> None:
        from transformers import GPT2Config, GPT2LMHeadModel

        # About 200 M parameters (GPT-2 medium's width, GPT-2 small's depth).
        cfg = (GPT2Config(n_embd=64, n_layer=2, n_head=2, n_positions=64, vocab_size=1000)
               if dry else GPT2Config(n_embd=1024, n_layer=12, n_head=16, n_positions=1024))
        with torch.device(dev):
            model = GPT2LMHeadModel(cfg)
        ip.user_ns.update(model=model, cfg=cfg)
        if training:
            ip.user_ns["opt"] = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def w_gpt2_step_too_big(row: dict[str, Any]) -> None:
        mon = fresh()
        gpt2(mon, training=True)
        run("def step(batch):\n"
            "    ids = torch.randint(0, cfg.vocab_size, (batch, cfg.n_positions), device=DEV)\n"
            "    loss = model(ids, labels=ids).loss\n"
            "    if DRY and batch > 2:\n"
            "        sim_oom(2 * GiB)\n"
            "    loss.backward()\n"
            "    opt.step()\n"
            "    opt.zero_grad(set_to_none=True)\n"
            "    return loss.item()")
        run("step(2)", cell_id="train")
        mon.sampler.tick()
        run("step(512)" if not dry else "step(4)", cell_id="train")
        explanation(row)
        who(row, lambda n: n.startswith("traceback"))  # the failed step's tensors, now held
        row["expandable_advised_first"] = "expandable_segments" in row.get("first_action", "")

    def w_mlp(row: dict[str, Any], *, training: bool) -> None:
        fresh()
        width = 64 if dry else 8192
        with torch.device(dev):
            mlp = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(8)])
        ip.user_ns.update(mlp=mlp, width=width)
        if training:
            ip.user_ns["opt"] = torch.optim.AdamW(mlp.parameters(), lr=1e-4)
            run("def train(batch):\n"
                "    x = torch.randn(batch, width, device=DEV)\n"
                "    loss = mlp(x).square().mean()\n"
                "    if DRY and batch > 4096:\n"
                "        sim_oom(16 * GiB)\n"
                "    loss.backward()\n"
                "    opt.step()\n"
                "    opt.zero_grad(set_to_none=True)")
            run("train(4096)", cell_id="mlp")
            current_monitor(ip).sampler.tick()
            # 20 GiB per activation: eight layers save eight of them for backward.
            run("train(655360)" if not dry else "train(8192)", cell_id="mlp")
        else:
            run("def infer(batch):\n"
                "    with torch.no_grad():\n"
                "        x = torch.randn(batch, width, device=DEV)\n"
                "        hs = []\n"
                "        for layer in mlp:\n"
                "            x = layer(x)\n"
                "            hs.append(x)  # every hidden state kept, as output_hidden_states\n"
                "            if DRY and batch > 4096:\n"
                "                sim_oom(16 * GiB)\n"
                "    return hs")
            run("hs = infer(4096)\ndel hs", cell_id="infer")
            current_monitor(ip).sampler.tick()
            # 20 GiB per hidden state: seven of them fill the GPU.
            run("hs = infer(655360)" if not dry else "hs = infer(8192)", cell_id="infer")
        explanation(row)

    def w_loss_list(row: dict[str, Any]) -> None:
        fresh()
        width = 64 if dry else 8192
        with torch.device(dev):
            model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(),
                                        torch.nn.Linear(width, width))
        ip.user_ns.update(model=model, width=width, losses=[])
        # About 2 GiB saved per step (the input, GELU's input and output, the output).
        run("for i in range(100_000):\n"
            "    x = torch.randn(16384 if not DRY else 64, width, device=DEV)\n"
            "    losses.append(model(x).square().mean())\n"
            "    if DRY and i == 20:\n"
            "        sim_oom(512 * 2**20)", cell_id="losses")
        row["steps_before_oom"] = len(ip.user_ns["losses"])
        explanation(row)
        who(row, lambda n: n == "losses")
        cleanup(row, "--vars losses", "variables")

    def w_out_logits_rerun(row: dict[str, Any]) -> None:
        mon = fresh()
        gpt2(mon, training=False)
        run("ids = torch.randint(0, cfg.vocab_size, (8 if not DRY else 2, cfg.n_positions), "
            "device=DEV)")
        for _ in range(3):
            run("model(ids).logits", cell_id="logits")  # the last line: Out keeps it
            mon.sampler.tick()
        verdicts = list(mon.verdicts)
        row["rerun_verdict"] = verdicts[-1].message if verdicts else ""
        row["rerun_advice_loss_item"] = "loss.item()" in row["rerun_verdict"]
        who(row, lambda n: n.startswith("Out["))
        run("ask = free_now() + 10 * GiB\n"
            "sim_oom(ask)\n"
            "y = torch.empty(ask, dtype=torch.uint8, device=DEV)")
        explanation(row)
        cleanup(row, "--out", "output cache")

    def w_another_process(row: dict[str, Any]) -> None:
        # Another user's job: no descendant of this kernel (one the kernel started itself is
        # its child, and named so; tests/gpu/test_oom_gpu.py covers that case).
        fresh()
        from benchmarks.foreign import ForeignHolder

        with ForeignHolder(60 * gib, device="cpu" if dry else "cuda") as pid:
            row["foreign_pid"] = pid
            ip.user_ns["others"] = ((pid, 60 * gib),)
            run("ask = free_now() + 30 * GiB\n"
                "sim_oom(ask, others=others)\n"
                "y = torch.empty(ask, dtype=torch.uint8, device=DEV)")
            explanation(row)
        row["named_as_child"] = "this kernel's" in row.get("text", "")

    def w_caught_oom_in_a_loop(row: dict[str, Any]) -> None:
        fresh()
        unit = 2**20 if dry else gib
        total = 64 * gib if dry else torch.cuda.get_device_properties(0).total_memory
        ip.user_ns.update(unit=unit, total_units=total // unit)
        run("def train_step(batch_units):\n"
            "    activations = torch.empty(8 * unit, dtype=torch.uint8, device=DEV)\n"
            "    if DRY and batch_units > 2:\n"
            "        sim_oom(batch_units * GiB)\n"
            "    logits = torch.empty(batch_units * unit, dtype=torch.uint8, device=DEV)\n"
            "    return activations, logits\n"
            "def first_batch_that_fits(sizes):\n"
            "    for size in sizes:\n"
            "        try:\n"
            "            result = train_step(size)\n"
            "        except torch.OutOfMemoryError:\n"
            "            continue\n"
            "        return size, result\n")
        run("base = allocated()\n"
            "try:\n"
            "    train_step(2 * total_units)\n"
            "except torch.OutOfMemoryError as e:\n"
            "    error = e\n"
            "del error\n"
            "after_del = allocated() - base")
        run("size, result = first_batch_that_fits([2 * total_units, total_units, 1])\n"
            "after_loop = allocated() - base - (8 + 1) * unit")
        ns = ip.user_ns
        row.update(after_del_bytes=ns.get("after_del"), after_loop_bytes=ns.get("after_loop"),
                   fitted=ns.get("size"))
        kept = (ns.get("after_del") or 0) + (ns.get("after_loop") or 0)
        row["verdict"] = "dry run" if dry else "released" if kept == 0 and ns.get(
            "size") == 1 else f"kept {format_bytes(kept)}"

    def w_cleanup_per_step(row: dict[str, Any]) -> None:
        fresh()
        unit = 2**20 if dry else gib
        ip.user_ns["unit"] = unit
        gc.disable()  # the cycle stays garbage until the cleanup's own collection
        try:
            run("class Cycle:\n    pass\n"
                "c = Cycle(); c.me = c\n"
                "c.t = torch.ones(unit, dtype=torch.uint8, device=DEV)\n"
                "del c")
            run("def f():\n"
                "    t = torch.ones(2 * unit, dtype=torch.uint8, device=DEV)\n"
                "    raise ValueError('nan')\n"
                "f()")
            run("torch.ones(4 * unit, dtype=torch.uint8, device=DEV)")  # Out keeps it
            report = cleanup(row, "--out", "output cache")
        finally:
            gc.enable()
        steps = row["cleanup"]
        want = {"gc.collect": unit, "last exception": 2 * unit, "output cache": 4 * unit}
        total = (report.before.allocated_bytes or 0) - (report.after.allocated_bytes or 0)
        rows_sum = sum(v or 0 for v in steps.values())
        row.update(freed_bytes=total, rows_sum_bytes=rows_sum)
        ok = all(steps.get(k) == v for k, v in want.items()) and rows_sum == total
        row["verdict"] = "dry run" if dry else "per step" if ok else \
            "misattributed: " + json.dumps(steps)

    def w_cotenant_cupy(row: dict[str, Any]) -> None:
        fresh()
        blob = None
        if not dry:
            import cupy

            blob = cupy.empty(60 * gib, dtype=cupy.uint8)  # CuPy's pool, in this process
        try:
            run("ask = free_now() + 30 * GiB\n"
                "sim_oom(ask, this_process=61 * GiB)\n"
                "y = torch.empty(ask, dtype=torch.uint8, device=DEV)")
            explanation(row)
        finally:
            if blob is not None:
                import cupy

                del blob
                cupy.get_default_memory_pool().free_all_blocks()

    def w_cotenant_jax(row: dict[str, Any]) -> None:
        fresh()
        if not dry:
            import jax.numpy as jnp

            # JAX's default: the first array preallocates 75% of the GPU for XLA.
            jnp.ones(1).block_until_ready()
            row["jax_took_bytes"] = int(torch.cuda.get_device_properties(0).total_memory
                                        - torch.cuda.mem_get_info(0)[0])
        run("ask = free_now() + 10 * GiB\n"
            "sim_oom(ask, this_process=105 * GiB)\n"
            "y = torch.empty(ask, dtype=torch.uint8, device=DEV)")
        explanation(row)
        row["prealloc_advised"] = "XLA_PYTHON_CLIENT_PREALLOCATE" in row.get("text", "")

    workloads = {
        "gpt2_step_too_big": w_gpt2_step_too_big,
        "mlp_8x8192_step_too_big": lambda r: w_mlp(r, training=True),
        "mlp_inference_under_no_grad": lambda r: w_mlp(r, training=False),
        "loss_list_keeping_graphs": w_loss_list,
        "out_logits_rerun": w_out_logits_rerun,
        "another_process": w_another_process,
        "caught_oom_in_a_loop": w_caught_oom_in_a_loop,
        "cleanup_per_step": w_cleanup_per_step,
        "cotenant_cupy": w_cotenant_cupy,
        "cotenant_jax": w_cotenant_jax,
    }
    for name in GROUPS[group]:
        row: dict[str, Any] = {"workload": name, "allocator": os.environ["DIAG_ALLOCATOR"],
                               "expected": EXPECTED[name], "verdict": None, **meta}
        t0 = time.perf_counter()
        row_start.clear()
        try:
            workloads[name](row)
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:500]
            row["traceback"] = traceback.format_exc()[-3000:]
        row["wall_s"] = round(time.perf_counter() - t0, 2)
        row["start_allocated_bytes"] = row_start.get("allocated_bytes")
        row["left_allocated_bytes"] = allocated()
        print(ROW + json.dumps(row, default=str), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true",
                   help="CPU torch, tiny sizes, OOMs raised by hand: checks the script")
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--budget-s", type=float, default=295.0)
    p.add_argument("--allocators", default=",".join(ALLOCATORS))
    p.add_argument("--groups", default=",".join(GROUPS))
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child)
        return
    rows = run_all(args.out, dry=args.dry_run, budget_s=args.budget_s,
                   allocators=args.allocators.split(","), groups=args.groups.split(","))
    print(summary(rows))
    print(f"wrote {os.path.join(args.out, 'diagnosis_h200.json')}")


if __name__ == "__main__":
    main()
