"""Cycles made inside the failing loop that run through a tensor's own attributes
(``x.meta = {'source': x}``) or a module's link to its parent, on the H100 under torch 2.11:
called "the failing computation's working set" instead of garbage. PyTorch's ``tp_traverse``
shows nothing of a tensor whose C++ object has another owner, so the referrer search never
found who holds the tensor's ``__dict__``; ``TorchTraverseGc`` stands in for that traversal."""

from __future__ import annotations

import gc
from typing import Any

import pytest

import gpumem_nb.referents as referents_module
from gpumem_nb.analysis import holder_advice
from gpumem_nb.holders import retention, untracked
from gpumem_nb.holders.named import holders_from
from gpumem_nb.holders.retention import STATE_GARBAGE, STATE_UNSEEN, RootContext, Search
from gpumem_nb.oom import CAUSE_GARBAGE

from .fakes import FakeTensor, GiB, TorchTraverseGc
from .test_oom import last, run
from .test_retention import fake_storage, oomworld  # noqa: F401  (the OOM world, native)


def _is_tensor(o: Any) -> bool:
    return type(o) is FakeTensor


def _traverse_as_torch(monkeypatch: Any) -> None:
    """Every module of the retention search that reads the collector's traversal sees torch's
    (``referents`` is where the holders ask for referents)."""
    fake = TorchTraverseGc(_is_tensor)
    for module in (retention, untracked, referents_module):
        monkeypatch.setattr(module, "gc", fake)


@pytest.fixture
def torch_traverse(monkeypatch: Any) -> None:
    _traverse_as_torch(monkeypatch)


@pytest.fixture
def no_collection() -> Any:
    collecting = gc.isenabled()
    gc.disable()
    yield
    if collecting:
        gc.enable()


def test_a_tensor_whose_attribute_refers_back_to_it_is_garbage_not_unseen(
        torch_traverse: None, no_collection: None) -> None:
    x = FakeTensor(13 * GiB)
    x.meta = {"source": x, "valid": True}  # type: ignore[attr-defined]
    targets = [x]
    del x
    out = Search(fake_storage, RootContext(user_ns={})).run(targets)
    (r,) = out.retained
    assert r.state == STATE_GARBAGE, r
    assert r.classes == ("FakeTensor",)
    (h,) = holders_from(out.retained)
    assert holder_advice(h).code == "import gc; gc.collect()"
    targets.clear()


def test_a_tensor_in_a_cycle_that_a_running_frame_also_keeps_is_still_unseen(
        torch_traverse: None, no_collection: None) -> None:
    """The explicit edge explains the tensor's own dict, nothing more: a running frame's
    local (``meta`` here) is a reference Python cannot see, and no collection would free it."""
    x = FakeTensor(11 * GiB)
    meta = {"source": x}
    x.meta = meta  # type: ignore[attr-defined]
    targets = [x]
    del x
    out = Search(fake_storage, RootContext(user_ns={})).run(targets)
    (r,) = out.retained
    assert r.state == STATE_UNSEEN, r
    del meta
    targets.clear()


def test_a_tensor_whose_attribute_a_variable_names_is_named_through_the_attribute(
        torch_traverse: None) -> None:
    x = FakeTensor(7 * GiB)
    x.meta = {"source": x}  # type: ignore[attr-defined]
    box = {"m": x.meta}  # type: ignore[attr-defined]
    targets = [x]
    del x
    out = Search(fake_storage, RootContext(user_ns={"box": box})).run(targets)
    (r,) = out.retained
    assert (r.state, r.path) == ("rooted", "box['m']['source']"), r
    targets.clear()


META_LOOP = ("import gc\ngc.disable()\n"
             "def crop_with_meta(n):\n"
             "    x = cuda.tensor(n)\n"
             "    x.meta = {'source': x, 'valid': True}\n"
             "    return 1\n"
             "for _i in range(4):\n"
             "    crop = crop_with_meta(30 * GiB)\n"
             "y = cuda.tensor(30 * GiB)")

PARENT_LOOP = ("import gc\ngc.disable()\n"
               "class Module:\n"
               "    def __init__(self):\n"
               "        self._parameters, self._buffers, self._modules = {}, {}, {}\n"
               "class Head(Module):\n"
               "    def __init__(self, parent, n):\n"
               "        super().__init__()\n"
               "        self.__dict__['owner'] = parent\n"
               "        self._buffers['anchors'] = cuda.tensor(n)\n"
               "class Detector(Module):\n"
               "    def __init__(self, n):\n"
               "        super().__init__()\n"
               "        self._modules['head'] = Head(self, n)\n"
               "for _i in range(6):\n"
               "    detector = Detector(25 * GiB)\n")


@pytest.mark.parametrize("loop", [META_LOOP, PARENT_LOOP], ids=["tensor_meta", "module_parent"])
def test_cycles_made_in_the_failing_loop_through_tensors_are_garbage_and_collecting_frees_them(
        oomworld: Any, monkeypatch: Any, loop: str) -> None:  # noqa: F811
    _traverse_as_torch(monkeypatch)
    shell = oomworld.shell
    try:
        run(shell, loop)
        e = last(shell)
        assert e.cause == CAUSE_GARBAGE, str(e)
        (step,) = [a for a in e.actions if a.code == "import gc; gc.collect()"]
        before = oomworld.cuda.devices[0].allocated
        run(shell, step.code)
        freed = before - oomworld.cuda.devices[0].allocated
        assert step.nbytes is not None and freed >= 0.95 * step.nbytes > 0
    finally:
        gc.enable()
