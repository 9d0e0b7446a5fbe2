"""The whole heap (reliability 2026-12-05 A3): `%gpumem who --gc` read every object the garbage
collector tracks before its search, with no bound (2-12 s at 5,000,000 objects), and cleanup
collected the whole heap once more than it needed before its search for who keeps the stored
exception. The heap pass now stops at its time and says how much it did not read; cleanup
collects once before that search. Measured: ``benchmarks/bench_heap.py``."""

from __future__ import annotations

import gc
import sys
from typing import Any

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
