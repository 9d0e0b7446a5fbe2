"""No NVML, but torch's allocator up: a ROCm build, a container without libnvidia-ml, a driver
older than nvidia-ml-py. The devices are then torch's, with their allocator columns, and NVML's
columns are unknown with the reason. Before: "No GPU visible ... Showing host memory only", no
allocator rows, although the status knew CUDA was initialised."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gpumem_nb.kernel import current_monitor
from gpumem_nb.kernel import monitor as monitor_mod
from gpumem_nb.model import STATUS_NO_NVML
from gpumem_nb.oom import CAUSE_HELD
from gpumem_nb.sources.live import LiveSource
from gpumem_nb.sources.nvml import NvmlSource

from .fakes import FakeCuda, FakeCudaDevice, FakeGpu, FakePynvml, GiB, fake_torch
from .helpers import spaced

NO_LIBRARY = "no NVIDIA driver on this machine (libnvidia-ml not found)"
TOO_OLD = "the NVIDIA driver is too old for nvidia-ml-py (libnvidia-ml lacks its init call)"


def nvml_in(state: str, gpus: list[FakeGpu]) -> FakePynvml:
    if state == "library not found":
        return FakePynvml(gpus, library_not_found=True)
    return FakePynvml(gpus, init_error=FakePynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


def make_world(monkeypatch: Any, state: str, *, initialized: bool = True,
               devices: int = 1) -> Any:
    gpus = [FakeGpu(f"GPU-aaaa-111{i}") for i in range(devices)]
    nvml = nvml_in(state, gpus)  # the GPUs are there; NVML cannot read them
    cuda = FakeCuda([FakeCudaDevice(f"aaaa-111{i}") for i in range(devices)],
                    initialized=initialized)
    cuda.link(gpus)  # the device model the fake allocator runs out of
    torch = fake_torch(cuda)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(monitor_mod, "make_source",
                        lambda: LiveSource(nvml=NvmlSource(module=nvml)))  # type: ignore[arg-type]
    return SimpleNamespace(cuda=cuda, torch=torch, nvml=nvml,
                           reason=NO_LIBRARY if state == "library not found" else TOO_OLD)


def run(ip: Any, source: str) -> Any:
    result = ip.run_cell(source, store_history=True)
    spaced(ip)
    return result


STATES = ["library not found", "driver too old"]


@pytest.fixture(params=STATES)
def world(request: Any, shell: Any, monkeypatch: Any, capsys: Any) -> Any:
    w = make_world(monkeypatch, request.param)
    run(shell, "%load_ext gpumem_nb")
    shell.user_ns.update(cuda=w.cuda, GiB=GiB)
    run(shell, "warm = 1")  # the cell hooks attach the OOM observer once CUDA is up
    w.shell = shell
    w.load_out = capsys.readouterr().out
    return w


def test_without_nvml_the_devices_are_torchs_with_allocator_columns_and_nvml_unknown(
        world, capsys):
    run(world.shell, "big = cuda.tensor(3 * GiB)")
    capsys.readouterr()
    world.shell.run_line_magic("gpumem", "")
    out = capsys.readouterr().out
    assert "No GPU visible" not in out and "host memory only" not in out
    assert "unknown (no NVML)" in out
    assert "3.00 GiB" in out  # allocated and reserved, from torch's allocator
    assert f"NVML is unavailable ({world.reason})" in out
    st = current_monitor(world.shell).status()
    assert st.gpu_count == 1 and st.nvml == world.reason
    sample = current_monitor(world.shell).read()
    (dev,) = sample.devices
    assert dev.allocator is not None and dev.allocator.allocated_bytes == 3 * GiB
    assert dev.nvml is not None and dev.nvml.status == STATUS_NO_NVML
    assert dev.nvml.used_bytes is None and dev.outside_pytorch_bytes is None


def test_without_nvml_the_load_line_says_the_gpus_are_watched_through_the_allocator(world):
    assert "no GPU visible" not in world.load_out
    line = current_monitor(world.shell).status_line()
    assert "watching 1 GPU through PyTorch's allocator" in line and world.reason in line


def test_without_nvml_every_torch_device_is_listed(shell, monkeypatch, capsys):
    make_world(monkeypatch, "library not found", devices=2)
    run(shell, "%load_ext gpumem_nb")
    assert current_monitor(shell).status().gpu_count == 2
    assert [d.index for d in current_monitor(shell).read().devices] == [0, 1]


def test_without_nvml_the_oom_explainer_names_the_variable_holding_the_memory(world, capsys):
    run(world.shell, "big = cuda.tensor(60 * GiB)")
    run(world.shell, "y = cuda.tensor(100 * GiB)")
    out = capsys.readouterr().out
    assert "gpumem: CUDA out of memory on GPU 0" in out
    e = world.shell.run_line_magic("gpumem", "oom -o")
    assert e.cause == CAUSE_HELD, str(e)
    assert [(h.name, h.nbytes) for h in e.holders if h.device == "cuda:0"] == [
        ("big", 60 * GiB)]


def test_without_nvml_who_and_cleanup_work(world, capsys):
    run(world.shell, "big = cuda.tensor(2 * GiB)")
    run(world.shell, "cuda.tensor(1 * GiB)")  # displayed: Out keeps it
    capsys.readouterr()
    world.shell.run_line_magic("gpumem", "who")
    who = capsys.readouterr().out
    assert "big" in who and "2.00 GiB" in who
    world.shell.run_line_magic("gpumem", "cleanup --out")
    out = capsys.readouterr().out
    assert "Traceback" not in out
    assert world.cuda.devices[0].allocated == 2 * GiB  # Out's tensor freed, `big` kept
    assert "big" in world.shell.user_ns


def test_without_nvml_the_chart_draws_the_allocator_lines(world, capsys):
    mon = current_monitor(world.shell)
    mon.sampler.stop()
    run(world.shell, "%gpumem watch")
    held = world.cuda.tensor(2 * GiB)
    mon.sampler.tick()
    chart = mon.widget.chart

    def last(name: str) -> float:
        values = [np.nan if v is None else v for v in chart.recent.get(name, [[], []])[1]]
        return float(values[-1]) if values else float("nan")

    assert held is not None
    assert last("allocated") == pytest.approx(2.0)
    assert last("reserved") == pytest.approx(2.0)
    assert np.isnan(last("nvml_used"))  # unknown, not zero


def test_without_nvml_and_cuda_not_initialised_nothing_is_started(shell, monkeypatch, capsys):
    w = make_world(monkeypatch, "library not found", initialized=False)
    run(shell, "%load_ext gpumem_nb")
    out = capsys.readouterr().out
    assert "no GPU visible" in out
    assert current_monitor(shell).status().gpu_count == 0
    assert not w.cuda.initialized  # never initialised to count devices
    assert not any(c.startswith(("device_count", "get_device_properties"))
                   for c in w.cuda.calls)
