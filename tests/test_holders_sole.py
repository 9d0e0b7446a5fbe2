"""``del big`` proved to free big's tensors from reference counts alone (holders/sole.py), and
every case it cannot prove left to the retention search: fakes shaped like PyTorch 2.11's
tensors and storages (a storage's use count is its tensors and its Python object)."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace
from typing import Any

import pytest

from gpumem_nb.holders import verify
from gpumem_nb.holders.retention import RootContext
from gpumem_nb.holders.sole import SoleProof

from .fakes import CppHeld, GiB

_STORAGES: weakref.WeakValueDictionary[int, Storage] = weakref.WeakValueDictionary()


class Storage:
    """``torch.UntypedStorage``: ``users`` counts the tensors on it (each holds the C++
    storage); the tensors' reference to this object plays C++'s own reference to it."""

    def __init__(self, nbytes: int) -> None:
        self._nbytes = nbytes
        self.users = 0
        self._cdata = id(self)
        _STORAGES[id(self)] = self

    def nbytes(self) -> int:
        return self._nbytes

    def data_ptr(self) -> int:
        return self._cdata


class Tensor:
    """An exact ``torch.Tensor``: the proof reads nothing of a subclass."""

    def __init__(self, nbytes: int = GiB, storage: Storage | None = None) -> None:
        self._storage = storage if storage is not None else Storage(nbytes)
        self._storage.users += 1

    def __del__(self) -> None:
        self._storage.users -= 1

    def untyped_storage(self) -> Storage:
        return self._storage

    def view(self) -> Tensor:
        return Tensor(storage=self._storage)


def use_count(cdata: int) -> int:
    s = _STORAGES[cdata]
    return s.users + 1  # its tensors, and its Python object


def torch(version: str = "2.11.0+cu130") -> Any:
    return SimpleNamespace(__version__=version, Tensor=Tensor,
                           _C=SimpleNamespace(_storage_Use_Count=use_count))


MODS = {"torch": torch()}


def storage_of(t: Any) -> Any:
    if not isinstance(t, Tensor):
        return None
    s = t.untyped_storage()
    return "cuda:0", s.nbytes(), ("cuda:0", s.data_ptr())


def proof() -> SoleProof:
    p = SoleProof.of(MODS)
    assert p is not None
    return p


def frees(ns: dict, names: list[str], tensors: list[Any]) -> bool:
    return proof().frees(ns, names, tensors, ours=[tensors])


def items(ns: dict, name: str) -> list[Any]:
    """The tensors a name holds, in a list of the caller's. (Made outside ``assert``: pytest's
    rewriting keeps each subexpression in a local, one more reference nobody can see.)"""
    value = ns[name]
    out = list(value.values()) if isinstance(value, dict) else \
        list(value) if isinstance(value, list) else [value]
    value = None
    return out


def test_a_tensor_only_its_name_holds_is_freed_by_its_del():
    ns: dict[str, Any] = {"big": Tensor()}
    assert frees(ns, ["big"], [ns["big"]])


def test_a_list_of_tensors_only_its_name_holds_is_freed_by_its_del():
    ns: dict[str, Any] = {"acts": [Tensor(), Tensor()], "d": {"w": Tensor()}}
    acts, d = items(ns, "acts"), items(ns, "d")
    assert frees(ns, ["acts"], acts)
    assert frees(ns, ["d"], d)


def test_an_alias_the_cut_leaves_is_not_proved():
    ns: dict[str, Any] = {"big": Tensor()}
    ns["alias"] = ns["big"]
    assert not frees(ns, ["big"], [ns["big"]])
    assert frees(ns, ["big", "alias"], [ns["big"]])


def test_a_container_elsewhere_that_holds_the_tensor_is_not_proved():
    ns: dict[str, Any] = {"big": Tensor()}
    cache = {"k": ns["big"]}  # a module's global, a thread's list
    assert not frees(ns, ["big"], [ns["big"]])
    ns["acts"] = [Tensor()]
    acts = items(ns, "acts")
    assert frees(ns, ["acts"], acts)
    registry = [ns["acts"]]  # the list itself held elsewhere
    assert not frees(ns, ["acts"], acts)
    assert cache and registry


def test_a_reference_python_cannot_see_is_not_proved():
    """An autograd graph that saved the tensor: under PyTorch 2.11 its C++ object then holds
    one reference to the Python object, which no referrer explains."""
    ns: dict[str, Any] = {"big": Tensor()}
    held = CppHeld(ns["big"])
    try:
        assert not frees(ns, ["big"], [ns["big"]])
    finally:
        held.release()
    assert frees(ns, ["big"], [ns["big"]])


def test_a_view_that_shares_the_storage_is_not_proved():
    ns: dict[str, Any] = {"big": Tensor()}
    v = ns["big"].view()  # kept by a frame, or by a graph from C++
    assert not frees(ns, ["big"], [ns["big"]])
    del v
    assert frees(ns, ["big"], [ns["big"]])


def test_a_storage_object_someone_else_holds_is_not_proved():
    ns: dict[str, Any] = {"big": Tensor()}
    s = ns["big"].untyped_storage()
    assert not frees(ns, ["big"], [ns["big"]])
    del s
    assert frees(ns, ["big"], [ns["big"]])


def test_a_tensor_subclass_or_an_old_torch_is_never_proved():
    class Sub(Tensor):
        pass

    ns: dict[str, Any] = {"big": Sub()}
    assert not frees(ns, ["big"], [ns["big"]])
    assert SoleProof.of({"torch": torch("2.10.1")}) is None
    assert SoleProof.of({"torch": SimpleNamespace(__version__="2.11.0", Tensor=Tensor,
                                                  _C=SimpleNamespace())}) is None
    assert SoleProof.of({}) is None


def check(ns: dict, lines: dict[str, list[str]]) -> dict[str, verify.CutCheck]:
    tensors = {name: [v for v in (ns[name] if isinstance(ns[name], list) else [ns[name]])]
               for name in lines}
    return verify.check_cuts(tensors, lines, RootContext(user_ns=ns), storage_of,
                             modules=MODS)


def test_a_proved_cut_skips_the_heap_search(monkeypatch: pytest.MonkeyPatch):
    searched: list[int] = []

    class NoSearch(verify.Search):
        def run(self, *args: Any, **kwargs: Any) -> Any:
            searched.append(1)
            return super().run(*args, **kwargs)

    monkeypatch.setattr(verify, "Search", NoSearch)
    ns: dict[str, Any] = {"big": Tensor()}
    assert check(ns, {"big": ["big"]}) == {"big": verify.CutCheck()}
    assert searched == []
    # Not provable (a list elsewhere also holds it): the search runs and names that list.
    ns["other"] = [ns["big"]]
    got = check(ns, {"big": ["big"]})
    assert searched == [1]
    assert [r.name for r in got["big"].others] == ["other"]


@pytest.mark.slow  # builds a 400,000-object heap and searches it: 9 s in the loop
def test_the_proof_costs_one_pass_not_a_search_on_a_large_heap():
    """The cost at an OOM: a bare torch process tracks ~400,000 objects."""
    import time

    heap = [[i] for i in range(400_000)]
    ns: dict[str, Any] = {"big": Tensor()}
    gc.collect()
    t0 = time.perf_counter()
    assert frees(ns, ["big"], [ns["big"]])
    proved_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    verify.check_cuts({"big": [ns["big"]]}, {"big": ["big"]}, RootContext(user_ns=ns),
                      storage_of, modules={})
    searched_s = time.perf_counter() - t0
    assert heap and proved_s < searched_s
