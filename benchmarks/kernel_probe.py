"""What bench_kernel.py runs *inside* each benchmark kernel: the fake GPUs, the tensors, the
timers around the extension's cell callbacks, and the training loop.

It lives in a module rather than in code strings so that both arms of the A/B run exactly the
same code, and so that it can be read and linted. It never imports pytest (tests/fakes.py does
not either) and never imports torch unless the run asked for real CUDA tensors or a GPU
training step.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

# Which events to time: every cell event IPython has, so a rewrite that moves work from
# pre_run_cell to pre_execute (or adds a post_execute callback) is still counted.
CELL_EVENTS = ("pre_execute", "pre_run_cell", "post_run_cell", "post_execute")
PACKAGE = "gpumem_nb"

# parent msg_id -> event -> summed nanoseconds of the package's callbacks for that event
HOOK_NS: dict[str, dict[str, int]] = {}
WRAPPED: dict[str, int] = {}
_FAKE_WORLD: dict[str, Any] = {}


# --------------------------------------------------------------------------------------------
# Fakes: the project's fake NVML and fake torch.cuda, installed before the extension loads
# --------------------------------------------------------------------------------------------
def install_fakes(n_gpus: int) -> str:
    """Put N fake H200s behind ``pynvml`` and ``torch`` in ``sys.modules``.

    The package imports ``pynvml`` by name and finds torch in ``sys.modules``, so this reaches
    whatever code path the extension uses (old or rewritten) without patching it. CUDA is up
    (as after a first ``.cuda()``); the tensors go to device 0 only, so devices 1..N-1 are GPUs
    this process does not use.
    """
    from tests.fakes import FakeCuda, FakeCudaDevice, FakeGpu, FakePynvml, fake_torch

    gpus = [FakeGpu(f"GPU-{i:04x}-bench", bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0")
            for i in range(n_gpus)]
    cuda = FakeCuda([FakeCudaDevice(f"{i:04x}-bench", bus=0x18 + 0x10 * i)
                     for i in range(n_gpus)], initialized=True)
    cuda.link(gpus)
    # The fakes log every call for tests; a benchmark would only grow that list forever.
    cuda.calls = _NullList()
    nvml = FakePynvml(gpus)
    nvml.calls = _NullList()
    sys.modules["pynvml"] = nvml  # type: ignore[assignment]
    sys.modules["torch"] = fake_torch(cuda)
    _FAKE_WORLD.update(cuda=cuda, nvml=nvml)
    return f"{n_gpus} fake GPU(s)"


class _NullList(list):  # type: ignore[type-arg]
    def append(self, item: Any) -> None:
        pass


# --------------------------------------------------------------------------------------------
# The namespace: N small CUDA tensors
# --------------------------------------------------------------------------------------------
def make_tensors(n: int, nbytes: int = 4096) -> tuple[list[Any], str]:
    """N small tensors on device 0, or none with the reason why."""
    if n <= 0:
        return [], "no tensors asked for"
    if "cuda" in _FAKE_WORLD:
        cuda = _FAKE_WORLD["cuda"]
        return [cuda.tensor(nbytes, 0) for _ in range(n)], f"{n} fake CUDA tensors"
    try:
        import torch
    except ImportError:
        return [], "torch is not installed: tensors skipped"
    if not torch.cuda.is_available():
        return [], "torch has no usable CUDA device: tensors skipped"
    keep = [torch.empty(nbytes // 4, dtype=torch.float32, device="cuda") for _ in range(n)]
    torch.cuda.synchronize()
    return keep, f"{n} CUDA tensors of {nbytes} bytes on cuda:0"


# --------------------------------------------------------------------------------------------
# Hook timers
# --------------------------------------------------------------------------------------------
def _module_of(cb: Any) -> str:
    fn = getattr(cb, "func", cb)  # functools.partial
    fn = getattr(fn, "__func__", fn)  # bound method
    return str(getattr(fn, "__module__", None) or type(cb).__module__ or "")


def _parent_msg_id(shell: Any) -> str:
    header = getattr(shell, "parent_header", None) or {}
    msg_id = header.get("msg_id") if isinstance(header, dict) else None
    if not msg_id:  # older ipykernels keep it on the kernel
        kernel = getattr(shell, "kernel", None)
        try:
            msg_id = kernel.get_parent()["header"]["msg_id"]  # type: ignore[union-attr]
        except Exception:
            msg_id = "?"
    return str(msg_id)


def _timed(shell: Any, event: str, cb: Callable[..., Any]) -> Callable[..., Any]:
    clock = time.perf_counter_ns

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        try:
            return cb(*args, **kwargs)
        finally:
            dt = clock() - t0
            rec = HOOK_NS.setdefault(_parent_msg_id(shell), {})
            rec[event] = rec.get(event, 0) + dt

    timed.__wrapped__ = cb  # type: ignore[attr-defined]
    timed._bench_timer = True  # type: ignore[attr-defined]
    return timed


def wrap_hooks(shell: Any) -> dict[str, int]:
    """Replace every cell callback registered from the package with a timing wrapper, in
    place in IPython's callback lists (so the order of callbacks is kept). Returns how many
    were wrapped per event; the without-extension arm finds none."""
    for event in CELL_EVENTS:
        callbacks = shell.events.callbacks.get(event, [])
        for i, cb in enumerate(callbacks):
            if getattr(cb, "_bench_timer", False):
                continue
            if _module_of(cb).split(".")[0] == PACKAGE:
                callbacks[i] = _timed(shell, event, cb)
                WRAPPED[event] = WRAPPED.get(event, 0) + 1
    return dict(WRAPPED)


def unwrap_hooks(shell: Any) -> None:
    """Put the original callbacks back (the extension's unload looks for those objects)."""
    for event in CELL_EVENTS:
        callbacks = shell.events.callbacks.get(event, [])
        for i, cb in enumerate(callbacks):
            if getattr(cb, "_bench_timer", False):
                callbacks[i] = cb.__wrapped__
    WRAPPED.clear()


def unwrapped_hooks(shell: Any) -> int:
    """Package callbacks that appeared after wrap_hooks (they would escape the timers)."""
    return sum(1 for event in CELL_EVENTS for cb in shell.events.callbacks.get(event, [])
               if not getattr(cb, "_bench_timer", False)
               and _module_of(cb).split(".")[0] == PACKAGE)


def timer_overhead_ns(n: int = 2000) -> float:
    """Median cost of one timing wrapper around a no-op, so readers can discount it."""
    class _Shell:
        parent_header = {"msg_id": "overhead"}  # noqa: RUF012 - a constant probe

    fn = _timed(_Shell(), "probe", lambda *a: None)
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn(None)
        samples.append(time.perf_counter_ns() - t0)
    HOOK_NS.pop("overhead", None)
    return float(statistics.median(samples))


def hook_records_json() -> str:
    return json.dumps(HOOK_NS)


# --------------------------------------------------------------------------------------------
# GC and environment
# --------------------------------------------------------------------------------------------
def gc_state() -> dict[str, Any]:
    """GC settings and counters, and the process's CPU time (all threads: the sampler's
    background work shows here and nowhere else)."""
    return {"enabled": gc.isenabled(), "threshold": list(gc.get_threshold()),
            "collections": [s["collections"] for s in gc.get_stats()],
            "process_cpu_s": time.process_time(), "monotonic_s": time.monotonic()}


def kernel_info_json() -> str:
    mod = sys.modules.get(PACKAGE)
    torch = sys.modules.get("torch")
    return json.dumps({
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "pid": os.getpid(),
        "gpumem_nb_file": getattr(mod, "__file__", None),
        "gpumem_nb_version": getattr(mod, "__version__", None),
        "torch_in_sys_modules": torch is not None,
        "torch_version": str(getattr(torch, "__version__", "")) or None,
        "gc": gc_state(),
    })


# --------------------------------------------------------------------------------------------
# Training loop: ~1 ms steps, timed one by one
# --------------------------------------------------------------------------------------------
def train_kind() -> str:
    """'gpu' when real torch has CUDA; otherwise a pure-Python CPU step."""
    if "cuda" in _FAKE_WORLD:
        return "cpu"
    try:
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    except Exception:
        return "cpu"


def _step_fn(kind: str, param: int) -> Callable[[], Any]:
    if kind == "gpu":
        import torch

        a = torch.randn(1024, 1024, device="cuda")

        def gpu_step() -> Any:
            for _ in range(param):
                b = a @ a
            torch.cuda.synchronize()
            return b

        return gpu_step

    def cpu_step() -> int:
        s = 0
        for i in range(param):
            s += i
        return s

    return cpu_step


def calibrate(kind: str, target_ns: int = 1_000_000) -> int:
    """The step size (matmuls per step, or loop iterations) that takes about target_ns."""
    param = 1 if kind == "gpu" else 10_000
    for _ in range(20):
        step = _step_fn(kind, param)
        for _ in range(20):
            step()
        samples = []
        for _ in range(50):
            t0 = time.perf_counter_ns()
            step()
            samples.append(time.perf_counter_ns() - t0)
        med = statistics.median(samples)
        new = max(1, round(param * target_ns / med))
        if abs(new - param) <= max(1, param // 50):
            return new
        param = new
    return param


def train(kind: str, param: int, steps: int, warmup: int = 100) -> str:
    """Per-step nanoseconds (JSON), warm-up steps dropped."""
    step = _step_fn(kind, param)
    clock = time.perf_counter_ns
    out = []
    for i in range(warmup + steps):
        t0 = clock()
        step()
        if i >= warmup:
            out.append(clock() - t0)
    return json.dumps(out)
