"""Bare storage objects are holders: ``t.untyped_storage()`` kept in a registry after its tensor
went keeps all its memory with no tensor to start a search from. On the H100 such a registry
(a dedupe table for saving shared weights) was 100% "not found"."""

from __future__ import annotations

import gc
import sys
import types
from typing import Any

from gpumem_nb.holders import Scanner
from gpumem_nb.holders.retention import RootContext

from .fakes import FakeStorage, FakeTensor, GiB, fake_torch

TORCH = {"torch": fake_torch()}


def gpu(holders: list[Any]) -> list[Any]:
    return [h for h in holders if h.device.startswith("cuda") and h.nbytes]


def test_a_registry_of_bare_storages_in_the_namespace_is_named_with_its_bytes():
    registry = {k: FakeStorage(GiB) for k in range(3)}
    ns: dict[str, Any] = {"storage_registry": registry}
    (h,) = gpu(Scanner(TORCH).scan(ns))
    assert (h.name, h.nbytes, h.kind) == ("storage_registry", 3 * GiB, "container")


def test_a_module_globals_bare_storages_are_found_by_the_search_and_named_by_their_path():
    mod = types.ModuleType("gm_storage_reg")
    mod.registry = {"w": FakeStorage(2 * GiB)}  # type: ignore[attr-defined]
    sys.modules["gm_storage_reg"] = mod
    try:
        gc.collect()
        ns: dict[str, Any] = {}
        (h,) = gpu(Scanner(TORCH).scan(ns, include_gc=True, roots=RootContext(user_ns=ns)))
        assert (h.name, h.nbytes, h.kind) == ("gm_storage_reg.registry['w']", 2 * GiB,
                                              "module global")
        assert h.code == "import gm_storage_reg; gm_storage_reg.registry.clear()"
    finally:
        del sys.modules["gm_storage_reg"]


def test_a_storage_and_a_tensor_on_it_are_one_storage_counted_once():
    """The storage object is keyed as its tensors are (device, data pointer)."""
    view = FakeTensor(GiB)
    st = FakeStorage(GiB, of=view)
    (h,) = gpu(Scanner(TORCH).scan({"pair": [st, view]}))
    assert h.nbytes == GiB


def test_reading_a_storage_runs_no_code_of_a_subclass():
    calls: list[str] = []

    class Hostile(FakeStorage):
        __slots__ = ()

        @property  # type: ignore[misc]
        def device(self) -> Any:
            calls.append("device")
            raise RuntimeError("user code ran")

        def nbytes(self) -> int:
            calls.append("nbytes")
            return 1

    (h,) = gpu(Scanner(TORCH).scan({"s": Hostile(GiB)}))
    assert (h.nbytes, calls) == (GiB, [])
