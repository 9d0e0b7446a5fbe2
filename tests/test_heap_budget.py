"""The whole heap (reliability 2026-12-05 A3): `%gpumem who --gc` read every object the garbage
collector tracks before its search, with no bound (2-12 s at 5,000,000 objects), and cleanup
collected the whole heap once more than it needed before its search for who keeps the stored
exception. The heap pass now stops at its time and says how much it did not read; cleanup
collects once before that search. Measured: ``benchmarks/bench_heap.py``."""

from __future__ import annotations

import gc
import sys
from typing import Any

import pytest

from gpumem_nb.holders import Scanner
from gpumem_nb.holders import scan as scan_mod
from gpumem_nb.holders.named import KIND_NOT_SEARCHED

from .fakes import FakeCuda, FakeCudaDevice, GiB, fake_torch


def _hidden_tensor_world(monkeypatch: Any) -> tuple[Any, Any]:
    cuda = FakeCuda([FakeCudaDevice("aaaa-1111")], initialized=True)
    torch = fake_torch(cuda)
    monkeypatch.setitem(sys.modules, "torch", torch)
    module = type(sys)("heap_budget_junk")
    module.hidden = cuda.tensor(GiB)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "heap_budget_junk", module)
    return torch, module


def test_the_heap_pass_stops_at_its_time_and_says_how_much_it_did_not_read(monkeypatch):
    torch, _ = _hidden_tensor_world(monkeypatch)
    junk = [[] for _ in range(50_000)]  # noqa: F841 (tracked objects to read)
    monkeypatch.setattr(scan_mod, "HEAP_CHUNK", 1000)
    scanner = Scanner({"torch": torch})
    holders = scanner.scan({}, include_gc=True, search_budget_s=0.0)
    first = holders[0]
    assert first.kind == KIND_NOT_SEARCHED and first.name == scan_mod.HEAP_CUT_NAME
    assert "after 1,000 of the " in first.detail and "were not looked for" in first.detail
    tracked = int(first.detail.split(" of the ")[1].split(" ")[0].replace(",", ""))
    assert tracked > 50_000


def test_a_heap_pass_that_reads_everything_says_nothing_was_left_and_finds_the_tensor(
        monkeypatch):
    torch, _ = _hidden_tensor_world(monkeypatch)
    holders = Scanner({"torch": torch}).scan({}, include_gc=True, search_budget_s=30.0)
    assert not any(h.kind == KIND_NOT_SEARCHED for h in holders)
    assert [(h.name, h.nbytes) for h in holders if h.device == "cuda:0"] == [
        ("heap_budget_junk.hidden", GiB)]


def test_the_explainers_search_never_lists_the_heap_cut(monkeypatch):
    """Only `who --gc` shows it: the OOM explainer's search (``rest_min_bytes``) keeps its
    holders to what holds bytes."""
    torch, _ = _hidden_tensor_world(monkeypatch)
    monkeypatch.setattr(scan_mod, "HEAP_CHUNK", 1000)
    scanner = Scanner({"torch": torch})
    holders = scanner.scan({}, rest_min_bytes=0, search_budget_s=0.0)
    assert scanner.heap_cut
    assert not any(h.name == scan_mod.HEAP_CUT_NAME for h in holders)


def test_who_gc_shows_what_the_heap_pass_did_not_read_first(loaded, monkeypatch):
    monkeypatch.setattr(scan_mod, "HEAP_CHUNK", 1000)
    monkeypatch.setattr(scan_mod.retention, "BUDGET_S", 0.0)
    report = loaded.run_line_magic("gpumem", "who --gc -n 1 -o")
    assert report.holders[0].name == scan_mod.HEAP_CUT_NAME
    assert "were not looked for" in str(report)


def test_cleanup_collects_the_heap_once_before_it_searches_who_keeps_the_exception(
        loaded, monkeypatch):
    loaded.run_cell("def f():\n    x = cuda.tensor(GiB)\n    raise ValueError('x')\nf()",
                    store_history=True)
    calls: list[str] = []
    real = gc.collect

    def counting(*a: Any) -> int:
        calls.append(sys._getframe(1).f_code.co_filename)
        return real(*a)

    monkeypatch.setattr(gc, "collect", counting)
    loaded.run_line_magic("gpumem", "cleanup -o")
    ours = [c for c in calls if c.endswith("cleanup.py")]
    # The first step's, and the one after the exception is dropped (to measure what it freed).
    assert len(ours) == 2, calls


# -- the search's pass for containers the collector does not track ----------------------------
# It read the whole heap in one call before its budget was next looked at: 2.6 s of a
# cleanup's 0.5 s search at 5,000,000 objects in one dict (benchmarks/bench_heap.py, dict).
def _storage(t: Any) -> Any:
    from .fakes import FakeTensor

    return ("cuda:0", t._nbytes, ("cuda:0", id(t))) if type(t) is FakeTensor else None


def _array_held_tensor_under_young_junk(junk_lists: int) -> tuple[dict[str, Any], Any, list]:
    """A tensor only an object array in the namespace holds, older than ``junk_lists`` young
    lists: the collector lists its young objects first, so the array is past the first chunk
    of the heap. Collection is off until the caller turns it back on."""
    import numpy as np

    from .fakes import FakeTensor

    arr = np.empty(1, dtype=object)
    arr[0] = FakeTensor(GiB)
    ns = {"emb": arr, "names": []}  # a namespace holds a tracked object: it is tracked too
    gc.collect()  # the namespace and the array become the oldest objects
    gc.disable()
    junk = [[None] for _ in range(junk_lists)]
    return ns, arr[0], junk


def test_a_search_cut_in_its_untracked_pass_says_how_much_of_the_heap_was_not_searched(
        monkeypatch):
    from gpumem_nb.holders import untracked
    from gpumem_nb.holders.retention import RootContext, Search

    monkeypatch.setattr(untracked, "UNTRACKED_CHUNK", 1000)
    try:
        ns, tensor, junk = _array_held_tensor_under_young_junk(5000)
        now = [0.0]
        search = Search(_storage, RootContext(user_ns=ns), budget_s=1.0, clock=lambda: now[0])
        real = search._untracked_in

        def slow(level: list[Any], out: list[Any]) -> None:
            real(level, out)
            now[0] += 100.0  # each slice of the pass past the budget

        monkeypatch.setattr(search, "_untracked_in", slow)
        (r,) = search.run([tensor]).retained
    finally:
        gc.enable()
    assert r.state == "not searched", (r.state, r.path)
    assert r.why.startswith("the search's 1 s budget ran out while it looked for containers "
                            "the garbage collector does not track, "), r.why
    assert r.why.endswith(" holds was not searched"), r.why
    del junk


@pytest.mark.slow  # reads the whole heap 1,000 objects at a time: 10 s in the loop
def test_an_object_array_past_the_first_chunk_of_the_heap_is_still_found(monkeypatch):
    from gpumem_nb.holders import untracked
    from gpumem_nb.holders.retention import RootContext, Search

    monkeypatch.setattr(untracked, "UNTRACKED_CHUNK", 1000)
    try:
        ns, tensor, junk = _array_held_tensor_under_young_junk(5000)
        (r,) = Search(_storage, RootContext(user_ns=ns), budget_s=60.0).run([tensor]).retained
    finally:
        gc.enable()
    assert (r.state, r.path) == ("rooted", "emb[0]")
    del junk


def test_a_cleanup_whose_search_runs_out_in_the_untracked_pass_says_not_checked(
        loaded, monkeypatch):
    import time

    import gpumem_nb.cleanup as cleanup
    from gpumem_nb.holders import retention, untracked

    monkeypatch.setattr(cleanup, "_HELD_BUDGET_S", 0.5)
    monkeypatch.setattr(untracked, "UNTRACKED_CHUNK", 1000)
    real = retention.Search._untracked_in

    def slow(self: Any, level: list[Any], out: list[Any], depth: int = 3) -> bool:
        read = real(self, level, out, depth)
        if depth == 3:
            time.sleep(0.6)  # one slice of the pass takes the whole budget
        return read

    monkeypatch.setattr(retention.Search, "_untracked_in", slow)
    loaded.run_cell("1/0", store_history=True)
    report = loaded.run_line_magic("gpumem", "cleanup -o")
    step = next(s for s in report.steps if s.step == "last exception")
    assert "not checked whether anything else keeps its frames alive (the search's 0.5 s " \
           "budget ran out while it looked for containers the garbage collector does not " \
           "track, " in step.did, step.did
    assert step.did.endswith("holds was not searched)"), step.did
    assert "stay alive" not in step.did
