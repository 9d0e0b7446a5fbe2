"""On the real H200: observing creates no context, and the numbers move as documented."""

from __future__ import annotations

import pytest

from .helpers import NVML_BEFORE, fresh

pytestmark = pytest.mark.gpu
MiB = 1 << 20


def test_reading_everything_in_a_fresh_process_creates_no_cuda_context():
    r = fresh(NVML_BEFORE + """
        import json, time, sys
        import torch  # the user's import; gpumem_nb never does this itself
        import gpumem_nb
        from gpumem_nb.sources.live import LiveSource
        from gpumem_nb.sampler import Sampler
        snap = gpumem_nb.snapshot()
        src = LiveSource(); s = Sampler(src, interval_s=0.05); s.start(); time.sleep(1.0); s.stop()
        samples = s.samples()
        time.sleep(0.5)
        print(json.dumps({"before": before, "after": used(),
                          "initialized": torch.cuda.is_initialized(),
                          "ticks": len(samples), "gpus": snap.status.gpu_count,
                          "alloc_seen": any(d.allocator for x in samples for d in x.devices)}))
    """)
    assert r["gpus"] >= 1 and r["ticks"] >= 10
    assert r["initialized"] is False and r["alloc_seen"] is False
    assert r["after"] == r["before"], r


def test_allocated_reserved_and_nvml_move_as_the_facts_say():
    r = fresh("""
        import json, torch
        from gpumem_nb.sources.live import LiveSource
        src = LiveSource()
        def snap():
            d = src.read().devices[0]
            return {"allocated": d.allocator.allocated_bytes if d.allocator else 0,
                    "reserved": d.allocator.reserved_bytes if d.allocator else 0,
                    "nvml": d.nvml.used_bytes, "process": d.nvml.process_bytes,
                    "outside": d.outside_pytorch_bytes}
        torch.zeros(1, device="cuda"); torch.cuda.synchronize()
        base = snap()
        x = torch.randn(20000, 20000, device="cuda"); torch.cuda.synchronize()
        held = snap()
        del x
        freed = snap()
        torch.cuda.empty_cache()
        emptied = snap()
        print(json.dumps({"base": base, "held": held, "freed": freed, "emptied": emptied}))
    """)
    base, held, freed, emptied = r["base"], r["held"], r["freed"], r["emptied"]
    tensor = 20000 * 20000 * 4
    assert held["allocated"] - base["allocated"] >= tensor
    assert held["allocated"] - base["allocated"] < tensor + 2 * MiB
    # del: allocated drops back, reserved stays, NVML does not move.
    assert freed["allocated"] == base["allocated"]
    assert freed["reserved"] == held["reserved"]
    assert abs(freed["nvml"] - held["nvml"]) <= 2 * MiB
    # empty_cache: reserved drops, and NVML drops by the same amount.
    released = freed["reserved"] - emptied["reserved"]
    assert released >= tensor
    assert abs((freed["nvml"] - emptied["nvml"]) - released) <= 2 * MiB
    print("figures:", r)
    if held["process"] is not None:
        assert held["process"] >= held["reserved"]
        assert held["outside"] == held["process"] - held["reserved"]


def test_device_mapping_follows_cuda_visible_devices_by_uuid():
    import pynvml

    pynvml.nvmlInit()
    try:
        n = pynvml.nvmlDeviceGetCount()
        h = pynvml.nvmlDeviceGetHandleByIndex(n - 1)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    finally:
        pynvml.nvmlShutdown()
    r = fresh("""
        import json, torch
        from gpumem_nb.sources.live import LiveSource
        src = LiveSource()
        before = [d.nvml.uuid for d in src.read().devices]
        torch.zeros(1, device="cuda")
        after = [d.nvml.uuid for d in src.read().devices]
        props = str(torch.cuda.get_device_properties(0).uuid)
        print(json.dumps({"before": before, "after": after, "torch": props}))
    """, env={"CUDA_VISIBLE_DEVICES": uuid[:12]})
    assert r["before"] == [uuid] and r["after"] == [uuid]
    assert uuid.lower().endswith(r["torch"].lower())
