"""DLPack capsules kept in a list were "not found" (KINDS8 dlpack_capsules_queued_for_export):
the collector cannot see into a PyCapsule. Their tensor's place is read from the DLPack struct
by ctypes, against real PyTorch's exporter (skipped where torch is missing) and a capsule of
another name is left alone."""

from __future__ import annotations

import datetime

import pytest

from gpumem_nb.holders.capsules import exported_tensor


def test_a_capsule_of_another_name_or_any_other_object_is_not_read():
    assert exported_tensor(datetime.datetime_CAPI) is None  # type: ignore[attr-defined]
    assert exported_tensor(object()) is None and exported_tensor(b"dltensor") is None


def test_an_unconsumed_dlpack_capsule_gives_its_tensors_address_and_bytes():
    torch = pytest.importorskip("torch")
    from torch.utils.dlpack import from_dlpack, to_dlpack

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    base = torch.empty((64, 1024), dtype=torch.float32, device=dev)
    view = base[8:]  # a view: data + byte_offset is where its bytes start
    cap = to_dlpack(view)
    found = exported_tensor(cap)
    assert found is not None
    assert found.address == view.data_ptr() and found.nbytes == 56 * 1024 * 4
    assert found.device == ("cuda:0" if dev == "cuda" else "cpu")
    # Consumed, the capsule is renamed and no longer holds the tensor: not read.
    from_dlpack(cap)
    assert exported_tensor(cap) is None
