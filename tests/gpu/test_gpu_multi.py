"""On a machine with two or more GPUs: mapping under a reordered CUDA_VISIBLE_DEVICES, and
reading every device never creates a context on a device the user has not touched."""

from __future__ import annotations

import pytest

from .helpers import fresh

pytestmark = pytest.mark.gpu


def gpu_count() -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


@pytest.fixture
def two_gpus() -> None:
    if gpu_count() < 2:
        pytest.skip("needs two GPUs (the nvidia-h200-x2 machine)")


def test_reordered_visible_devices_map_before_and_after_init_without_touching_gpu_0(two_gpus):
    r = fresh("""
        import json, os, time
        import pynvml, torch
        from gpumem_nb.sources.live import LiveSource
        pynvml.nvmlInit()
        uuids = []
        for i in range(2):
            u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            uuids.append(u.decode() if isinstance(u, bytes) else u)
        src = LiveSource()
        before = [d.nvml.uuid for d in src.read().devices]
        torch.zeros(1, device="cuda:0")  # CUDA device 0 is physical GPU 1 here
        for _ in range(5):
            s = src.read(processes=True)
            time.sleep(0.05)
        after = [d.nvml.uuid for d in s.devices]
        pids = {i: [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(
                    pynvml.nvmlDeviceGetHandleByIndex(i))] for i in range(2)}
        print(json.dumps({"uuids": uuids, "before": before, "after": after,
                          "pid": os.getpid(), "pids": pids,
                          "alloc": [d.allocator is not None for d in s.devices]}))
    """, env={"CUDA_VISIBLE_DEVICES": "1,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    uuids = r["uuids"]
    assert r["before"] == [uuids[1], uuids[0]]
    assert r["after"] == [uuids[1], uuids[0]]
    # Reading stats for CUDA device 1 (physical 0) made no context there.
    assert r["pid"] in r["pids"]["1"] and r["pid"] not in r["pids"]["0"]
