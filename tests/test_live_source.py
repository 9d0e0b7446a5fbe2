"""The combined live source: mapping, outside-PyTorch memory, no-GPU behaviour."""

from __future__ import annotations

import os

from gpumem_nb.sources.live import LiveSource
from gpumem_nb.sources.nvml import NvmlSource
from gpumem_nb.sources.torch import TorchSource
from gpumem_nb.views import take

from .fakes import FakeCuda, FakeCudaDevice, FakeGpu, FakePynvml, GiB, MiB, fake_torch
from .helpers import hang_guard, wait_until


def live(fake_nvml: FakePynvml, cuda: FakeCuda | None = None) -> LiveSource:
    modules = {"torch": fake_torch(cuda)} if cuda is not None else {}
    return LiveSource(nvml=NvmlSource(module=fake_nvml),  # type: ignore[arg-type]
                      torch=TorchSource(modules))


def test_outside_pytorch_is_process_usage_minus_reserved():
    gpu = FakeGpu("GPU-aaaa-1111", used_bytes=3 * GiB, procs=[(os.getpid(), 3 * GiB)])
    cuda = FakeCuda([FakeCudaDevice("aaaa-1111", reserved=2 * GiB, allocated=GiB)],
                    initialized=True)
    s = live(FakePynvml([gpu]), cuda).read()
    d = s.devices[0]
    assert d.allocator is not None and d.allocator.reserved_bytes == 2 * GiB
    assert d.outside_pytorch_bytes == GiB


def test_mapping_switches_to_torch_uuids_once_cuda_is_up(monkeypatch):
    # CUDA_VISIBLE_DEVICES hides nothing, but CUDA's order differs from NVML's.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    a = FakeGpu("GPU-aaaa-1111", used_bytes=1 * GiB)
    b = FakeGpu("GPU-bbbb-2222", used_bytes=7 * GiB, bus_id="00000000:3B:00.0")
    cuda = FakeCuda([FakeCudaDevice("bbbb-2222"), FakeCudaDevice("aaaa-1111")])
    src = live(FakePynvml([a, b]), cuda)
    before = src.read()
    assert before.devices[0].nvml.uuid == "GPU-aaaa-1111"  # type: ignore[union-attr]
    cuda.initialized = True
    after = src.read()
    assert after.devices[0].nvml.uuid == "GPU-bbbb-2222"  # type: ignore[union-attr]
    assert after.devices[0].nvml.used_bytes == 7 * GiB  # type: ignore[union-attr]


def test_no_driver_snapshot_says_so_in_one_line_and_shows_host_memory():
    snap = take(live(FakePynvml(library_not_found=True)))
    text = str(snap)
    assert text.splitlines()[0] == (
        "No GPU visible: no NVIDIA driver on this machine (libnvidia-ml not found). "
        "Showing host memory only."
    )
    assert "Host RAM of this process:" in text
    assert "No GPU visible" in snap._repr_html_()


def test_snapshot_table_shows_allocator_and_nvml_side_by_side():
    gpu = FakeGpu("GPU-aaaa-1111", used_bytes=2 * GiB, procs=[(os.getpid(), 2 * GiB)])
    cuda = FakeCuda([FakeCudaDevice("aaaa-1111", allocated=512 * MiB, reserved=GiB)],
                    initialized=True)
    text = str(take(live(FakePynvml([gpu]), cuda)))
    row = text.splitlines()[2]
    assert "2.00 GiB / 141.00 GiB" in row
    assert "512.00 MiB" in row and "1.00 GiB" in row
    assert "allocator: native" in text


def test_selected_devices_limit_what_is_read():
    gpus = [FakeGpu("GPU-a"), FakeGpu("GPU-b", bus_id="00000000:3B:00.0")]
    src = live(FakePynvml(gpus))
    src.selected = [1]
    assert [d.index for d in src.read().devices] == [1]


def test_snapshot_answers_while_the_driver_hangs_and_leaves_one_thread(monkeypatch):
    import sys
    import threading
    import time

    import gpumem_nb

    fake = FakePynvml()
    release = threading.Event()
    init = fake.nvmlInit

    def hung_init() -> None:
        release.wait(60.0)  # a wedged driver: nvmlInit does not return (released below)
        init()

    fake.nvmlInit = hung_init  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delitem(sys.modules, "torch", raising=False)

    def helpers() -> int:
        return sum(t.name == "gpumem_nb-snapshot" and t.is_alive()
                   for t in threading.enumerate())

    try:
        t0 = time.perf_counter()
        snap = gpumem_nb.snapshot()
        # Before: the fresh source's nvmlInit ran on the caller's thread, and the cell that
        # asked for a snapshot hung for good.
        assert time.perf_counter() - t0 < hang_guard(3.0)
        assert "did not answer" in snap.status.nvml and "unknown" in snap.status.nvml
        str(snap)
        snap._repr_html_()
        t0 = time.perf_counter()
        again = gpumem_nb.snapshot()  # the first is still stuck: no second thread joins it
        assert time.perf_counter() - t0 < hang_guard(3.0)
        assert "has not returned" in again.status.nvml
        assert helpers() == 1
    finally:
        release.set()
    assert wait_until(lambda: helpers() == 0)
    assert fake.inits == fake.shutdowns  # the late start is balanced by the helper's close
