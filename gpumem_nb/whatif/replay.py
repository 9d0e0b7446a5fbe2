"""Replaying one device's recorded history through the allocator model, once per setting.

``compile_trace`` reads the history once into plain tuples (shared by every setting):

- ``alloc``, ``free_requested``, ``free_completed`` drive the model. A free counts at
  ``free_requested`` (the tensor is gone) and the block goes back to its pool at
  ``free_completed``, which comes later for a block used on another stream (its event).
  Histories without any ``free_completed`` return blocks at the request.
- ``oom`` is the request that failed: replayed as an allocation given back at once (what the
  cell did after the error is unknown).
- ``segment_*`` entries say what the recorded allocator did. A run of frees that no
  ``cudaMalloc``/map follows is the user's ``empty_cache()``, replayed as one; all of them
  give the recorded reserved memory, to compare the model with.
- Anything malformed is skipped and counted by reason: an action that is not a name, an
  address or size that does not fit a ``size_t``; a time that is no finite number is dropped.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .allocator import DeviceCachingAllocator
from .allocstate import Limits
from .blocks import Block
from .config import AllocatorSettings
from .fields import SIZE_T_END, finite, plain, uint
from .plainloop import (
    ALLOC,
    EMPTY_CACHE,
    FREE,
    FREE_COMPLETED,
    FREE_REQUESTED,
    OOM,
    LoopState,
    run_expandable,
    run_plain,
)
from .progress import TICK
from .rules import kLargeBuffer

__all__ = [
    "MAX_POINTS",
    "MAX_TIME_US",
    "CompiledTrace",
    "Replayed",
    "compile_trace",
    "fold_address",
    "replay",
    "series",
]

_SEGMENT_GROW = {"segment_alloc": 1, "segment_map": 1}
_SEGMENT_SHRINK = {"segment_free": -1, "segment_unmap": -1}
_INTERNAL_AFTER = frozenset({"segment_alloc", "segment_map", "oom"})
_INFO = frozenset({"snapshot", "user_defined", "annotate"})
_MODEL = {"alloc": ALLOC, "free_requested": FREE_REQUESTED, "free_completed": FREE_COMPLETED,
          "oom": OOM}
MAX_POINTS = 2000  # per line of the chart

MAX_TIME_US = 1e17  # the year 5138: a later (or negative) time_us is no clock's


def fold_address(addr: int) -> int:
    """``addr`` with its high bits folded onto its low ones, as a dict key: one to one (the
    top 24 bits are kept, and each lower one is read back from those above it), and the low
    bits of addresses 2**24 apart (a history's, in a dict of a million) no longer all alike:
    a million such lookups took 0.5 s, now 0.13."""
    return addr ^ (addr >> 24)


@dataclass(frozen=True)
class CompiledTrace:
    # (code, slot, size, stream): each address the history names has a slot, numbered from
    # 0 in the order they first appear (``addresses[slot]``), so that the replay keeps its
    # live blocks in a list, not a dict keyed by address (an OOM's slot is -1).
    events: list[tuple[int, int, int, int]]
    times_us: list[float | None]  # when each event was recorded
    has_completions: bool
    recorded: list[tuple[int, int]]  # (event index, recorded reserved change so far)
    entries: int
    skipped: Mapping[str, int] = field(default_factory=dict)
    # Frees of an address the history had allocated and already freed: an entry repeated or
    # lost, not an allocation made before the history.
    double_frees: int = 0
    addresses: list[int] = field(default_factory=list, repr=False)  # slot -> address
    # fold_address(address) -> slot
    slots: Mapping[int, int] = field(default_factory=dict, repr=False)

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())


def compile_trace(entries: Sequence[Any], *, start_reserved_bytes: int | None = None,
                  recorded_limit_bytes: int | None = None,
                  progress: Callable[[int, int], None] | None = None) -> CompiledTrace:
    """``recorded_limit_bytes``: what the recorded process could reserve (its memory
    fraction's cap, or what the GPU had), with ``start_reserved_bytes`` what it held when
    the history began. A run of segment frees right before a ``cudaMalloc`` is the
    allocator making room only when that ``cudaMalloc`` would not have fitted: with room to
    spare it is the user's ``empty_cache()`` followed by a request the emptied cache could
    not serve (the H200's empty_cache session was over-predicted by 2-3 GiB)."""
    events: list[tuple[int, int, int, int]] = []
    times: list[float | None] = []
    recorded: list[tuple[int, int]] = []
    skipped: dict[str, int] = {}
    delta = 0
    completions = False
    n = len(entries)
    slots: dict[int, int] = {}
    addresses: list[int] = []
    # Per slot, the history's own allocation there: 1 live, 2 freed (to tell a double free).
    state = bytearray()
    doubles = 0

    def skip(why: str) -> None:
        skipped[why] = skipped.get(why, 0) + 1

    def action_at(j: int) -> str | None:
        e = entries[j]
        a = e.get("action") if isinstance(e, Mapping) else None
        return a if isinstance(a, str) else None

    # The loop below is the reading's hot path (1,000,000 entries at the bound): a plain
    # dict entry whose numbers are plain ints and time a plain float is read inline, with
    # the same answers as ``uint``/``finite``; anything else goes through them.
    append_event, append_time = events.append, times.append
    slot_of, new_address = slots.get, addresses.append
    model_code = _MODEL.get
    end_t = MAX_TIME_US
    i = 0
    look = TICK if progress is not None else n + 1
    while i < n:
        if i >= look:
            assert progress is not None
            progress(i, n)
            look = i + TICK
        e = entries[i]
        if type(e) is not dict and not isinstance(e, Mapping):
            skip("not a history entry")
            i += 1
            continue
        action = e.get("action")
        if type(action) is not str and not isinstance(action, str):
            skip("entries whose action is not a name")
            i += 1
            continue
        t = e.get("time_us")
        if type(t) is float:
            if not 0 <= t < end_t:  # NaN and the infinities too
                t = None
        else:
            t = finite(t)
            if t is not None and not 0 <= t < end_t:
                t = None  # no clock's: the event is replayed, its time unknown (as the trace's)
        code = model_code(action)
        if code is not None:
            addr = e.get("addr")
            if type(addr) is not int or not 0 <= addr < SIZE_T_END:
                addr = uint(addr)
            size = e.get("size")
            if type(size) is not int or not 0 <= size < SIZE_T_END:
                size = uint(size)
            if code == OOM and addr is None:
                addr = 0  # an OOM's "addr" is the driver's free memory, not an address
            stream = e.get("stream")
            if type(stream) is not int or not 0 <= stream < SIZE_T_END:
                stream = uint(stream)
            stream = stream or 0
            if addr is None or size is None or (code == ALLOC and size == 0):
                skip(f"{action} without a valid address and size")
                i += 1
                continue
            if code == OOM:
                append_event((code, -1, size, stream))
                append_time(t)
                i += 1
                continue
            folded = addr ^ (addr >> 24)  # fold_address, inline
            slot = slot_of(folded)
            if slot is None:
                slot = slots[folded] = len(addresses)
                new_address(addr)
                state.append(0)
            if code == ALLOC:
                state[slot] = 1
            else:
                if code == FREE_REQUESTED and i + 1 < n:
                    nxt = entries[i + 1]
                    if (type(nxt) is dict or isinstance(nxt, Mapping)) and \
                            nxt.get("action") == "free_completed" and nxt.get("addr") == addr:
                        code = FREE  # returned to its pool at once: one step, not two
                        i += 1
                if code in (FREE_COMPLETED, FREE):
                    completions = True
                if code in (FREE_REQUESTED, FREE):
                    if state[slot] == 1:
                        state[slot] = 2
                    elif state[slot] == 2:
                        doubles += 1
            append_event((code, slot, size, stream))
            append_time(t)
            i += 1
            continue
        if action in _SEGMENT_GROW or action in _SEGMENT_SHRINK:
            size = uint(e.get("size"))
            if size is None:
                skip(f"{action} without a valid size")
                i += 1
                continue
            if action in _SEGMENT_SHRINK:
                # Look past this run of frees: a cudaMalloc, a map or an OOM after it means
                # the allocator freed to make room; anything else, that the user emptied it.
                j = i
                while j < n and action_at(j) in _SEGMENT_SHRINK:
                    j += 1
                k = j
                while k < n and action_at(k) in _INFO:
                    k += 1
                if k >= n or action_at(k) not in _INTERNAL_AFTER or _room_to_spare(
                        entries[k], start_reserved_bytes, delta, recorded_limit_bytes):
                    events.append((EMPTY_CACHE, 0, 0, 0))
                    times.append(t)
                for m in range(i, j):
                    em = entries[m]
                    s = uint(em.get("size")) if isinstance(em, Mapping) else None
                    delta -= s or 0
                recorded.append((len(events), delta))
                i = j
                continue
            delta += size
            recorded.append((len(events), delta))
            i += 1
            continue
        if action not in _INFO:
            skip(f"unknown action {plain(action, 40)!r}")
        i += 1
    return CompiledTrace(events=events, times_us=times, has_completions=completions,
                         recorded=recorded, entries=n, skipped=skipped, double_frees=doubles,
                         addresses=addresses, slots=slots)


def _room_to_spare(nxt: Any, start: int | None, delta: int, limit: int | None) -> bool:
    """Whether the recorded process had room for the ``cudaMalloc`` after a run of frees
    without them (so the allocator had no reason to free)."""
    if start is None or limit is None or not isinstance(nxt, Mapping) or \
            nxt.get("action") not in _SEGMENT_GROW:
        return False
    size = uint(nxt.get("size"))
    return size is not None and start + delta + size <= limit


@dataclass(frozen=True)
class Replayed:
    """One setting's replay: what the model's allocator did."""

    peak_reserved_bytes: int
    end_reserved_bytes: int
    start_reserved_bytes: int
    peak_allocated_bytes: int
    inactive_split_bytes: int  # free bytes empty_cache could not give back, at the peak
    segment_allocs: int  # cudaMalloc calls (page maps under expandable segments)
    segment_frees: int  # cudaFree calls (page unmaps)
    num_alloc_retries: int
    oom: bool | None  # None: no capacity known to judge by
    oom_event: int | None  # the first event that would have failed
    oom_requested_bytes: int | None
    unmatched_frees: int  # frees of allocations the replay never saw made
    changes: list[tuple[int, int]] = field(repr=False)  # (event index, reserved)
    max_demand_bytes: int = 0  # the most a limit check asked for (DeviceCachingAllocator's)
    # An unlimited replay of ordinary segments: its limit checks' demands and retries, as
    # ``DeviceCachingAllocator.demand_records`` (what decides a capped replay without it).
    demand_records: list[int] | None = field(default=None, repr=False, compare=False)


def replay(trace: CompiledTrace, settings: AllocatorSettings, *, limits: Limits | None = None,
           start_segments: Sequence[Mapping[str, Any]] | None = None, device: int = 0,
           device_total_bytes: int | None = None, start_page_bytes: int = kLargeBuffer,
           stop_at_oom: bool = False,
           on_event: Callable[[int, DeviceCachingAllocator, Mapping[int, Block]], None]
           | None = None, progress: Callable[[int, int], None] | None = None) -> Replayed:
    """Run the model over ``trace``. ``on_event(i, model, live)`` is called after each event
    (the property tests check the model's invariants there). ``stop_at_oom``: stop at the
    first request that fails (the fit search needs only whether one does). ``progress(i,
    n)`` is called every ``progress.TICK`` events."""
    with _no_cycle_collection():
        return _replay(trace, settings, limits or Limits(), start_segments, device,
                       device_total_bytes, start_page_bytes, stop_at_oom, on_event, progress)


def _replay(trace: CompiledTrace, settings: AllocatorSettings, limits: Limits,
            start_segments: Sequence[Mapping[str, Any]] | None, device: int,
            device_total_bytes: int | None, start_page_bytes: int, stop_at_oom: bool,
            on_event: Callable[[int, DeviceCachingAllocator, Mapping[int, Block]], None] | None,
            progress: Callable[[int, int], None] | None) -> Replayed:
    model = DeviceCachingAllocator(settings, limits, device_total_bytes=device_total_bytes)
    start_live, start_waiting = model.load_segments(start_segments or (), device,
                                                    start_page_bytes)
    start_reserved = model.reserved
    if limits.allowed_bytes is None and limits.capacity_bytes is None and model._plain:
        model.demand_records = []
    deferred = trace.has_completions
    # The live blocks by slot; those of the start state whose address the history never
    # names stay in ``unnamed`` (only on_event sees them).
    slots = trace.slots
    live: list[Block | None] = [None] * len(trace.addresses)
    unnamed: dict[int, Block] = {}
    for ptr, b in start_live.items():
        k = slots.get(fold_address(ptr))
        if k is None:
            unnamed[ptr] = b
        else:
            live[k] = b
    pending: dict[int, Block] = {}  # slot -> freed block waiting on its event
    for ptr, b in start_waiting.items():
        k = slots.get(fold_address(ptr))
        if k is not None:
            pending[k] = b
    n_events = len(trace.events)
    view = _LiveView(live, trace.addresses, unnamed)
    loop = None if on_event is not None else run_plain if model._plain else \
        run_expandable if settings.expandable_segments and not model.gc_active else None
    if loop is not None:
        # No GC: an inline loop, in chunks between progress reports (after events 0, TICK,
        # 2 * TICK, ... as the per-event loop makes them).
        state = LoopState()
        events = trace.events
        i = 0
        while i < n_events:
            # Up to and with the next event whose index is a multiple of TICK.
            end = n_events if progress is None else \
                min(n_events, (i + TICK - 1) // TICK * TICK + 1)
            i = loop(model, events, i, end, live, pending, deferred, stop_at_oom, state)
            if progress is not None and not (i - 1) % TICK:
                progress(i - 1, n_events)
            if stop_at_oom and state.oom_event is not None:
                break
        oom_event, oom_size, unmatched = state.oom_event, state.oom_size, state.unmatched
    else:
        oom_event, oom_size, unmatched = _replay_events(
            trace, model, live, pending, deferred, view, on_event, stop_at_oom, progress)
    judged = limits.capacity_bytes is not None or limits.allowed_bytes is not None
    replayed = Replayed(
        peak_reserved_bytes=model.peak_reserved, end_reserved_bytes=model.reserved,
        start_reserved_bytes=start_reserved, peak_allocated_bytes=model.peak_allocated,
        inactive_split_bytes=model.inactive_split_at_peak,
        segment_allocs=model.num_device_alloc, segment_frees=model.num_device_free,
        num_alloc_retries=model.num_alloc_retries,
        oom=(oom_event is not None) if judged else None, oom_event=oom_event,
        oom_requested_bytes=oom_size, unmatched_frees=unmatched, changes=model.changes,
        max_demand_bytes=model.max_demand, demand_records=model.demand_records)
    # Its blocks go when this returns, by reference counting, before the cycle collector
    # runs again (see ``_no_cycle_collection``).
    model.dismantle(live, unnamed.values(), pending.values())
    return replayed


def _replay_events(trace: CompiledTrace, model: DeviceCachingAllocator,
                   live: list[Block | None], pending: dict[int, Block], deferred: bool,
                   view: _LiveView,
                   on_event: Callable[[int, DeviceCachingAllocator, Mapping[int, Block]], None]
                   | None, stop_at_oom: bool, progress: Callable[[int, int], None] | None,
                   ) -> tuple[int | None, int | None, int]:
    """Each event through the model's methods (expandable segments, GC, ``on_event``):
    (the first event that ran out, its request, the unmatched frees)."""
    malloc, free, free_now, complete = model.malloc, model.free, model.free_now, model.complete
    oom_event: int | None = None
    oom_size: int | None = None
    unmatched = 0
    watch = on_event is not None or stop_at_oom or progress is not None
    n_events = len(trace.events)
    for i, (code, slot, size, stream) in enumerate(trace.events):
        model.now = i
        if code == ALLOC:
            old = live[slot]
            if old is not None:  # a second alloc at a live address: an entry went missing
                free_now(old)
                unmatched += 1
            block, oom = malloc(size, stream)
            live[slot] = block
            if oom and oom_event is None:
                oom_event, oom_size = i, size
        elif code == FREE:
            old = live[slot]
            if old is not None:
                live[slot] = None
                free_now(old)
            else:
                unmatched += 1
        elif code == FREE_REQUESTED:
            old = live[slot]
            if old is None:
                unmatched += 1
            else:
                live[slot] = None
                if deferred:
                    pending[slot] = old
                    free(old, deferred=True)
                else:
                    free_now(old)
        elif code == FREE_COMPLETED:
            if slot in pending:
                complete(pending.pop(slot))
        elif code == OOM:
            block, oom = malloc(size, stream)
            free_now(block)
            if oom and oom_event is None:
                oom_event, oom_size = i, size
        else:
            model.empty_cache()
        if watch:
            if progress is not None and not i % TICK:
                progress(i, n_events)
            if on_event is not None:
                on_event(i, model, view)
            if stop_at_oom and oom_event is not None:
                break
    return oom_event, oom_size, unmatched


class _LiveView(Mapping[int, Block]):
    """The replay's live blocks by address, as ``on_event`` sees them."""

    def __init__(self, live: list[Block | None], addresses: list[int],
                 unnamed: dict[int, Block]) -> None:
        self._live, self._addresses, self._unnamed = live, addresses, unnamed

    def __getitem__(self, addr: int) -> Block:
        for k, a in enumerate(self._addresses):
            b = self._live[k]
            if a == addr and b is not None:
                return b
        return self._unnamed[addr]

    def __iter__(self) -> Iterator[int]:
        yield from (a for a, b in zip(self._addresses, self._live, strict=True)
                    if b is not None)
        yield from self._unnamed

    def __len__(self) -> int:
        return sum(b is not None for b in self._live) + len(self._unnamed)


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """The replay makes and drops blocks by the million, each linked to its neighbours:
    the cycle collector, run every 700 of them over every object alive (a snapshot's million
    entries too), took a quarter of a replay's time and frees nothing the replay has not
    let go. It runs again after, as it was, once the replay's blocks are gone: unlinked
    (``DeviceCachingAllocator.dismantle``), they are freed by reference counting, where as
    cycles they left the collector 0.5 s of work after each million-entry replay."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def series(changes: Sequence[tuple[int, int]], n_events: int, start_bytes: int,
           max_points: int = MAX_POINTS) -> list[tuple[int, int]]:
    """(event index, reserved) at most ``max_points`` long, keeping each bucket's highest
    value so that no peak is lost."""
    pts = [(0, start_bytes), *changes]
    if n_events:
        pts.append((n_events - 1, pts[-1][1]))
    if len(pts) <= max_points:
        return pts
    width = max(1, -(-n_events // (max_points // 2)))
    out: list[tuple[int, int]] = []
    bucket = -1
    for i, v in pts:
        b = i // width
        if b != bucket:
            out.append((i, v))
            bucket = b
        elif v > out[-1][1]:
            out[-1] = (out[-1][0], v)
    out.append(pts[-1])
    return out
