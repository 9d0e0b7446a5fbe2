"""A holder that is a container object of a library class (a deque, a dict subclass, a
logging handler's buffer) is emptied through its public call (``d.clear()``), found on its
class and never called by the search: ``del d`` throws the object away with its bytes, and
for a library's own globals no line at all (clearing ``threading._active`` broke it)."""

from __future__ import annotations

import gc
import logging.handlers
import sys
import types
import weakref
from collections import deque
from typing import Any

from gpumem_nb.analysis import holder_advice
from gpumem_nb.holders.named import holders_from
from gpumem_nb.holders.retention import RootContext, Search

from .fakes import FakeTensor, GiB
from .test_retention import fake_storage


def _search(ns: dict[str, Any], t: FakeTensor, modules: Any = None) -> Any:
    targets = [t]
    out = Search(fake_storage, RootContext(user_ns=ns, modules=modules)).run(targets)
    targets.clear()
    (h,) = holders_from(out.retained)
    return h


def _frees(code: str, ns: dict[str, Any], ref: Any) -> bool:
    exec(code, dict(ns))
    gc.collect()
    return ref() is None


class Box:
    recent: deque[Any]


class Registry(dict):  # type: ignore[type-arg]
    """A dict subclass, as a library's registry is."""


def test_a_dict_subclass_registry_is_cleared_through_its_public_clear_not_deleted() -> None:
    t = FakeTensor(5 * GiB)
    ref = weakref.ref(t)
    ns: dict[str, Any] = {"reg": Registry(a=t)}
    h = _search(ns, t)
    del t
    advice = holder_advice(h)
    assert (h.name, h.clear_code, advice.code) == ("reg['a']", "reg.clear()", "reg.clear()")
    assert advice.nbytes == 5 * GiB and "`del reg` also frees it" in advice.text
    assert _frees(advice.code, ns, ref) and "reg" in ns


def test_a_deque_inside_a_users_object_is_cleared_where_it_is() -> None:
    t = FakeTensor(3 * GiB)
    ref = weakref.ref(t)
    box = Box()
    box.recent = deque([None, t], maxlen=8)
    ns: dict[str, Any] = {"box": box}
    h = _search(ns, t)
    del t
    assert (h.name, holder_advice(h).code) == ("box.recent[1]", "box.recent.clear()")
    assert _frees("box.recent.clear()", ns, ref)


def test_a_logging_handlers_buffer_is_emptied_through_the_buffer() -> None:
    t = FakeTensor(2 * GiB)
    ref = weakref.ref(t)
    handler = logging.handlers.MemoryHandler(capacity=1000)
    handler.buffer.append(t)  # type: ignore[arg-type]
    ns: dict[str, Any] = {"handler": handler}
    h = _search(ns, t)
    del t
    assert holder_advice(h).code == "handler.buffer.clear()"
    assert _frees(holder_advice(h).code, ns, ref)


def test_a_second_path_around_the_container_means_no_clear_line() -> None:
    t = FakeTensor(4 * GiB)
    ns: dict[str, Any] = {"d": deque([t]), "other": [t]}
    h = _search(ns, t)
    del t
    assert h.clear_code == ""
    assert holder_advice(h).code == "del d, other"


def test_a_library_modules_global_container_gets_no_clear_line() -> None:
    name = "email._gpumem_test_registry"
    lib = types.ModuleType(name)
    t = FakeTensor(6 * GiB)
    lib.registry = Registry(a=t)  # type: ignore[attr-defined]
    sys.modules[name] = lib
    try:
        h = _search({}, t, modules={name: lib})
        del t
        assert h.clear_code == "" and holder_advice(h).code == ""
    finally:
        del sys.modules[name]
