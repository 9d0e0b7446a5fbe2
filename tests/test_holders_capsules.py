"""DLPack capsules kept in a list were "not found" (KINDS8 dlpack_capsules_queued_for_export):
the collector cannot see into a PyCapsule. Their tensor's place is read from the DLPack struct
by ctypes, against real PyTorch's exporter (skipped where torch is missing) and a capsule of
another name is left alone."""

from __future__ import annotations

import ctypes
import datetime
import gc
import sys
import types
from typing import Any

import pytest

from gpumem_nb.analysis import holder_advice
from gpumem_nb.holders import Scanner
from gpumem_nb.holders.capsules import KDL_CUDA, _DLManagedTensor, exported_tensor
from gpumem_nb.holders.facts import TensorFacts
from gpumem_nb.holders.retention import STATE_ROOTED, RootContext, Search

from .fakes import GiB, fake_torch


def test_a_capsule_of_another_name_or_any_other_object_is_not_read():
    assert exported_tensor(datetime.datetime_CAPI) is None  # type: ignore[attr-defined]
    assert exported_tensor(object()) is None and exported_tensor(b"dltensor") is None


def test_an_unconsumed_dlpack_capsule_gives_its_tensors_address_and_bytes():
    # The real torch, not a stand-in another test left in sys.modules (a random-order run,
    # seed 20261207, met one: "'torch' is not a package").
    pytest.importorskip("torch.utils.dlpack")
    import torch
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


# -- a CUDA capsule made by hand: the DLManagedTensor a CUDA exporter hands out --------------
_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_set_name = ctypes.pythonapi.PyCapsule_SetName
_set_name.restype = ctypes.c_int
_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
_KEEP: list[Any] = []  # the structs and names the capsules point to (none may be freed)


def cuda_capsule(nbytes: int, address: int = 0) -> Any:
    """A "dltensor" capsule whose DLManagedTensor says uint8[nbytes] on cuda:0 at
    ``address`` (a fake pointer: nothing reads it)."""
    shape = (ctypes.c_int64 * 1)(nbytes)
    m = _DLManagedTensor()
    m.dl_tensor.data = address or (0x7F00_0000_0000 + (len(_KEEP) << 34))
    m.dl_tensor.device.device_type, m.dl_tensor.device.device_id = KDL_CUDA, 0
    m.dl_tensor.ndim = 1
    m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes = 1, 8, 1
    m.dl_tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    _KEEP.extend((shape, m))
    return _new_capsule(ctypes.addressof(m), b"dltensor", None)


TORCH = {"torch": fake_torch()}


def gpu(holders: list[Any]) -> list[Any]:
    return [h for h in holders if h.device.startswith("cuda") and h.nbytes]


def test_capsules_in_a_list_and_a_name_are_named_with_their_bytes_not_not_found():
    """KINDS8 dlpack_capsules_queued_for_export: 0 B named of 35.63 GiB."""
    queue = [(f"layer{i}", cuda_capsule(GiB)) for i in range(5)]
    gc.collect()  # the (name, capsule) tuples become untracked, as in a notebook
    ns: dict[str, Any] = {"export_queue": queue, "last_capsule": queue[-1][1]}
    (h,) = gpu(Scanner(TORCH).scan(ns))
    assert (h.name, h.nbytes, h.device) == ("export_queue", 5 * GiB, "cuda:0")
    assert h.also_held_by == ("last_capsule",)
    assert holder_advice(h).code == "del export_queue, last_capsule"


@pytest.mark.slow  # a whole-heap retention search, 4-31 s on the 2-core machine
def test_a_module_globals_capsule_is_found_by_the_search_and_named_by_its_path():
    mod = types.ModuleType("gm_capsule_exports")
    mod.pending = {"act": cuda_capsule(2 * GiB)}  # type: ignore[attr-defined]
    sys.modules["gm_capsule_exports"] = mod
    try:
        ns: dict[str, Any] = {}
        (h,) = gpu(Scanner(TORCH).scan(ns, include_gc=True, roots=RootContext(user_ns=ns)))
        assert (h.name, h.nbytes) == ("gm_capsule_exports.pending['act']", 2 * GiB)
    finally:
        del sys.modules["gm_capsule_exports"]


def test_a_consumed_capsule_holds_nothing():
    cap = cuda_capsule(GiB)
    assert exported_tensor(cap) is not None
    assert _set_name(cap, b"used_dltensor") == 0  # what a consumer does as it takes it
    assert gpu(Scanner(TORCH).scan({"cap": cap})) == []


@pytest.mark.slow  # a whole-heap retention search, 4-31 s on the 2-core machine
def test_the_del_of_a_capsule_queue_is_checked_and_joins_the_other_name_that_keeps_one():
    """The queue's (name, capsule) tuples are untracked: the untracked pass's own list of
    them made each look held by something unseen, and the line was refused."""
    queue = [(f"layer{i}", cuda_capsule(GiB)) for i in range(3)]
    gc.collect()
    ns: dict[str, Any] = {"export_queue": queue, "last_capsule": queue[-1][1],
                          "helpers": [object()]}  # a tracked namespace, as a notebook's
    del queue
    held = gpu(Scanner(TORCH).scan(ns))
    (h,) = Scanner(TORCH).check_cuts(held, {"export_queue": "del export_queue"},
                                     RootContext(user_ns=ns))
    assert (h.code, h.cut_checked) == ("del export_queue, last_capsule", True)


def test_a_capsule_in_a_namespace_the_collector_does_not_track_is_still_rooted_there():
    cap = cuda_capsule(GiB)
    ns: dict[str, Any] = {"cap": cap}
    assert not gc.is_tracked(ns)  # atoms and capsules only
    (r,) = Search(TensorFacts(TORCH).info, RootContext(user_ns=ns)).run([cap]).retained
    assert (r.state, r.path) == (STATE_ROOTED, "cap")
