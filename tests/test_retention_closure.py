"""Levels of the retention search proved by reference counts near the objects it entered, with
no heap pass (``holders/closure.py``). On the H100 the dry run of `del flush_loop` (an event
loop's scheduled callbacks) needed 14 levels, one heap pass each, and its 0.3 s ran out: the
line went out unchecked and freed 0. The proof may only ever fall back to the heap pass."""

from __future__ import annotations

import ctypes
import sys
import types
from typing import Any

from gpumem_nb.holders.closure import local_referrers
from gpumem_nb.holders.retention import (
    STATE_GARBAGE,
    STATE_ROOTED,
    STATE_UNSEEN,
    RootContext,
    Search,
)

from .fakes import FakeTensor, GiB
from .test_retention import fake_storage


class Part:
    pass


def loop_like(depth: int) -> Any:
    """An object whose parts refer back to it through a chain (a loop, its selector, its keys,
    their handles, a bound method of the loop): all one cycle under one name."""
    top = Part()
    top.scheduled = [FakeTensor(GiB)]  # type: ignore[attr-defined]
    node: Any = top
    for _ in range(depth):
        nxt = Part()
        node.next = nxt
        node = nxt
    node.back = top.__init__  # a bound method of the top, as a handle's callback is
    return top


def dry_run(ns: dict[str, Any], name: str, local: bool) -> tuple[Any, int]:
    """The cut's dry run (as ``verify.check_cuts`` makes it), with its heap passes."""
    left = {k: v for k, v in ns.items() if k != name}
    t = ns[name].scheduled[0]
    search = Search(fake_storage, RootContext(user_ns=left), budget_s=60.0)
    search.local_first = local
    out = search.run([t], ignore={id(ns)}, explained=[ns])
    del t
    left.clear()
    return [(r.state, r.path) for r in out.retained], out.levels - search.local_levels


def test_a_loop_like_cycle_under_a_cut_name_is_proved_without_a_heap_pass_per_level() -> None:
    ns: dict[str, Any] = {"flush_loop": loop_like(12)}
    slow, slow_passes = dry_run(ns, "flush_loop", False)
    fast, fast_passes = dry_run(ns, "flush_loop", True)
    assert slow == fast == [(STATE_GARBAGE, "")], (slow, fast)
    assert slow_passes >= 12 and fast_passes <= 2, (slow_passes, fast_passes)


def test_a_reference_from_c_code_inside_the_cycle_still_reads_as_unseen() -> None:
    ns: dict[str, Any] = {"flush_loop": loop_like(6)}
    held = ns["flush_loop"].next.next.next
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(held))
    try:
        fast, _ = dry_run(ns, "flush_loop", True)
        assert [s for s, _ in fast] == [STATE_UNSEEN], fast
    finally:
        ctypes.pythonapi.Py_DecRef(ctypes.py_object(held))
        del held


def test_a_module_global_inside_the_cycle_still_roots_it() -> None:
    ns: dict[str, Any] = {"flush_loop": loop_like(6)}
    mod = types.ModuleType("gm_closure_mod")
    mod.keep = ns["flush_loop"].next.next  # type: ignore[attr-defined]
    sys.modules["gm_closure_mod"] = mod
    try:
        fast, _ = dry_run(ns, "flush_loop", True)
        assert [s for s, _ in fast] == [STATE_ROOTED], fast
        assert fast[0][1].startswith("gm_closure_mod.keep."), fast
    finally:
        del sys.modules["gm_closure_mod"]


def test_the_proof_fails_where_a_referrer_is_not_near() -> None:
    far = Part()
    x = Part()
    far.x = x  # type: ignore[attr-defined]
    frontier = [x]
    mine = {id(x): 1}  # this frame's own `x`
    assert local_referrers(frontier, iter(()), mine) is None
    assert local_referrers(frontier, iter([far]), mine) == [far]
    assert local_referrers(frontier, iter([far]), {}) is None  # a reference not explained
    frontier.clear()


def test_looking_near_runs_no_code_of_a_proxy_that_answers_for_its_class() -> None:
    calls: list[str] = []

    class Proxy:
        @property  # type: ignore[misc]
        def __class__(self) -> Any:
            calls.append("__class__")
            return type

    p = Proxy()
    x = Part()
    p.x = x  # type: ignore[attr-defined]
    frontier = [x]
    assert local_referrers(frontier, iter([p]), {id(x): 1}) == [p]
    frontier.clear()
    assert calls == []


def test_indexing_a_modules_classes_runs_no_code_of_an_object_that_answers_for_its_class(
) -> None:
    # H200, tutorials 04 and 11: every %gpumem cleanup printed torch's FutureWarning for
    # `torch.distributed.reduce_op`, whose class warns on attribute access: the index asked
    # each module global isinstance(x, type), which falls back to x.__class__.
    import types

    from gpumem_nb.holders.keepers import keepers
    from gpumem_nb.holders.roots import RootContext

    calls: list[str] = []

    class Deprecated:
        @property  # type: ignore[misc]
        def __class__(self) -> Any:
            calls.append("__class__")
            return type

    mod = types.ModuleType("gm_deprecated_probe")
    mod.reduce_op = Deprecated()  # type: ignore[attr-defined]
    held = Part()
    mod.kept = [held]  # type: ignore[attr-defined]
    found = keepers([held], RootContext(modules={"gm_deprecated_probe": mod}), budget_s=5.0)
    assert any("gm_deprecated_probe" in r.name for r in found.roots), found.roots
    assert calls == []
