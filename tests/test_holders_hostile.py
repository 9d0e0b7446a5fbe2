"""The object walk against hostile objects found while testing issue 24: a metaclass that
runs code on lookup, a class that looks like an array through Python properties, a class
whose metaclass makes hashing raise, a walk past its time bound, a container past the item
cap, and a namespace object that breaks the pools' owner search. Each would either run the
user's code, hide a holder's tensors, or let the walk run long without saying ``≥``."""

from __future__ import annotations

import time
import types
from typing import Any

from gpumem_nb.holders import Scanner
from gpumem_nb.oom import POOL_GRAPH, PoolUse
from gpumem_nb.oom.watch import OomWatch

from .fakes import FakeTensor, GiB, MiB
from .helpers import hang_guard
from .test_holders import torch_with_nn

calls: list[str] = []


def scan(ns: dict, **kw: Any) -> list:
    return Scanner({"torch": torch_with_nn()}, **kw).scan(ns)


class Noisy(type):
    """A metaclass that records (and could do anything on) every lookup on its classes."""

    def __getattribute__(cls, name: str) -> Any:
        calls.append(f"metaclass __getattribute__ {name}")
        return type.__getattribute__(cls, name)

    def __getattr__(cls, name: str) -> Any:
        calls.append(f"metaclass __getattr__ {name}")
        raise AttributeError(name)


class Watched(metaclass=Noisy):
    def __init__(self) -> None:
        self.kept = FakeTensor(GiB)


def test_a_metaclass_that_runs_code_on_lookup_is_never_asked_and_its_tensor_is_found():
    calls.clear()
    obj = Watched()
    (h,) = scan({"obj": obj})
    assert (h.nbytes, h.label) == (GiB, "obj → kept")
    assert calls == []


class LazyDataset:
    """Looks like an array by its attribute names, but each is a Python property that loads
    data: reading them is running the user's code."""

    @property
    def nbytes(self) -> int:
        calls.append("nbytes")
        return 8

    @property
    def shape(self) -> tuple[int, ...]:
        calls.append("shape")
        return (2,)

    @property
    def dtype(self) -> str:
        calls.append("dtype")
        return "float32"

    def __getattr__(self, name: str) -> Any:
        calls.append(f"__getattr__ {name}")
        raise AttributeError(name)


def test_an_object_that_only_looks_like_an_array_through_properties_is_never_read():
    calls.clear()
    ds = LazyDataset()
    ds.__dict__["cache"] = FakeTensor(GiB)
    (h,) = scan({"ds": ds})
    assert (h.nbytes, h.path) == (GiB, "cache")
    assert calls == []


class HashRaises(type):
    def __hash__(cls) -> int:
        calls.append("metaclass __hash__")
        raise RuntimeError("class hash")

    def __eq__(cls, other: object) -> bool:
        calls.append("metaclass __eq__")
        raise RuntimeError("class eq")


class Odd(metaclass=HashRaises):
    pass


class Box:
    def __init__(self) -> None:
        self.odd = Odd()
        self.kept = FakeTensor(2 * GiB)


def test_an_attribute_whose_class_cannot_be_hashed_hides_none_of_the_holders_tensors():
    calls.clear()
    holders = scan({"box": Box(), "by_key": {Odd(): FakeTensor(MiB)}})
    assert {(h.name, h.nbytes) for h in holders} == {("box", 2 * GiB), ("by_key", MiB)}
    assert calls == []


class Cell:
    def __init__(self) -> None:
        self.t = FakeTensor(MiB)


def test_a_walk_past_its_time_bound_stops_reading_and_says_at_least():
    # 300,000 objects: the walk stopped entering them at its bound, then still went through
    # every item of the list (seconds here) before it returned.
    many = [Cell() for _ in range(300_000)]
    start = time.perf_counter()
    (h,) = scan({"many": many}, walk_budget_s=0.01)
    assert time.perf_counter() - start < hang_guard(0.5)
    assert h.walk_capped


def test_a_container_longer_than_the_item_cap_marks_its_holder_as_a_lower_bound():
    big = [FakeTensor(GiB), *range(1_000_000), FakeTensor(GiB)]
    (h,) = scan({"big": big}, walk_budget_s=60.0)
    assert h.nbytes == GiB and h.walk_capped


def test_a_simple_namespace_is_named_by_its_attributes_not_by_its_dict():
    (h,) = scan({"cfg": types.SimpleNamespace(cache=FakeTensor(GiB))})
    assert h.label == "cfg → cache"


class CUDAGraph(metaclass=Noisy):
    """A user's class that shares torch's name: its pool() is the user's code."""

    def pool(self) -> Any:
        calls.append("pool()")
        return (1, 7)


def test_the_pool_owner_search_runs_no_user_code_and_survives_a_hostile_namespace():
    calls.clear()

    class NoName(type):
        def __getattribute__(cls, name: str) -> Any:
            raise RuntimeError(name)

    class Nameless(metaclass=NoName):
        pass

    ns = {"g": CUDAGraph(), "n": Nameless()}
    watch = OomWatch(types.SimpleNamespace(shell=types.SimpleNamespace(user_ns=ns)),
                     torch=types.SimpleNamespace())
    pools = (PoolUse((1, 7), POOL_GRAPH, 2 * GiB, GiB),)
    (named,) = watch._named_pools(pools)
    assert named.owner == "" and calls == []


class HistoryOnTorch:
    """torch as the observer sees it while allocation history is recorded (``%%gpumem
    --trace``, or the user's own ``_record_memory_history``): the whole snapshot would carry
    the history, the segments alone are cheap."""

    def __init__(self, segments: list[dict[str, Any]]) -> None:
        self.segments = segments
        self.calls: list[str] = []

    def read(self, device: int) -> None:
        return None

    def grad_enabled(self) -> bool:
        return False

    def history_enabled(self) -> bool:
        return True

    def allocator_backend(self) -> str:
        return "native"

    def memory_snapshot(self) -> tuple[dict[str, Any] | None, str]:
        self.calls.append("memory_snapshot")  # with history: the costly one
        return {"segments": self.segments}, ""

    def segments_snapshot(self) -> tuple[list[dict[str, Any]] | None, str]:
        self.calls.append("segments_snapshot")
        return self.segments, ""


def test_with_history_recorded_the_observer_still_reads_the_pools_and_free_blocks():
    # A CUDA graph's private pool with 80 GiB free (issue 24, point 2): with history on, the
    # observer read no segments, so the pool was unknown and its free memory would be
    # fragmentation again.
    segments = [
        {"device": 0, "total_size": 82 * GiB, "allocated_size": 2 * GiB,
         "segment_pool_id": (1, 0), "blocks": [
             {"size": 2 * GiB, "state": "active_allocated"},
             {"size": 80 * GiB, "state": "inactive"}]},
        {"device": 0, "total_size": 10 * GiB, "allocated_size": 9 * GiB, "blocks": [
            {"size": 9 * GiB, "state": "active_allocated"},
            {"size": GiB, "state": "inactive"}]},
    ]
    torch = HistoryOnTorch(segments)
    host = types.SimpleNamespace(shell=types.SimpleNamespace(user_ns={}),
                                 source=types.SimpleNamespace(), scan=lambda **kw: [])
    watch = OomWatch(host, torch=torch)  # type: ignore[arg-type]
    try:
        watch._on_oom(0, 4 * GiB, 140 * GiB, 0)
    finally:
        watch.close()  # nothing of the watch's may stay in gc.callbacks for the next test
    (ev,) = watch.events
    assert [(p.pool_id, p.reserved_bytes, p.allocated_bytes) for p in ev.pools] == [
        ((1, 0), 82 * GiB, 2 * GiB)]
    assert ev.largest_free_block_bytes == GiB  # the default pool's own, not the graph's
    assert "memory_snapshot" not in torch.calls


def test_a_graphs_output_kept_in_a_variable_is_counted_once_in_the_explanations_ledger():
    # A CUDA graph's static output lives in the graph's private pool and is kept by the user's
    # variable: counted as the variable's and again as the pool's, the ledger's parts added up
    # to more than was allocated, and "not found" shrank by as much.
    from gpumem_nb.oom import OomFacts
    from gpumem_nb.oom.watch import explanation_ledger, pools_in

    static_out, weights = FakeTensor(2 * GiB), FakeTensor(9 * GiB)
    holders = scan({"static_out": static_out, "weights": weights})
    segments = [{"device": 0, "address": id(static_out), "total_size": 82 * GiB,
                 "allocated_size": 2 * GiB, "segment_pool_id": (1, 0), "blocks": []},
                {"device": 0, "address": id(weights), "total_size": 9 * GiB,
                 "allocated_size": 9 * GiB, "blocks": []}]
    facts = OomFacts(device=0, requested_bytes=GiB, total_bytes=140 * GiB, free_bytes=0,
                     allocated_bytes=12 * GiB, reserved_bytes=92 * GiB, measured_at="failure",
                     pools=pools_in(segments, 0))
    led = explanation_ledger(facts, holders)
    assert led is not None
    parts = led.holders_bytes + led.graphs_bytes + led.computation_bytes + led.pools_bytes
    assert parts + led.not_found_bytes == led.allocated_bytes
    assert (led.holders_bytes, led.pools_bytes, led.not_found_bytes) == (11 * GiB, 0, GiB)


class Slotted:
    __slots__ = ("item",)

    def __init__(self, item: Any) -> None:
        self.item = item


class Attrs:
    def __init__(self, item: Any) -> None:
        self.item = item


_WRAPS = (lambda x: [x], lambda x: {"k": x}, Slotted, Attrs, lambda x: (lambda: x),
          lambda x: types.SimpleNamespace(v=x))


def test_tensors_shared_by_many_holders_are_counted_once_and_the_ledger_adds_up():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from gpumem_nb.ledger import ledger

    @settings(max_examples=150, deadline=None)
    @given(sizes=st.lists(st.integers(1, 4 * GiB), min_size=1, max_size=8),
           holders=st.lists(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 5),
                                               st.integers(0, 5)), max_size=6),
                            min_size=1, max_size=6),
           extra=st.integers(0, 8 * GiB))
    def check(sizes: list[int], holders: list[list[tuple[int, int, int]]], extra: int) -> None:
        tensors = [FakeTensor(n) for n in sizes]
        ns: dict[str, Any] = {}
        kept: set[int] = set()
        for i, picks in enumerate(holders):
            items = []
            for which, outer, inner in picks:
                k = which % len(tensors)
                kept.add(k)
                items.append(_WRAPS[outer](Attrs(_WRAPS[inner](tensors[k]))))
            ns[f"h{i}"] = Attrs(tuple(items))  # within the walk's levels: found in full
        found = scan(ns, walk_budget_s=60.0)
        held = sum(sizes[k] for k in kept)
        assert sum(h.nbytes for h in found) == held
        led = ledger("cuda:0", held + extra, found)
        assert led.holders_bytes + led.not_found_bytes == led.allocated_bytes
        assert led.shows_not_found == (extra > 0.01 * (held + extra))

    check()


def test_a_tensor_past_the_walks_container_levels_marks_its_holder_as_a_lower_bound():
    # A dict of lists of dicts (results per run): the walk reads two container levels, so
    # the innermost dict was skipped without a word and its tensors were "not found".
    (h,) = scan({"runs": {"a": [FakeTensor(MiB), {"logits": FakeTensor(GiB)}]}})
    assert h.nbytes == MiB and h.walk_capped
    (plain,) = scan({"rows": [FakeTensor(MiB), [[1, 2], [3.0, "x"]]]})
    assert not plain.walk_capped  # plain numbers past the levels: nothing can hide there


def test_who_and_the_dry_run_split_a_private_pool_as_the_explanation_does(
        shell: Any, monkeypatch: Any, capsys: Any) -> None:
    # A CUDA graph's pool holding 5 GiB that no variable keeps (what the graph's replays
    # write into): the explanation said "in the pool of a CUDA graph", `who` and the dry run
    # "not found: 5.00 GiB": one ledger, read three ways.
    from .test_oom import make_world, run

    w = make_world(monkeypatch)
    run(shell, "%load_ext gpumem_nb")
    shell.user_ns.update(cuda=w.cuda, GiB=GiB)
    run(shell, "weights = cuda.tensor(9 * GiB)")
    graph_owned = w.cuda.tensor(5 * GiB)  # kept here, as a graph keeps its pool's tensors
    plain = w.cuda.memory._build_snapshot

    def with_pool() -> dict[str, Any]:
        snap = plain()
        snap["segments"].append({"device": 0, "address": 1 << 60,
                                 "total_size": 8 * GiB, "allocated_size": 5 * GiB,
                                 "segment_pool_id": (1, 0), "blocks": []})
        return snap

    monkeypatch.setattr(w.cuda.memory, "_build_snapshot", with_pool)
    capsys.readouterr()
    who = shell.run_line_magic("gpumem", "who -o")
    dry = shell.run_line_magic("gpumem", "cleanup --dry-run -o")
    for led in (who.ledgers[0], dry.ledgers[0]):
        assert led.pools == (("the pool of a CUDA graph (torch.cuda.graph / CUDAGraph)",
                              5 * GiB),)
        assert (led.holders_bytes, led.not_found_bytes) == (9 * GiB, 0)
        assert "not found" not in led.line()
    del graph_owned


class Registry(metaclass=Noisy):
    kept: list[Any] = []  # noqa: RUF012 (the class-level list is the point)


def test_who_gc_names_a_class_attribute_without_running_its_metaclass():
    from .fakes import fake_torch

    size = 64 * 1024 * GiB
    Registry.kept.append(FakeTensor(size))
    calls.clear()
    try:
        found = Scanner({"torch": fake_torch()}).scan({"r": Registry()}, include_gc=True)
        (held,) = [h for h in found if h.nbytes == size]
        assert (held.name, held.kind) == (f"{__name__}.Registry.kept[0]", "class attribute")
        assert held.code == f"import {__name__}; {__name__}.Registry.kept.clear()"
        assert calls == []
    finally:
        type.__getattribute__(Registry, "kept").clear()
