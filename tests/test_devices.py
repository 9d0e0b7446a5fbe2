"""CUDA_VISIBLE_DEVICES decides which GPU "cuda:0" is; getting it wrong shows the wrong GPU."""

from __future__ import annotations

import pytest

from gpumem_nb.sources.devices import DeviceId, match_by_identity, visible_devices

GPU0 = DeviceId(0, "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "00000000:18:00.0")
GPU1 = DeviceId(1, "GPU-1b2c3d4e-0000-1111-2222-333344445555", "00000000:3B:00.0")
GPU2 = DeviceId(2, "GPU-1b9f0000-aaaa-bbbb-cccc-ddddeeeeffff", "00000000:86:00.0")
MIG0 = DeviceId(1000, "MIG-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "00000000:18:00.0", True)
ALL = [GPU0, GPU1, GPU2, MIG0]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (None, [GPU0, GPU1, GPU2]),
        ("", []),
        ("0", [GPU0]),
        ("2,0", [GPU2, GPU0]),
        ("1, 2", [GPU1, GPU2]),
        ("GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", [GPU0]),
        ("gpu-8932F937", [GPU0]),  # a unique prefix, any case
        ("GPU-1b", []),  # ambiguous prefix names nothing, and ends the list
        ("GPU-1b2c,0", [GPU1, GPU0]),
        ("MIG-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", [MIG0]),
        ("0,7,1", [GPU0]),  # CUDA stops at the first index that names no device
        ("0,0,1", [GPU0]),  # a repeat ends the list too
        ("-1", []),
        ("nonsense,0", []),
    ],
)
def test_cuda_visible_devices_picks_the_gpus_cuda_will_number(env, expected):
    assert visible_devices(env, ALL) == expected


def test_torch_uuid_maps_to_the_right_nvml_device_after_init():
    # torch reports UUIDs without the "GPU-" prefix.
    assert match_by_identity("1b2c3d4e-0000-1111-2222-333344445555", None, ALL) == GPU1


def test_pci_bus_id_is_the_fallback_when_uuid_is_unknown():
    assert match_by_identity(None, "0000:86:00.0", ALL) == GPU2
    assert match_by_identity("ffffffff", "0000:99:00.0", ALL) is None
