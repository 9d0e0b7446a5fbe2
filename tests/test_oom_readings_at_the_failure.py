"""The allocator's segments are read at the failure, before anything the observer runs can
let Python's collector free reference cycles' tensors. KINDS9's unstarted_thread_target_cycle
_in_loop (native allocator, H100): the scan ran a collection that turned 63 GiB of garbage
into idle cached segments, the snapshot after it read them as cache the request could have
used, and the verdict was "memory pool" (another pool's cache) instead of garbage."""

from __future__ import annotations

import gc
import types
from typing import Any

from gpumem_nb.model import DeviceSample, Holder, Sample
from gpumem_nb.oom.causes import CAUSE_PRIVATE_POOL
from gpumem_nb.oom.watch import OomWatch

from .fakes import GiB
from .test_oom_rawblocks import BASE, RawTorch

MESSAGE = ("CUDA out of memory. Tried to allocate 6.00 GiB. GPU 0 has a total capacity of "
           "80.00 GiB of which 2.00 GiB is free.")


def _live_segment() -> dict[str, Any]:
    # A 70 GiB segment wholly allocated: the session's tensors and the cycles' ones.
    return {"device": 0, "address": BASE, "total_size": 70 * GiB, "allocated_size": 70 * GiB,
            "blocks": [{"size": 70 * GiB, "state": "active_allocated"}]}


def _freed_by_a_collection() -> dict[str, Any]:
    # What a collection leaves: a segment of the cycles' tensors, now holding none.
    return {"device": 0, "address": BASE + 70 * GiB, "total_size": 8 * GiB,
            "allocated_size": 0, "blocks": [{"size": 8 * GiB, "state": "inactive"}]}


def _observe(collect_during: str) -> tuple[OomWatch, list[bool]]:
    torch = RawTorch([_live_segment()], 70 * GiB, {})
    collector_on: list[bool] = []

    def collection() -> None:
        torch.segments = [_live_segment(), _freed_by_a_collection()]

    def scan(**kw: Any) -> list[Holder]:
        if collect_during == "scan":
            collection()
        return []

    read = torch.read

    def reading(device: int) -> Any:
        collector_on.append(gc.isenabled())
        return read(device)

    torch.read = reading  # type: ignore[method-assign]
    host = types.SimpleNamespace(shell=types.SimpleNamespace(user_ns={}),
                                 source=types.SimpleNamespace(), scan=scan,
                                 cleanup=lambda request: None,
                                 read=lambda: Sample(0.0, 0.0, None, (DeviceSample(
                                     0, None, torch.read(0)),)))
    watch = OomWatch(host, torch=torch)  # type: ignore[arg-type]
    watch._on_oom(0, 6 * GiB, 80 * GiB, 2 * GiB)
    return watch, collector_on


def test_segments_a_collection_in_the_scan_empties_are_not_read_as_cache_at_the_failure():
    watch, _ = _observe(collect_during="scan")
    try:
        (event,) = watch.events
        assert event.idle_segments_bytes == 0
        assert event.largest_free_block_bytes is None
        e = watch.explain(RuntimeError(MESSAGE), generation=0)
        assert all(c.kind != CAUSE_PRIVATE_POOL for c in e.causes), e.causes
    finally:
        watch.close()


def test_the_collector_is_held_off_while_the_failure_is_read_and_given_back_as_it_was():
    was = gc.isenabled()
    watch, collector_on = _observe(collect_during="nothing")
    try:
        assert collector_on and collector_on[0] is False
        assert gc.isenabled() is was
        gc.disable()
        try:
            watch._on_oom(0, 6 * GiB, 80 * GiB, 2 * GiB)
            assert gc.isenabled() is False  # a user who turned it off keeps it off
        finally:
            if was:
                gc.enable()
    finally:
        watch.close()


def test_two_failures_read_at_once_leave_the_collector_off_until_the_last_is_done():
    import threading

    from gpumem_nb.oom.gcwindow import collector_held

    was = gc.isenabled()
    gc.enable()
    first_in, second_done, release_first = (threading.Event() for _ in range(3))
    seen: list[bool] = []

    def first() -> None:
        with collector_held():
            first_in.set()
            release_first.wait(5)
            seen.append(gc.isenabled())

    t = threading.Thread(target=first)
    try:
        t.start()
        assert first_in.wait(5)
        with collector_held():
            pass
        second_done.set()
        assert gc.isenabled() is False  # the first is still reading
        release_first.set()
        t.join(5)
        assert seen == [False] and gc.isenabled() is True
    finally:
        release_first.set()
        t.join(5)
        if not was:
            gc.disable()
