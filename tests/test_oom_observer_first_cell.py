"""The OOM observer sees an OOM in the very cell that starts CUDA (a model's first move to the
GPU): it is queued on torch's CUDA start-up (``torch.cuda._lazy_call``) once torch is imported,
never under cudaMallocAsync (there the queued call would make CUDA's start fail), without
gpumem_nb starting CUDA, and once per process across ``%reload_ext``/``%unload_ext``.

The fake CUDA here (``TorchLikeCuda``) starts as ``torch.cuda._lazy_init`` does: it runs the
queue, a queued call that raises fails the start with ``DeferredCudaCallError``, and the queue
runs again at the next start.
"""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest

from gpumem_nb import cudastart
from gpumem_nb.kernel import current_monitor
from gpumem_nb.kernel import monitor as monitor_mod
from gpumem_nb.sources.live import LiveSource
from gpumem_nb.sources.nvml import NvmlSource
from gpumem_nb.sources.torch import (
    OOM_OBSERVER_ATTR,
    OOM_QUEUED_ATTR,
    TorchDebug,
    backend_from_env,
)

from .fakes import (
    FakeCudaDevice,
    FakeGpu,
    FakePynvml,
    GiB,
    OutOfMemoryError,
    TorchLikeCuda,
    fake_torch,
)
from .helpers import run

OBSERVED = "Measured at the failure by the allocator's OOM observer"
QUEUED = "queued: attaches when CUDA starts"


def world(monkeypatch: Any, backend: str = "native", imported: bool = True) -> Any:
    """torch imported (or not yet), CUDA not started, one fake H200."""
    gpu = FakeGpu("GPU-aaaa-1111")
    nvml = FakePynvml([gpu])
    cuda = TorchLikeCuda([FakeCudaDevice("aaaa-1111")], initialized=False, backend=backend)
    cuda.link([gpu])
    torch = fake_torch(cuda)
    if imported:
        monkeypatch.setitem(sys.modules, "torch", torch)
    else:
        # Set, then deleted: monkeypatch then takes out the stand-in a cell's
        # `sys.modules['torch'] = fake` puts in (a delitem of a missing key records nothing
        # to undo, and the next test's `importorskip("torch")` got the stand-in).
        monkeypatch.setitem(sys.modules, "torch", torch)
        monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(monitor_mod, "make_source",
                        lambda: LiveSource(nvml=NvmlSource(module=nvml)))  # type: ignore[arg-type]
    return SimpleNamespace(cuda=cuda, torch=torch, gpu=gpu)


def load(shell: Any, w: Any) -> Any:
    run(shell, "%load_ext gpumem_nb")
    shell.user_ns.update(cuda=w.cuda, GiB=GiB)
    return current_monitor(shell).oom


def ours(w: Any) -> list[Any]:
    """The OOM observer's attachments in torch's start-up queue."""
    return [c for c in w.cuda.queued_calls if hasattr(c, "observer")]


def test_an_oom_in_the_cell_that_starts_cuda_is_measured_by_the_observer(shell, monkeypatch,
                                                                         capsys):
    # Before: the observer was attached at that cell's end, after the OOM, and the
    # explanation said "the OOM observer did not see this one" and counted from the message.
    w = world(monkeypatch)
    watch = load(shell, w)
    result = run(shell, "model = cuda.tensor(400 * GiB)")  # the first CUDA call fails
    assert isinstance(result.error_in_exec, OutOfMemoryError)
    e = watch.last
    assert e is not None and e.source.startswith(OBSERVED), e.source
    assert "did not see this one" not in e.source and e.facts.measured_at == "failure"
    assert e.facts.requested_bytes == 400 * GiB
    assert w.cuda.starts == 1 and len(w.cuda.observers) == 1
    assert watch.observer_status == "attached"
    assert "gpumem: CUDA out of memory on GPU 0" in capsys.readouterr().out


def test_torch_imported_after_loading_is_queued_before_the_cell_that_starts_cuda(
        shell, monkeypatch):
    # Before: torch imported by a cell after the load, CUDA started (and failed) in the next
    # cell: the observer came too late there too.
    w = world(monkeypatch, imported=False)
    watch = load(shell, w)
    shell.user_ns.update(fake=w.torch, sys=sys)
    run(shell, "sys.modules['torch'] = fake")  # `import torch`
    assert len(ours(w)) == 1 and watch.observer_status == QUEUED
    run(shell, "model = cuda.tensor(400 * GiB)")
    assert watch.last is not None and watch.last.source.startswith(OBSERVED)


def test_oom_status_before_torch_is_imported_does_not_read_as_a_cuda_fault(shell, monkeypatch):
    # A newcomer without torch read "not attached: CUDA is not initialized yet" as something
    # to fix; before torch is imported there is nothing to attach to, and it queues itself.
    w = world(monkeypatch, imported=False)
    watch = load(shell, w)
    line = watch.no_oom_line()
    assert "torch is not imported" in line and "CUDA is not initialized" not in line
    assert not w.cuda.initialized and len(ours(w)) == 0


def test_loading_with_torch_imported_queues_the_observer_without_starting_cuda(
        shell, monkeypatch):
    # Queueing must not start CUDA (a fork-based launcher would then refuse to run) nor
    # attach (attaching initialises CUDA).
    w = world(monkeypatch)
    watch = load(shell, w)
    for i in range(3):
        run(shell, f"a{i} = {i}")
    assert not w.cuda.initialized and w.cuda.starts == 0 and w.torch._C.attach_calls == 0
    assert w.cuda.calls == []
    assert len(ours(w)) == 1 and watch.observer_status == QUEUED
    assert not hasattr(w.torch._C, OOM_OBSERVER_ATTR)  # queued is not attached
    assert "OOM observer: queued: attaches when CUDA starts." in watch.no_oom_line()
    run(shell, "x = cuda.tensor(GiB)")  # the user starts CUDA: attached by torch's queue
    assert w.cuda.starts == 1 and w.torch._C.attach_calls == 1
    assert watch.observer_status == "attached"


def test_nothing_is_queued_under_cudamallocasync_and_cuda_starts_fine(shell, monkeypatch):
    # Attaching under cudaMallocAsync raises; queued, it would make the user's CUDA start fail
    # with DeferredCudaCallError. The status says why nothing waits for CUDA.
    w = world(monkeypatch, backend="cudaMallocAsync")
    watch = load(shell, w)
    run(shell, "a = 1")
    assert ours(w) == [] and not hasattr(w.torch._C, OOM_QUEUED_ATTR)
    assert watch.observer_status == \
        "not queued: the cudaMallocAsync allocator has no OOM observer"
    started = run(shell, "x = cuda.tensor(GiB)")
    assert started.error_in_exec is None and w.cuda.initialized and w.cuda.starts == 1
    run(shell, "y = cuda.tensor(400 * GiB)")
    assert watch.last is not None and watch.last.source.startswith("From the error message")
    assert watch.observer_status.startswith("not available: RuntimeError: cudaMallocAsync")


def test_the_backend_is_read_as_torch_read_it_at_import_never_by_starting_cuda(monkeypatch):
    # torch._C._cuda_getAllocatorBackend is a pointer load (what torch.cuda.memory's
    # get_allocator_backend returns); without it, the environment as c10 reads it: the older
    # PYTORCH_CUDA_ALLOC_CONF wins when both are set.
    assert backend_from_env({"PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync"}) == \
        "cudaMallocAsync"
    assert backend_from_env({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                             "PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync"}) == "native"
    assert backend_from_env({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync , "
                                                        "expandable_segments:False"}) == \
        "cudaMallocAsync"
    assert backend_from_env({}) == "native"
    cuda = TorchLikeCuda(initialized=False)
    torch = fake_torch(cuda)
    attached: list[Any] = []
    torch._C = SimpleNamespace(  # a build without _cuda_getAllocatorBackend
        _cuda_attach_out_of_memory_observer=attached.append)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "backend:cudaMallocAsync")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    t = TorchDebug({"torch": torch})
    assert t.import_backend() == "cudaMallocAsync"
    assert t.queue_oom_observer(object) == (
        None, "the cudaMallocAsync allocator has no OOM observer")
    assert cuda.queued_calls == [] and not cuda.initialized and cuda.calls == []
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "")  # set, even empty, it is the one read
    assert t.import_backend() == "native"
    observer, why = t.queue_oom_observer(object)
    assert observer is not None and why == "" and len(cuda.queued_calls) == 1
    assert attached == [] and not cuda.initialized


def test_reload_and_unload_keep_one_registration_and_the_unloaded_watch_is_not_called(
        shell, monkeypatch):
    w = world(monkeypatch)
    first = load(shell, w)
    for _ in range(3):
        run(shell, "%reload_ext gpumem_nb")
    assert len(ours(w)) == 1  # one queued attachment in the process, whatever the loads
    run(shell, "%unload_ext gpumem_nb")
    unloaded = first
    # The first CUDA call fails after the unload: attached by the queue, calling nobody.
    shell.user_ns.update(cuda=w.cuda, GiB=GiB)
    failed = run(shell, "x = cuda.tensor(400 * GiB)")
    assert isinstance(failed.error_in_exec, OutOfMemoryError)
    assert len(w.cuda.observers) == 1 and getattr(w.torch._C, OOM_OBSERVER_ATTR).handler is None
    assert not unloaded.events and unloaded.last is None
    # Loaded again: the same registration, calling the new load only.
    now = load(shell, w)
    run(shell, "y = cuda.tensor(400 * GiB)")
    assert w.torch._C.attach_calls == 1 and len(w.cuda.observers) == 1 and len(ours(w)) == 1
    assert now.last is not None and now.last.source.startswith(OBSERVED)
    assert not unloaded.events


def test_after_a_reload_the_queued_observer_calls_the_new_load_only(shell, monkeypatch):
    w = world(monkeypatch)
    first = load(shell, w)
    run(shell, "%reload_ext gpumem_nb")
    second = current_monitor(shell).oom
    assert second is not first and second.observer_status == QUEUED
    run(shell, "model = cuda.tensor(400 * GiB)")
    assert second.last is not None and second.last.source.startswith(OBSERVED)
    assert not first.events and first.last is None


def test_a_failing_attachment_never_breaks_the_users_cuda_start(shell, monkeypatch):
    w = world(monkeypatch)
    watch = load(shell, w)
    assert len(ours(w)) == 1

    def refuse(fn: Any) -> None:
        w.torch._C.attach_calls += 1
        raise RuntimeError("this allocator refuses observers")

    monkeypatch.setattr(w.torch._C, "_cuda_attach_out_of_memory_observer", refuse)
    started = run(shell, "x = cuda.tensor(GiB)")
    assert started.error_in_exec is None and w.cuda.initialized
    assert w.torch._C.attach_calls == 2  # queued (as CUDA started), then once more, directly
    assert watch.observer_status == "not available: RuntimeError: this allocator refuses " \
                                    "observers"


def test_torchs_queue_run_again_after_a_failed_start_attaches_once(shell, monkeypatch):
    # torch never empties its queue: a start that failed on another queued call runs every
    # call again at the next start. The observer must not be registered twice (each OOM
    # would then be counted and scanned twice).
    w = world(monkeypatch)
    watch = load(shell, w)
    tries: list[int] = []

    def flaky() -> None:  # a library's own queued call, failing the first time
        tries.append(1)
        if len(tries) == 1:
            raise RuntimeError("not yet")

    w.cuda._lazy_call(flaky)
    failed = run(shell, "x = cuda.tensor(GiB)")
    assert type(failed.error_in_exec).__name__ == "DeferredCudaCallError"
    assert not w.cuda.initialized and len(w.cuda.observers) == 1
    run(shell, "x = cuda.tensor(GiB)")
    assert w.cuda.initialized and w.cuda.starts == 2 and len(tries) == 2
    assert len(w.cuda.observers) == 1 and w.torch._C.attach_calls == 1
    run(shell, "y = cuda.tensor(400 * GiB)")
    assert sum(watch.counts.values()) == 1 and watch.last.source.startswith(OBSERVED)


def test_cuda_up_before_loading_attaches_at_once_and_queues_nothing(shell, monkeypatch):
    w = world(monkeypatch)
    w.cuda._lazy_init()
    watch = load(shell, w)
    assert ours(w) == [] and w.torch._C.attach_calls == 1 and watch.observer_status == "attached"


def test_the_per_cell_checks_never_queue_twice_and_stay_cheap(shell, monkeypatch):
    # The cell hooks call arm() before and ensure_attached() after every cell: once queued,
    # neither may queue again nor do more than look at the watch's own flags (and, until CUDA
    # starts, ask torch whether it has).
    w = world(monkeypatch)
    watch = load(shell, w)
    queue = len(w.cuda.queued_calls)
    start = time.perf_counter()
    for _ in range(10_000):
        watch.arm()
        watch.ensure_attached()
    per_cell_us = (time.perf_counter() - start) / 10_000 * 1e6
    print(f"arm + ensure_attached while queued: {per_cell_us:.2f} µs")
    assert len(w.cuda.queued_calls) == queue and not w.cuda.initialized
    assert per_cell_us < 20


def test_a_cuda_start_racing_the_queue_attaches_at_once(monkeypatch):
    # CUDA started on another thread between the check and the queueing: torch's _lazy_call
    # then runs the call at once. The observer is attached then, once.
    cuda = TorchLikeCuda(initialized=False)
    torch = fake_torch(cuda)
    queue = cuda._lazy_call

    def racing(fn: Any) -> None:
        cuda._lazy_init()
        queue(fn)

    monkeypatch.setattr(cuda, "_lazy_call", racing)
    t = TorchDebug({"torch": torch})
    observer, why = t.queue_oom_observer(lambda: SimpleNamespace(handler=None))
    assert why == "" and t.oom_observer_attached() and cuda.queued_calls == []
    assert cuda.observers == [observer] and t.oom_observer(object) == (observer, "")
    assert t.queue_oom_observer(object) == (observer, "")  # found, not queued again


@pytest.mark.parametrize("imported", [True, False])
def test_a_cudastart_hook_and_the_observer_share_the_queue_without_disturbing_it(
        shell, monkeypatch, imported):
    # Both are queued once; cudastart still names the cell that started CUDA.
    w = world(monkeypatch, imported=imported)
    load(shell, w)
    shell.user_ns.update(fake=w.torch, sys=sys)
    if not imported:
        run(shell, "sys.modules['torch'] = fake")
    result = run(shell, "x = cuda.tensor(400 * GiB)")
    hooks = [c for c in w.cuda.queued_calls if isinstance(c, cudastart._InitHook)]
    assert len(hooks) == 1 and len(ours(w)) == 1
    start = current_monitor(shell).cuda_start.started
    assert start is not None and start.execution_count == result.execution_count
