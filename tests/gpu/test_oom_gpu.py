"""On the real GPU: one scripted OOM per cause, each in a fresh IPython process, under the
native allocator and under cudaMallocAsync (the backend is read when torch is imported, hence a
process per backend). Each prints its verdict line and the time the explainer added.

Run: ``pytest -m gpu tests/gpu/test_oom_gpu.py tests/gpu/test_trace_gpu.py -s``
"""

from __future__ import annotations

from typing import Any

import pytest

from gpumem_nb.units import format_bytes

from .helpers import NVML_BEFORE, fresh

pytestmark = pytest.mark.gpu
GiB = 1 << 30  # for printing; each child's sizes are in its own r["GiB"] (the card's share)
CONTEXT_BYTES = 2 * GiB  # a process's CUDA context and allocator rounding, at most
BACKENDS = {"native": "", "cudaMallocAsync": "backend:cudaMallocAsync"}

# In the child: a real IPython shell with torch and CUDA up, gpumem_nb loaded, the observer
# attached by the first cell's hooks; ``report()`` prints the last explanation as JSON.
PRELUDE = """
        import dataclasses, json, os, subprocess, sys, time
        import torch
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.displayhook.cache_size = 1000
        torch.zeros(1, device="cuda"); torch.cuda.synchronize()
        from tests.gpu.helpers import scaled_gib
        GiB = scaled_gib(torch.cuda.mem_get_info(0)[1])  # the H200's GiB, scaled to this card
        ip.user_ns.update(torch=torch, GiB=GiB)
        ip.run_cell("%load_ext gpumem_nb", store_history=True)
        ip.run_cell("warm = 1", store_history=True)
        from gpumem_nb.magics import current_monitor
        mon = current_monitor(ip)
        def free_now():
            return torch.cuda.mem_get_info(0)[0]
        def run(src):
            return ip.run_cell(src, store_history=True)
        BEFORE = {}
        def ask_beyond_free(extra):
            # The failing request: ``extra`` more than is free now. What the pool held before
            # it is recorded, to tell apart what the failed request itself made the
            # cudaMallocAsync pool reserve.
            BEFORE.update(free=free_now(), reserved=torch.cuda.memory_reserved(0),
                          allocated=torch.cuda.memory_allocated(0))
            ip.user_ns["ask"] = free_now() + extra
        def report(**extra):
            e = mon.oom.last
            out = {"backend": torch.cuda.get_allocator_backend(), "GiB": GiB,
                   "observer": mon.oom.observer_status, "explained": e is not None,
                   "before": dict(BEFORE)}
            if e is not None:
                out.update(cause=e.cause, verdict=e.verdict, text=str(e),
                           shortfall=e.facts.shortfall_bytes,
                           added_ms=e.added_s * 1e3, observer_ms=e.observer_s * 1e3,
                           stages=e.stages_text(),
                           causes=[[c.kind, c.nbytes, c.covers] for c in e.causes],
                           holders=[[h.name, h.kind, h.nbytes] for h in e.holders],
                           facts=dataclasses.asdict(e.facts), source=e.source)
            out.update(extra)
            print(json.dumps(out, default=str))
"""


def scenario(backend: str, body: str) -> dict[str, Any]:
    conf = BACKENDS[backend]
    r = fresh(PRELUDE + body, env={"PYTORCH_CUDA_ALLOC_CONF": conf, "PYTORCH_ALLOC_CONF": ""})
    assert r["backend"] == backend, r
    if backend == "native":
        assert r["observer"] == "attached", r["observer"]
    return r


# Where no holder needs checking, the explanation is the walk and the readings: 50 ms. Where the
# session holds the memory, the advice's `del` is checked against the retention graph (a
# search over the whole heap) and, where the walk leaves bytes unnamed, the graph is searched:
# the whole graph's bound, 1 s (the holders' cost bound), which this bare process is far under.
FAST_MS, GRAPH_MS = 50, 1000


def check(r: dict[str, Any], cause: str, name: str, beyond_free: int | None = None, *,
          graph: bool = False) -> None:
    assert r["explained"], r
    line = (f"[{r['backend']:>15}] {name:<22} -> {r['cause']:<20} "
            f"added {r['added_ms']:5.1f} ms (observer {r['observer_ms']:4.1f} ms) "
            f"[{r['stages']}]: {r['verdict']}")
    print("\nVERDICT " + line)
    if r.get("before"):
        f = r["facts"]
        print(f"before the request: free {r['before']['free'] / GiB:.2f} GiB, reserved "
              f"{r['before']['reserved'] / GiB:.2f} GiB, allocated "
              f"{r['before']['allocated'] / GiB:.2f} GiB; at/after the failure: free "
              f"{(f['free_bytes'] or 0) / GiB:.2f} GiB, reserved "
              f"{(f['reserved_bytes'] or 0) / GiB:.2f} GiB; shortfall "
              f"{(r['shortfall'] or 0) / GiB:.2f} GiB")
    print(r["text"])
    assert r["cause"] == cause, r["text"]
    assert r["added_ms"] < (GRAPH_MS if graph else FAST_MS), line
    if beyond_free is not None:
        # Honest arithmetic: the request was ``beyond_free`` more than was free, so that is
        # what must be missing, under either backend (under cudaMallocAsync, what the pool
        # holds unused counts as room, since the pool reuses it).
        assert abs(r["shortfall"] - beyond_free) < GiB // 4, (r["shortfall"], r["before"])


@pytest.fixture(params=list(BACKENDS))
def backend(request: Any) -> str:
    return str(request.param)


def test_impossible_request_is_impossible_with_the_exact_size(backend):
    r = scenario(backend, """
        run("x = torch.empty(400 * GiB, dtype=torch.uint8, device='cuda')")
        ip.run_line_magic("gpumem", "summary")
        report(total=torch.cuda.get_device_properties(0).total_memory)
    """)
    check(r, "impossible", "impossible size")
    if backend == "native":
        assert r["facts"]["requested_bytes"] == 400 * r["GiB"]
    else:
        # cudaMallocAsync's message says the size in GiB to two decimals and nothing finer: on
        # an H100, 400 of its scaled GiB is "226.56 GiB" (gpu_tests_b_fbe1cd8_h100.log).
        assert abs(r["facts"]["requested_bytes"] - 400 * r["GiB"]) <= (1 << 30) // 200
    assert r["facts"]["total_bytes"] == r["total"]


def test_oom_count_is_right_under_every_backend(backend):
    r = scenario(backend, """
        import io, contextlib
        run("x = torch.empty(400 * GiB, dtype=torch.uint8, device='cuda')")
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            ip.run_line_magic("gpumem", "summary")
        report(summary=buf.getvalue(),
               backend_count=torch.cuda.memory_stats(0).get("num_ooms", 0))
    """)
    print("\nbackend's own num_ooms:", r["backend_count"])
    assert "OOMs: 1." in r["summary"], r["summary"]


def test_fragmentation_from_many_splits_is_fragmentation(backend):
    r = scenario(backend, """
        # One 40 GiB cached segment carved into 1 GiB pieces; every other piece freed leaves
        # 20 holes that cannot merge or be released. Then fill the rest of the GPU.
        big = torch.empty(40 * GiB, dtype=torch.uint8, device="cuda"); del big
        pieces = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(40)]
        ip.user_ns["keep"] = pieces[::2]; del pieces
        ip.user_ns["filler"] = torch.empty(free_now() - GiB // 2, dtype=torch.uint8,
                                           device="cuda")
        free = free_now()
        run("y = torch.empty(2 * GiB, dtype=torch.uint8, device='cuda')")
        split = torch.cuda.memory_stats(0).get("inactive_split_bytes.all.current")
        report(free_before=free, inactive_split=split)
    """)
    if not r["explained"] and backend == "cudaMallocAsync":
        pytest.skip("cudaMallocAsync served 2 GiB from the freed 1 GiB pieces: this recipe "
                    "cannot fragment its pool")
    if backend != "native":
        # The pool's unused bytes are room the driver reuses (issue 26: no recipe left it
        # unable to serve such a request), so they are never the verdict.
        assert r["cause"] not in ("fragmentation", "cached by the cudaMallocAsync pool"), r
        return
    check(r, "fragmentation", "fragmentation (splits)", graph=True)
    frag = r["causes"][0]
    g = r["GiB"]
    assert frag[1] >= 20 * g - 64 * (1 << 20), frag  # the 20 holes
    if backend == "native":
        assert r["facts"]["largest_free_block_bytes"] == g
        assert "expandable_segments:True" in r["text"]
    else:
        assert "expandable_segments" not in r["text"]


def test_another_process_is_named_with_its_pid_and_bytes(backend):
    # Another user's job: no descendant of this kernel (benchmarks/foreign.py reparents it
    # away), so it is named by PID and command, never as the kernel's child.
    r = scenario(backend, """
        from benchmarks.foreign import ForeignHolder
        with ForeignHolder(60 * GiB) as pid:
            ask_beyond_free(30 * GiB)
            run("y = torch.empty(ask, dtype=torch.uint8, device='cuda')")
            report(child=pid)
    """)
    g = r["GiB"]
    check(r, "other processes", "another process", 30 * g)
    procs = {p["pid"]: p for p in r["facts"]["other_processes"]}
    assert r["child"] in procs, procs
    assert 60 * g <= procs[r["child"]]["nbytes"] < 60 * g + CONTEXT_BYTES  # and its context
    assert procs[r["child"]]["child"] is None
    assert f"PID {r['child']} (" in r["text"] and "this kernel's" not in r["text"]


def test_a_process_the_kernel_started_is_named_as_its_child_with_advice(backend):
    # One the kernel started itself (issue 19): its child, with the advice that fits.
    r = scenario(backend, """
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys, torch; "
             f"x = torch.empty({60 * GiB}, dtype=torch.uint8, device='cuda'); "
             "torch.cuda.synchronize(); print('ready', flush=True); sys.stdin.read()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        ask_beyond_free(30 * GiB)
        run("y = torch.empty(ask, dtype=torch.uint8, device='cuda')")
        report(child=child.pid)
        child.stdin.close(); child.wait()
    """)
    g = r["GiB"]
    check(r, "other processes", "the kernel's child", 30 * g)
    procs = {p["pid"]: p["nbytes"] for p in r["facts"]["other_processes"]}
    assert 60 * g <= procs[r["child"]] < 60 * g + CONTEXT_BYTES  # and its CUDA context
    assert f"PID {r['child']} (this kernel's child process)" in r["text"]
    assert "release the object that started it, in this kernel" in r["text"]


def test_memory_outside_pytorch_from_a_second_allocator_is_outside_pytorch(backend):
    r = scenario(backend, """
        import ctypes
        # A second allocator in this process: the CUDA runtime torch loaded, called directly.
        path = next((ln.split()[-1] for ln in open("/proc/self/maps") if "libcudart" in ln),
                    None)
        ptr = ctypes.c_void_p()
        if path:
            err = ctypes.CDLL(path).cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(60 * GiB))
        else:  # a build with cudart linked in: the driver API on torch's current context
            err = ctypes.CDLL("libcuda.so.1").cuMemAlloc_v2(ctypes.byref(ptr),
                                                             ctypes.c_size_t(60 * GiB))
        assert err == 0, err
        ask_beyond_free(30 * GiB)
        run("y = torch.empty(ask, dtype=torch.uint8, device='cuda')")
        report(via=path or "libcuda")
    """)
    print("\nsecond allocator:", r["via"])
    g = r["GiB"]
    check(r, "outside PyTorch", "outside PyTorch", 30 * g)
    outside = r["causes"][0][1]
    assert 60 * g <= outside < 60 * g + CONTEXT_BYTES  # the 60 GiB plus the CUDA context


def test_memory_held_by_out_is_held_by_out(backend):
    r = scenario(backend, """
        run("torch.empty(60 * GiB, dtype=torch.uint8, device='cuda')")  # displayed: Out[n]
        ask_beyond_free(30 * GiB)
        run("y = torch.empty(ask, dtype=torch.uint8, device='cuda')")
        report()
    """)
    g = r["GiB"]
    check(r, "held by your session", "held by Out", 30 * g, graph=True)
    assert any(n.startswith("Out[") and k == "output cache" and b == 60 * g
               for n, k, b in r["holders"]), r["holders"]
    assert "%gpumem cleanup --out clears Out[" in r["text"]


def test_memory_held_by_a_stored_traceback_is_held_by_the_traceback(backend):
    r = scenario(backend, """
        run("def step():\\n    acts = torch.empty(60 * GiB, dtype=torch.uint8, device='cuda')\\n"
            "    raise ValueError('loss is nan')\\nstep()")
        ask_beyond_free(30 * GiB)
        run("y = torch.empty(ask, dtype=torch.uint8, device='cuda')")
        report()
    """)
    g = r["GiB"]
    check(r, "held by your session", "held by a traceback", 30 * g, graph=True)
    if backend == "native":  # scanned by the observer while the old traceback held it
        assert ["traceback: step() locals", "traceback", 60 * g] in r["holders"], r
    else:  # replaced by the new error, waiting in a reference cycle or already freed
        assert r["causes"][0][1] >= 60 * g and "ValueError: loss is nan" in r["verdict"]


def test_memory_held_by_a_variable_is_held_by_the_variable(backend):
    r = scenario(backend, """
        run("big = torch.empty(60 * GiB, dtype=torch.uint8, device='cuda')")
        ask_beyond_free(30 * GiB)
        run("y = torch.empty(ask, dtype=torch.uint8, device='cuda')")
        report()
    """)
    g = r["GiB"]
    check(r, "held by your session", "held by a variable", 30 * g, graph=True)
    assert ["big", "variable", 60 * g] in r["holders"], r["holders"]
    assert f"`del big` (variable, {format_bytes(60 * g)})" in r["text"]


def test_the_observer_never_creates_a_context_and_survives_reloads():
    r = fresh(NVML_BEFORE + """
        import json, sys
        import torch
        from IPython.testing.globalipapp import start_ipython
        from gpumem_nb.sources.torch import OOM_OBSERVER_ATTR
        ip = start_ipython()
        ip.user_ns["torch"] = torch
        ip.run_cell("%load_ext gpumem_nb", store_history=True)
        for i in range(3):
            ip.run_cell(f"a{i} = {i}", store_history=True)
        untouched = used() == before and not torch.cuda.is_initialized()
        attached_early = hasattr(torch._C, OOM_OBSERVER_ATTR)
        ip.run_cell("x = torch.zeros(1, device='cuda')", store_history=True)
        ip.run_cell("b = 1", store_history=True)
        first = getattr(torch._C, OOM_OBSERVER_ATTR, None)
        for _ in range(3):
            ip.run_cell("%reload_ext gpumem_nb", store_history=True)
            ip.run_cell("b = 1", store_history=True)
        same = getattr(torch._C, OOM_OBSERVER_ATTR, None) is first
        from gpumem_nb.magics import current_monitor
        ip.run_cell("y = torch.empty(400 * 2**30, dtype=torch.uint8, device='cuda')",
                    store_history=True)
        e = current_monitor(ip).oom.last
        print(json.dumps({"untouched": untouched, "attached_early": attached_early,
                          "first": first is not None, "same": same,
                          "source": e.source if e else "", "cause": e.cause if e else ""}))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": ""})
    print(r)
    assert r["untouched"] and not r["attached_early"]
    assert r["first"] and r["same"]
    assert "observer" in r["source"] and r["cause"] == "impossible"
