"""Reading the allocator must never import torch, initialise CUDA or mutate anything."""

from __future__ import annotations

from gpumem_nb.sources.torch import (
    TORCH_INITIALIZED,
    TORCH_NOT_IMPORTED,
    TORCH_NOT_INITIALIZED,
    TorchSource,
    alloc_conf,
    parse_stats,
)

from .fakes import FakeCuda, FakeCudaDevice, GiB, fake_torch, nested_stats


def test_without_torch_imported_nothing_is_read_and_torch_stays_unimported():
    modules: dict = {}
    src = TorchSource(modules)
    assert src.state() == TORCH_NOT_IMPORTED
    assert src.read(0) is None
    assert "torch" not in modules


def test_before_cuda_init_no_stats_call_is_made_at_all():
    cuda = FakeCuda(initialized=False)
    src = TorchSource({"torch": fake_torch(cuda)})
    assert src.state() == TORCH_NOT_INITIALIZED
    assert src.read(0) is None
    assert src.identity(0) == (None, None)
    assert cuda.calls == []


def test_after_init_one_stats_call_per_read_with_explicit_device():
    cuda = FakeCuda([FakeCudaDevice("u0"), FakeCudaDevice("u1")], initialized=True)
    cuda.allocate(1, 3 * GiB)
    src = TorchSource({"torch": fake_torch(cuda)})
    r = src.read(1)
    assert src.state() == TORCH_INITIALIZED
    assert cuda.calls == ["stats(1)"]
    assert r is not None and r.allocated_bytes == 3 * GiB and r.peak_allocated_bytes == 3 * GiB


def test_reads_never_reset_peaks_or_empty_the_cache():
    cuda = FakeCuda(initialized=True)
    src = TorchSource({"torch": fake_torch(cuda)})
    for _ in range(3):
        src.read(0)
        src.identity(0)
        src.allocator_info()
    assert not any(c.startswith(("empty_cache", "reset_peak")) for c in cuda.calls)


def test_stats_fields_come_from_the_nested_dict():
    r = parse_stats(nested_stats(allocated=5, reserved=9, peak_allocated=7, peak_reserved=11,
                                 inactive_split=2, retries=1, ooms=3))
    assert (r.allocated_bytes, r.reserved_bytes, r.peak_allocated_bytes, r.peak_reserved_bytes,
            r.inactive_split_bytes, r.num_alloc_retries, r.num_ooms) == (5, 9, 7, 11, 2, 1, 3)


def test_alloc_conf_prefers_the_current_variable_name():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "old", "PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    assert alloc_conf(env) == ("expandable_segments:True", "PYTORCH_ALLOC_CONF")
    assert alloc_conf({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}) == (
        "backend:cudaMallocAsync", "PYTORCH_CUDA_ALLOC_CONF")
    assert alloc_conf({}) == ("", "")


def test_a_failing_stats_call_yields_none_instead_of_raising():
    cuda = FakeCuda(initialized=True)
    src = TorchSource({"torch": fake_torch(cuda)})
    assert src.read(5) is None  # no such device
    assert "IndexError" in src.last_error
