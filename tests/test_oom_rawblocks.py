"""Raw pointers from ``torch.cuda.caching_allocator_alloc`` kept as ints in a helper module
(KINDS8 kernel_workspaces_raw_allocator_pointers: 99.9% "not found" at the OOM, nothing to
do): the explanation and `who --gc` read the blocks no tensor lies over from the segments
after the failure, name the module's pointer path with its caching_allocator_delete line, and
say blocks with no pointer found as uncovered, never as raw allocations."""

from __future__ import annotations

import types
from typing import Any

from gpumem_nb.model import AllocatorReading, DeviceSample, Holder, Sample
from gpumem_nb.oom.advice import OomExplanation
from gpumem_nb.oom.watch import OomWatch

from .fakes import GiB

BASE = 0x7F00_0000_0000
MESSAGE = ("CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of "
           "80.00 GiB of which 0 bytes is free.")


def _segments(raw: list[int]) -> list[dict[str, Any]]:
    """The weights' 1 GiB block at BASE, then one block per size in ``raw``."""
    blocks = [{"size": GiB, "state": "active_allocated"}]
    blocks += [{"size": n, "state": "active_allocated"} for n in raw]
    return [{"device": 0, "address": BASE, "total_size": GiB + sum(raw),
             "allocated_size": GiB + sum(raw), "blocks": blocks}]


class RawTorch:
    """torch as the explainer reads it: a native allocator with these segments."""

    def __init__(self, segments: list[dict[str, Any]], allocated: int,
                 modules: dict[str, Any], backend: str = "native") -> None:
        self.segments = segments
        self.allocated = allocated
        self.modules = modules
        self.backend = backend
        self.initialized = True
        self.calls: list[str] = []

    def read(self, device: int) -> AllocatorReading:
        return AllocatorReading(allocated_bytes=self.allocated, reserved_bytes=self.allocated,
                                peak_allocated_bytes=self.allocated,
                                peak_reserved_bytes=self.allocated, active_bytes=self.allocated,
                                inactive_split_bytes=0, num_alloc_retries=0, num_ooms=1)

    def grad_enabled(self) -> bool:
        return False

    def history_enabled(self) -> bool:
        return False

    def allocator_backend(self) -> str:
        return self.backend

    def device_total_bytes(self, device: int) -> int:
        return 80 * GiB

    def memory_fraction(self, device: int) -> None:
        return None

    def memory_snapshot(self) -> tuple[dict[str, Any] | None, str]:
        if self.backend == "cudaMallocAsync":
            return None, "not meaningful"
        return {"segments": self.segments}, ""

    def segments_snapshot(self) -> tuple[list[dict[str, Any]] | None, str]:
        # Answered under any backend: the explainer must not ask under cudaMallocAsync.
        self.calls.append("segments_snapshot")
        return self.segments, ""


def _explain(ns: dict[str, Any], raw: list[int], modules: dict[str, Any],
             backend: str = "native") -> tuple[OomExplanation, RawTorch]:
    weights = Holder(name="weights", kind="variable", device="cuda:0", nbytes=GiB,
                     storages=((BASE, GiB),))
    torch = RawTorch(_segments(raw), GiB + sum(raw), modules, backend)
    host = types.SimpleNamespace(shell=types.SimpleNamespace(user_ns=ns),
                                 source=types.SimpleNamespace(),
                                 scan=lambda **kw: [weights],
                                 cleanup=lambda request: None,
                                 read=lambda: Sample(0.0, 0.0, None, (DeviceSample(
                                     0, None, torch.read(0)),)))
    watch = OomWatch(host, torch=torch)  # type: ignore[arg-type]
    try:
        if backend != "cudaMallocAsync":
            watch._on_oom(0, 4 * GiB, 80 * GiB, 0)
        return watch.explain(RuntimeError(MESSAGE), generation=0), torch
    finally:
        watch.close()  # nothing of the watch's may stay in gc.callbacks for the next test


def _kernels(**workspaces: int) -> types.ModuleType:
    mod = types.ModuleType("gm_raw_kernels")
    mod._WORKSPACES = dict(workspaces)  # type: ignore[attr-defined]
    return mod


def test_the_explanation_names_the_modules_pointer_and_advises_freeing_that_block():
    mod = _kernels(attn0=BASE + GiB)
    e, _ = _explain({"kernels": mod}, [20 * GiB], {"gm_raw_kernels": mod})
    assert e.ledger is not None
    assert e.ledger.raw_bytes == 20 * GiB and not e.ledger.shows_not_found
    assert "kernels._WORKSPACES" in e.ledger.line()
    assert "1 allocated block with no tensor over them" in e.ledger.line()
    code = "torch.cuda.caching_allocator_delete(kernels._WORKSPACES['attn0'])"
    (act,) = [a for a in e.actions if "caching_allocator_delete" in a.code]
    assert act.code == code and act.nbytes == 20 * GiB
    assert "the allocator's block sizes" in act.text
    assert "reachable from nothing" not in str(e)
    compile(act.code, "<test>", "exec")


def test_many_blocks_behind_one_dict_are_freed_by_one_loop_line_that_pops_exactly_them():
    mod = _kernels(attn0=BASE + GiB, attn1=BASE + 9 * GiB, attn2=BASE + 17 * GiB)
    e, _ = _explain({"kernels": mod}, [8 * GiB] * 3, {"gm_raw_kernels": mod})
    (act,) = [a for a in e.actions if "caching_allocator_delete" in a.code]
    assert act.code.startswith("for k in (")
    assert "torch.cuda.caching_allocator_delete(kernels._WORKSPACES.pop(k))" in act.code
    assert act.nbytes == 24 * GiB
    # Run against stand-ins: it frees each named block once and leaves no address behind.
    freed: list[int] = []
    cuda = types.SimpleNamespace(caching_allocator_delete=freed.append)
    exec(act.code, {"torch": types.SimpleNamespace(cuda=cuda), "kernels": mod})
    assert sorted(freed) == [BASE + GiB, BASE + 9 * GiB, BASE + 17 * GiB]
    assert mod._WORKSPACES == {}  # type: ignore[attr-defined]


def test_a_block_with_no_pointer_found_is_said_uncovered_without_advice_or_a_raw_claim():
    mod = _kernels()  # the pointer is kept where no one can see it (C++)
    e, _ = _explain({"kernels": mod}, [20 * GiB], {"gm_raw_kernels": mod})
    assert e.ledger is not None
    assert e.ledger.raw_bytes == 0 and e.ledger.shows_not_found
    assert e.ledger.uncovered_bytes == 20 * GiB
    line = e.ledger.line()
    assert f"{BASE + GiB:#x}: 20.00 GiB" in line
    assert "no tensor the search found lies over" in line
    assert not any("caching_allocator_delete" in a.code for a in e.actions)
    assert "raw allocation" not in str(e)


def test_under_cudamallocasync_there_are_no_segments_and_nothing_new_is_said():
    mod = _kernels(attn0=BASE + GiB)
    e, torch = _explain({"kernels": mod}, [20 * GiB], {"gm_raw_kernels": mod},
                        backend="cudaMallocAsync")
    assert "segments_snapshot" not in torch.calls
    assert e.facts.raw_blocks == ()
    assert "raw_blocks" not in e.stage_s
    assert not any("caching_allocator_delete" in a.code for a in e.actions)


def test_nothing_is_read_when_the_holders_explain_the_allocated_bytes():
    e, torch = _explain({}, [], {})
    assert "raw_blocks" not in e.stage_s and e.facts.raw_blocks == ()
    assert "segments_snapshot" not in torch.calls


def test_who_gc_shows_the_same_part_from_the_segments():
    from gpumem_nb.ledger import ledger
    from gpumem_nb.oom.rawpart import ledgers_with_raw_blocks

    mod = _kernels(attn0=BASE + GiB)
    weights = Holder(name="weights", kind="variable", device="cuda:0", nbytes=GiB,
                     storages=((BASE, GiB),))
    led = ledger("cuda:0", 21 * GiB, [weights])
    (out,) = ledgers_with_raw_blocks([led], _segments([20 * GiB]), [weights],
                                     {"kernels": mod}, {"gm_raw_kernels": mod})
    assert out.raw_bytes == 20 * GiB and out.not_found_bytes == 0
    assert "kernels._WORKSPACES" in out.line()
