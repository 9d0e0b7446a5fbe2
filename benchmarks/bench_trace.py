"""What gpumem_nb's own part of a ``%%gpumem --trace`` cell costs on CPU (the footer's
"gpumem_nb's analysis"), on histories shaped as torch 2.11's ``_snapshot()`` returns them.

    python benchmarks/bench_trace.py [--quick]   # BENCH_OUT=dir also writes bench_trace.json

CPU figures, from this machine: torch's own snapshot and record switch are not in them (the
fake torch below hands over a prebuilt snapshot). ``CellTracer.start``/``stop`` run as the
magic runs them, so every step between torch's calls is timed, as the footer times it.

The histories are built the way ``THCPModule_memorySnapshot`` and ``py_symbolize``
(``torch/csrc/cuda/Module.cpp``, ``torch/csrc/profiler/python/combined_traceback.cpp``) build
them with ``stacks="python", context="alloc"``:

- one dict per entry (action, addr, size, stream, time_us), ``frames`` only on entries that
  recorded a context (allocations and the segment allocations they caused; frees carry none);
- each allocation's ``frames`` a list of its own, innermost first, whose frame dicts are shared
  by every entry with the same (code, line): torch symbolizes each unique frame once;
- 19 to 27 Python frames: the cell's line, the user's model code, ``torch.nn`` module calls,
  then the magic and IPython/ipykernel/asyncio machinery outward.

Kinds of cell, at 1, 10,000 and 100,000 entries:

- ``first``: a kernel's first traced cell (our own recording: the history is the cell's own);
- ``later``: the next traced cell, the previous one's report and snapshot still held, as
  ``last_trace`` and the user's ``_`` hold them in a kernel;
- ``recording_on``: a later cell while a recording (the user's or ``%gpumem record``) was
  already on, so the history also holds the previous cell's entries (half of it), which
  must not count as this cell's.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import emit

SIZES = (1, 10_000, 100_000)
CELL_FILE = "/tmp/ipykernel_4242/{}.py"
T0_US = 1.7e15


class _Frames:
    """Frame dicts shared by identity, as torch's symbolizer shares them."""

    def __init__(self) -> None:
        self._pool: dict[tuple[str, int, str], dict[str, Any]] = {}

    def __call__(self, filename: str, line: int, name: str) -> dict[str, Any]:
        key = (filename, line, name)
        f = self._pool.get(key)
        if f is None:
            f = self._pool[key] = {"name": name, "filename": filename, "line": line}
        return f


def _dirs() -> tuple[str, str, str]:
    import ipykernel
    import IPython

    import gpumem_nb
    return (os.path.dirname(IPython.__file__), os.path.dirname(ipykernel.__file__),
            os.path.dirname(gpumem_nb.__file__))


def history(n: int, *, cell: int = 7, t0_us: float = T0_US, seed: int = 0,
            frames: _Frames | None = None) -> list[dict[str, Any]]:
    """``n`` entries of one cell's training-like loop: allocations from a few cell lines,
    through a user's model file and torch.nn, most freed soon, some kept."""
    rng = random.Random(seed)
    fr = frames or _Frames()
    ipy, ipk, ours = _dirs()
    torch_dir = "/opt/venv/lib/python3.12/site-packages/torch"
    stdlib = os.path.dirname(os.__file__)
    cell_file = CELL_FILE.format(cell)
    # Outward from the body: IPython running it for the %%gpumem magic (``run_cell``), the
    # magic, the cell that holds it, then IPython, ipykernel, asyncio and runpy (19 frames).
    outer = [fr(f"{ipy}/core/interactiveshell.py", 3577, "run_code"),
             fr(f"{ipy}/core/interactiveshell.py", 3517, "run_ast_nodes"),
             fr(f"{ipy}/core/interactiveshell.py", 3334, "run_cell_async"),
             fr(f"{ipy}/core/async_helpers.py", 128, "_pseudo_sync_runner"),
             fr(f"{ipy}/core/interactiveshell.py", 3130, "_run_cell"),
             fr(f"{ipy}/core/interactiveshell.py", 3075, "run_cell"),
             fr(f"{ours}/magics.py", 854, "_run_measured"), fr(f"{ours}/magics.py", 782, "_cell"),
             fr(f"{ipy}/core/magic.py", 187, "<lambda>"),
             fr(f"{ipy}/core/interactiveshell.py", 2541, "run_cell_magic"),
             fr(cell_file, 1, "<module>"),
             fr(f"{ipy}/core/interactiveshell.py", 3577, "run_code"),
             fr(f"{ipy}/core/interactiveshell.py", 3517, "run_ast_nodes"),
             fr(f"{ipy}/core/interactiveshell.py", 3334, "run_cell_async"),
             fr(f"{ipk}/ipkernel.py", 449, "do_execute"),
             fr(f"{ipk}/kernelbase.py", 778, "execute_request"),
             fr(f"{stdlib}/asyncio/events.py", 84, "_run"),
             fr(f"{stdlib}/asyncio/base_events.py", 1936, "_run_once"),
             fr(f"{stdlib}/runpy.py", 88, "_run_code")]
    body = CELL_FILE.format(cell * 1000 + 1)  # the body: a cell file of its own

    def stack(kind: int) -> list[dict[str, Any]]:
        line = 3 + kind % 6  # six cell lines allocate
        inner: list[dict[str, Any]] = []
        # kind % 3 of 0: the cell line itself; 1 or 2 model layers deep otherwise
        for depth in range(kind % 3):
            inner += [fr(f"{torch_dir}/nn/modules/linear.py", 125, "forward"),
                      fr(f"{torch_dir}/nn/modules/module.py", 1750, "_call_impl"),
                      fr(f"{torch_dir}/nn/modules/module.py", 1739, "_wrapped_call_impl"),
                      fr("/home/user/model.py", 40 + 3 * depth + kind % 5, "forward")]
        return [*inner, fr(body, line, "<module>"), *outer]

    out: list[dict[str, Any]] = []
    live: list[tuple[int, int]] = []
    t = t0_us
    addr_next = 0x7F00_0000_0000 + seed * (1 << 36)
    while len(out) < n:
        t += rng.randint(1, 20)
        if live and (rng.random() < 0.5 or len(live) > 400):
            addr, size = live.pop(rng.randrange(len(live)))
            out.append({"action": "free_requested", "addr": addr, "size": size, "stream": 0,
                        "time_us": t})
            out.append({"action": "free_completed", "addr": addr, "size": size, "stream": 0,
                        "time_us": t + 1})
            continue
        size = rng.choice((512, 4096, 1 << 20, 4 << 20, 16 << 20))
        addr = addr_next
        addr_next += size
        # frames: a list of its own per entry, of shared frame dicts (see the docstring)
        frames_list = stack(rng.randrange(24))
        if size >= 4 << 20 and rng.random() < 0.05:
            out.append({"action": "segment_alloc", "addr": addr, "size": 20 << 20, "stream": 0,
                        "time_us": t, "frames": frames_list})
        out.append({"action": "alloc", "addr": addr, "size": size, "stream": 0,
                    "time_us": t, "frames": list(frames_list)})
        live.append((addr, size))
    return out[:n]


class _PrebuiltTorch:
    """The calls ``CellTracer`` makes, answered at once: the snapshot is prebuilt, so what is
    timed is gpumem_nb's part only."""

    def __init__(self, snapshot: dict[str, Any], recording: bool) -> None:
        import gpumem_nb
        self.snap = snapshot
        self.recording = recording
        # skip dirs as a kernel has them: IPython etc. from sys.modules, a torch directory
        self._modules = dict(sys.modules)
        self._modules["torch"] = type(sys)("torch")
        self._modules["torch"].__file__ = "/opt/venv/lib/python3.12/site-packages/torch/__init__.py"
        self._modules["gpumem_nb"] = gpumem_nb
        self.initialized = True

    def allocator_backend(self) -> str:
        return "native"

    def history_enabled(self) -> bool:
        return self.recording

    def record_history(self, enabled: bool, **_: Any) -> str:
        return ""

    def segments_snapshot(self) -> tuple[list[dict[str, Any]], str]:
        return [dict(s) for s in self.snap["segments"]], ""

    def memory_snapshot(self) -> tuple[dict[str, Any], str]:
        return dict(self.snap), ""

    def device_count(self) -> int:
        return 1

    def mem_info(self, i: int) -> tuple[int, int]:
        return 100 << 30, 140 << 30

    def memory_fraction(self, i: int) -> float:
        return 1.0


def _snapshot(traces: list[dict[str, Any]]) -> dict[str, Any]:
    seg = {"device": 0, "address": 0x7F00_0000_0000, "total_size": 2 << 30,
           "allocated_size": 1 << 30, "active_size": 1 << 30, "requested_size": 1 << 30,
           "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
           "is_expandable": False, "frames": [],
           "blocks": [{"address": 0x7F00_0000_0000, "size": 1 << 30, "requested_size": 1 << 30,
                       "state": "active_allocated", "frames": []}]}
    return {"segments": [seg], "device_traces": [traces],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}, "external_annotations": []}


class _GcWatch:
    """The garbage collector's passes while a traced cell's analysis runs: a full pass walks
    every object the kernel holds, the previous cell's snapshot among them."""

    def __init__(self) -> None:
        self.passes: list[tuple[int, float]] = []
        self._t0 = 0.0
        self.on = False

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.passes.append((info["generation"], time.perf_counter() - self._t0))


GC = _GcWatch()


def traced_cell(snapshot: dict[str, Any], *, since_us: float | None,
                recording: bool) -> Any:
    """One traced cell as the magic runs it: start, (the cell), stop; ``ours_s`` is ours."""
    from gpumem_nb.trace import CellTracer

    wall = (lambda: since_us / 1e6) if since_us is not None else (lambda: T0_US / 1e6)
    tracer = CellTracer(_PrebuiltTorch(snapshot, recording), wall=wall,  # type: ignore[arg-type]
                        session=recording)
    GC.on = True
    try:
        assert tracer.start() == ""
        return tracer.stop()
    finally:
        GC.on = False


def kernel_heap(objects: int = 600_000) -> list[Any]:
    """A kernel's long-lived objects (torch's modules, the user's data): what a full garbage
    collection walks, so the previous cell's snapshot adds to a real cost."""
    return [{"i": i} for i in range(objects)]


def _cell_snapshot(n: int, kind: str, run: int, frames: _Frames
                   ) -> tuple[dict[str, Any], float | None]:
    """A fresh snapshot per run, made just before the analysis as torch makes it (so the
    garbage collector finds its objects young, as in a kernel)."""
    if kind != "recording_on":
        return _snapshot(history(n, cell=10 + run, seed=run, frames=frames)), None
    before = history(n - max(1, n // 2), cell=10 + run, seed=run, frames=frames)
    since = before[-1]["time_us"] + 1000 if before else T0_US
    mine = history(max(1, n // 2), cell=11 + run, t0_us=since + 10, seed=run + 1, frames=frames)
    return _snapshot(before + mine), since


def measure(n: int, kind: str, runs: int) -> dict[str, Any]:
    frames = _Frames()
    held: Any = None
    times, result = [], None
    gc_ms, full = 0.0, 0
    for run in range(runs + (kind != "first")):
        snap, since = _cell_snapshot(n, kind, run, frames)
        GC.passes.clear()
        result = traced_cell(snap, since_us=since, recording=kind == "recording_on")
        if kind == "first" or run > 0:
            gc_ms += sum(s for _, s in GC.passes) * 1e3
            full += sum(g == 2 for g, _ in GC.passes)
        # "later": the previous cell's report and snapshot stay held while the next runs
        held = result if kind != "first" else None
        if kind == "first" or run > 0:
            times.append(result.ours_s * 1e3)
        del snap
    assert result is not None and (held is None) == (kind == "first")
    d = result.devices[0] if result.devices else None
    return {"history_entries": len(result.snapshot["device_traces"][0]), "cell": kind,
            "ours_ms": [round(x, 1) for x in times], "best_ours_ms": round(min(times), 1),
            "median_ours_ms": round(sorted(times)[len(times) // 2], 1),
            "gc_ms_per_cell": round(gc_ms / len(times), 1),
            "full_gc_passes_per_cell": round(full / len(times), 2),
            "entries_counted": result.entries, "allocations": d.allocations if d else 0,
            "top_site": d.at_peak[0].label if d and d.at_peak else None}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    runs = 2 if "--quick" in args else 5
    heap = kernel_heap()  # held to the end: what a full collection walks
    gc.collect()
    gc.callbacks.append(GC)
    rows = []
    for n in SIZES:
        for kind in ("first", "later", "recording_on"):
            row = measure(n, kind, runs)
            rows.append(row)
            print(row, flush=True)
    emit("bench_trace", {
        "machine": "CPU only (the 2-core dev machine): gpumem_nb's part of a traced cell; "
                   "torch's snapshot and record switch are not in these figures",
        "python": sys.version.split()[0], "kernel_heap_objects": len(heap),
        "target_ms": 30, "rows": rows})


if __name__ == "__main__":
    main()
