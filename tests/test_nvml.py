"""The NVML source under the failures real machines produce."""

from __future__ import annotations

import os

from gpumem_nb.model import STATUS_LOST, STATUS_OK
from gpumem_nb.sources.nvml import NvmlSource

from .fakes import FakeGpu, FakePynvml, GiB, MiB


def started(fake: FakePynvml, env: dict[str, str] | None = None) -> NvmlSource:
    src = NvmlSource(module=fake)  # type: ignore[arg-type]
    src.start()
    return src


def test_library_not_found_gives_one_plain_status_and_no_devices():
    src = started(FakePynvml(library_not_found=True))
    assert src.status == "no NVIDIA driver on this machine (libnvidia-ml not found)"
    assert src.devices == []
    assert src.cuda_order({}) == []


def test_v2_memory_separates_driver_reserved_from_used():
    gpu = FakeGpu("GPU-a", used_bytes=2 * GiB, reserved_bytes=615 * MiB)
    src = started(FakePynvml([gpu]))
    r = src.read(src.devices[0])
    assert (r.used_bytes, r.driver_reserved_bytes, r.total_bytes) == (2 * GiB, 615 * MiB,
                                                                     141 * GiB)


def test_v2_missing_falls_back_to_v1_once_and_keeps_reading():
    fake = FakePynvml([FakeGpu("GPU-a", used_bytes=GiB)], v2_missing=True)
    src = started(fake)
    first = src.read(src.devices[0])
    second = src.read(src.devices[0])
    assert first.used_bytes == GiB + 615 * MiB  # v1's "used" includes the reservation
    assert first.driver_reserved_bytes is None
    assert second.status == STATUS_OK
    assert fake.calls.count("memory_v2") == 1  # not retried on every sample


def test_gpu_lost_gives_a_placeholder_while_other_devices_keep_reporting():
    lost = FakeGpu("GPU-a")
    fine = FakeGpu("GPU-b", used_bytes=3 * GiB, bus_id="00000000:3B:00.0")
    src = started(FakePynvml([lost, fine]))
    lost.lost = True
    a, b = (src.read(d) for d in src.devices)
    assert a.status == STATUS_LOST and a.used_bytes is None
    assert b.status == STATUS_OK and b.used_bytes == 3 * GiB


def test_this_process_is_found_by_pid_and_others_are_summed():
    gpu = FakeGpu("GPU-a", procs=[(os.getpid(), 2 * GiB), (1, GiB)])
    src = started(FakePynvml([gpu]))
    r = src.read(src.devices[0])
    assert r.process_bytes == 2 * GiB
    assert r.other_processes_bytes == GiB


def test_process_memory_none_from_nvml_stays_unknown_not_zero():
    gpu = FakeGpu("GPU-a", procs=[(os.getpid(), None)])
    r = started(FakePynvml([gpu])).read(started(FakePynvml([gpu])).devices[0])
    assert r.process_bytes is None


def test_foreign_pids_in_a_container_make_our_usage_unknown_rather_than_guessed():
    # Host PIDs that do not exist in our PID namespace.
    gpu = FakeGpu("GPU-a", procs=[(2_999_999_001, 5 * GiB)])
    src = started(FakePynvml([gpu]))
    r = src.read(src.devices[0])
    assert r.process_bytes is None
    assert r.other_processes_bytes is None


def test_absent_pid_with_a_known_context_is_unknown_not_zero():
    gpu = FakeGpu("GPU-a", procs=[])
    src = started(FakePynvml([gpu]))
    assert src.read(src.devices[0], context_expected=False).process_bytes == 0
    assert src.read(src.devices[0], context_expected=True).process_bytes is None


def test_process_list_unavailable_leaves_memory_readings_intact():
    gpu = FakeGpu("GPU-a", used_bytes=GiB)
    src = started(FakePynvml([gpu], processes_unsupported=True))
    r = src.read(src.devices[0])
    assert r.used_bytes == GiB and r.process_bytes is None and r.status == STATUS_OK


def test_old_driver_without_v3_process_call_uses_v2():
    gpu = FakeGpu("GPU-a", procs=[(os.getpid(), GiB)])
    fake = FakePynvml([gpu], v3_missing=True)
    src = started(fake)
    assert src.read(src.devices[0]).process_bytes == GiB
    assert src.read(src.devices[0]).process_bytes == GiB
    assert fake.calls.count("procs_v2") == 2


def test_cuda_visible_devices_by_uuid_and_reordered():
    a = FakeGpu("GPU-aaaa-1111", bus_id="00000000:18:00.0")
    b = FakeGpu("GPU-bbbb-2222", bus_id="00000000:3B:00.0")
    src = started(FakePynvml([a, b]))
    by_uuid = src.cuda_order({"CUDA_VISIBLE_DEVICES": "GPU-bbbb"})
    assert [d.uuid for d in by_uuid] == ["GPU-bbbb-2222"]
    reordered = src.cuda_order({"CUDA_VISIBLE_DEVICES": "1,0"})
    assert [d.uuid for d in reordered] == ["GPU-bbbb-2222", "GPU-aaaa-1111"]
    by_int = src.cuda_order({"CUDA_VISIBLE_DEVICES": "1"})
    assert [d.nvml_index for d in by_int] == [1]


def test_fastest_first_order_puts_the_newer_gpu_first_on_mixed_machines():
    old = FakeGpu("GPU-old", name="Tesla V100", capability=(7, 0))
    new = FakeGpu("GPU-new", name="NVIDIA H200", capability=(9, 0), bus_id="00000000:3B:00.0")
    src = started(FakePynvml([old, new]))
    assert [d.uuid for d in src.cuda_order({})] == ["GPU-new", "GPU-old"]
    pci = src.cuda_order({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert [d.uuid for d in pci] == ["GPU-old", "GPU-new"]


def test_mig_instances_are_addressable_by_their_uuid():
    mig = FakeGpu("MIG-1234-abcd", name="slice", total_bytes=35 * GiB, used_bytes=GiB)
    parent = FakeGpu("GPU-parent", migs=[mig])
    src = started(FakePynvml([parent]))
    devs = src.cuda_order({"CUDA_VISIBLE_DEVICES": "MIG-1234-abcd"})
    assert len(devs) == 1 and devs[0].is_mig
    assert src.read(devs[0]).total_bytes == 35 * GiB


def test_init_and_shutdown_are_balanced():
    fake = FakePynvml()
    src = started(fake)
    src.start()
    src.close()
    assert fake.inits == 1 and fake.shutdowns == 1


def test_a_device_count_that_fails_still_balances_the_init_it_followed():
    fake = FakePynvml()

    def count() -> int:
        raise fake.NVMLError(fake.NVML_ERROR_UNKNOWN)

    fake.nvmlDeviceGetCount = count  # type: ignore[method-assign]
    src = started(fake)
    assert "could not count devices" in src.status and not src.devices
    src.close()
    # Before: the failed count's status kept close() from calling nvmlShutdown, so every load
    # (and %reload_ext) on such a driver left one more nvmlInit.
    assert (fake.inits, fake.shutdowns) == (1, 1)


def test_hot_path_derives_our_share_from_the_last_process_listing():
    gpu = FakeGpu("GPU-a", used_bytes=3 * GiB, procs=[(os.getpid(), 2 * GiB), (1, GiB)])
    fake = FakePynvml([gpu])
    src = started(fake)
    dev = src.devices[0]
    assert src.read(dev, processes=False).process_bytes is None  # no listing yet: unknown
    src.read(dev)  # the sampler's full read
    gpu.used_bytes = 5 * GiB  # we grew by 2 GiB; the neighbour did not
    calls = len(fake.calls)
    fast = src.read(dev, processes=False)
    assert fast.process_bytes == 4 * GiB and fast.other_processes_bytes == GiB
    assert not [c for c in fake.calls[calls:] if c.startswith("procs")]


def test_hot_path_stays_unknown_when_the_listing_could_not_see_us():
    gpu = FakeGpu("GPU-a", used_bytes=3 * GiB, procs=[(2_999_999_001, 3 * GiB)])
    src = started(FakePynvml([gpu]))
    src.read(src.devices[0])
    assert src.read(src.devices[0], processes=False).process_bytes is None
