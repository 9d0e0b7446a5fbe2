"""The holder walk's reaches past parameters (a module's own dict and hooks, lru_cache results,
a suspended generator's locals) against what a hostile or merely unusual user object does:
each test is a way the walk ran the user's code, took seconds, missed a holder's tensor
without saying ``≥``, kept something alive, or gave advice that fails when followed."""

from __future__ import annotations

import functools
import gc
import weakref
from typing import Any

from gpumem_nb.analysis import holder_action
from gpumem_nb.holders import Scanner

from .fakes import FakeTensor, GiB, MiB
from .test_holders import HookedModule, scan, torch_with_nn

ran: list[str] = []
STORE: list = []  # a keyword default's store, as `def hook(..., *, store=[])` keeps one


def test_a_named_modules_override_or_property_is_never_run_and_children_are_still_found():
    # Calling `named_modules()` ran a subclass's code: a property, an override unpacked
    # item by item (a user object's `__iter__`), one yielding millions (3.5 s, no `≥`).
    class Junk:
        def __iter__(self):
            ran.append("Junk.__iter__")
            return iter(("x", HookedModule()))

    class Overridden(HookedModule):
        def named_modules(self, prefix: str = ""):
            ran.append("named_modules")
            yield Junk()
            while True:
                yield "m", HookedModule()

    class AsProperty(HookedModule):
        @property
        def named_modules(self):
            ran.append("named_modules property")
            raise RuntimeError("a property")

    ran.clear()
    for cls in (Overridden, AsProperty):
        child = HookedModule()
        child.kept = FakeTensor(GiB)
        net = cls(FakeTensor(MiB), block=child)
        (h,) = scan({"net": net})
        assert (h.nbytes, h.path, h.walk_capped) == (GiB + MiB, "block.kept", False)
    assert ran == []


def test_a_module_that_is_its_own_grandchild_is_walked_once_and_its_hook_found():
    root = HookedModule(FakeTensor(MiB))
    child = HookedModule()
    root._modules["child"] = child
    child._modules["parent"] = root  # a cycle torch's `named_modules` memo would stop
    feats = [FakeTensor(GiB)]
    child._forward_hooks[0] = lambda m, i, o: feats.append(o)
    (h,) = scan({"root": root})
    assert h.nbytes == GiB + MiB


def test_a_module_dict_key_that_is_no_str_runs_none_of_its_code():
    class Key:
        def __hash__(self) -> int:
            return hash("_modules")  # collides with the name the walk looks for

        def __eq__(self, other: object) -> bool:
            ran.append("Key.__eq__")
            return False

        def __format__(self, spec: str) -> str:
            ran.append("Key.__format__")
            return "key"

    net = HookedModule(FakeTensor(MiB))
    plain = type("Plain", (), {})()
    for obj in (net, plain):
        obj.__dict__[Key()] = [FakeTensor(GiB)]
    ran.clear()
    got = {h.name: h.nbytes for h in scan({"net": net, "plain": plain})}
    assert got == {"net": GiB + MiB, "plain": GiB}
    assert ran == []


def test_a_hook_that_binds_its_store_as_a_default_argument_is_the_modules():
    # `lambda m, i, o, feats=feats: feats.append(o)`: defaults were never read, and its
    # outputs were not found at all.
    net = HookedModule(FakeTensor(MiB), act=HookedModule())
    feats = [FakeTensor(GiB) for _ in range(2)]
    net._modules["act"]._forward_hooks[0] = lambda m, i, o, feats=feats: feats.append(o)

    def record(m: Any, i: Any, o: Any, *, store: list = STORE) -> None:
        store.append(o)

    STORE.append(FakeTensor(GiB))
    net._forward_hooks[1] = record
    (h,) = scan({"net": net})
    assert h.nbytes == 3 * GiB + MiB
    assert "3.00 GiB of it beyond its parameters" in holder_action(h), holder_action(h)
    STORE.clear()


class _PastStop(Scanner):
    """A scan already past its stop, with room left to enter objects (what a large heap
    makes of a real one after 100 ms), counting the objects it looks at."""

    looked = 0

    def _start_walk(self) -> None:
        super()._start_walk()
        self._stop_at = 0.0

    def _tensors_in(self, obj: Any, *args: Any, **kwargs: Any) -> Any:
        self.looked += 1
        return super()._tensors_in(obj, *args, **kwargs)


def test_a_bounded_lru_cache_of_many_entries_is_read_within_the_stop_and_says_at_least():
    # A bounded cache of a million entries is two million referents, and a million entries
    # in its dict: read without the stop it took 1.9 s, each entry entered as an object.
    @functools.lru_cache(maxsize=10_000)
    def f(i: Any) -> Any:
        return FakeTensor(GiB) if i == 0 else (i, 1)

    for i in range(5_000):
        f(i)
    scanner = _PastStop({"torch": torch_with_nn()})
    (h,) = scanner.scan({"f": f})
    assert (h.nbytes, h.walk_capped) == (GiB, True)
    assert scanner.looked < 1_500, scanner.looked
    f.cache_clear()


def test_a_methods_lru_cache_is_cleared_through_its_class_not_the_instance():
    # `c.cache_clear()` raised AttributeError: the cache is the method's, on the class.
    class C:
        @functools.cache  # noqa: B019 - the leak under test
        def embed(self, i: int) -> FakeTensor:
            return FakeTensor(GiB)

    C.__module__ = "__main__"  # a notebook's class: its namespace is walked
    c = C()
    c.embed(0)
    model = HookedModule(FakeTensor(MiB))

    @functools.cache
    def table(i: int) -> FakeTensor:
        return FakeTensor(GiB)

    table(0)
    model.table = table
    got = {h.name: holder_action(h) for h in scan({"c": c, "model": model})}
    assert "`C.embed.cache_clear()`" in got["c"], got["c"]
    assert "`model.table.cache_clear()`" in got["model"], got["model"]
    C.embed.cache_clear()
    table.cache_clear()


def test_a_generator_deleted_after_a_scan_frees_its_locals_and_a_running_one_is_not_read():
    def batches():
        batch = FakeTensor(GiB)
        me = yield 1.0  # noqa: F841 - the generator then holds itself
        yield 2.0
        del batch

    it = batches()
    next(it)
    it.send(it)  # a generator that refers to itself: a cycle the walk must not loop on
    (h,) = scan({"it": it})
    assert h.nbytes == GiB
    ref = weakref.ref(next(o for o in gc.get_referents(it) if isinstance(o, FakeTensor)))
    del it, h
    gc.collect()
    assert ref() is None

    seen: list = []

    def scanning():
        batch = FakeTensor(GiB)  # noqa: F841 - a running frame's local
        seen.extend(scan({"gen": gen}))
        yield

    gen = scanning()
    next(gen)
    assert seen == []  # running: its locals are in use by the code that runs, not kept
