"""The replay's hot loop for a model of ordinary segments without GC (the model's
``_plain`` paths): ``malloc``, ``free`` and a new segment's ``alloc_block`` inline, its
counters in local variables, the sizing and the pool of each (size, stream) looked up once.

A million-entry history made 2.5 million method calls and as many attribute reads of the
model's counters per replay: 2.2 s of CPU for the review's history, over the 2 s bound.
Everything else (a limit check that fails, a free that waits on an event, an OOM entry,
``empty_cache``, a second allocation at a live address) goes through the model's own
methods, the counters written back first and read again after. The steps are the model's,
in its order: ``tests/test_whatif_frozen.py`` holds every field of every replay to the
model as it was before this loop, and ``tests/test_whatif_plainloop.py`` to the per-event
method calls (what ``on_event`` replays take).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence

from .allocator import _KEY_SHIFT, _LOAD, _VA_ALIGN, Block, DeviceCachingAllocator
from .rules import get_allocation_size, kMinBlockSize, kSmallSize, round_size

ALLOC, FREE_REQUESTED, FREE = 0, 1, 5  # replay.py's codes
_NEVER = 1 << 128  # a split threshold no remainder reaches


class LoopState:
    """What the loop carries from one call to the next (it runs in chunks between progress
    reports)."""

    __slots__ = ("oom_event", "oom_size", "unmatched")

    def __init__(self) -> None:
        self.oom_event: int | None = None
        self.oom_size: int | None = None
        self.unmatched = 0


def run_plain(model: DeviceCachingAllocator, events: Sequence[tuple[int, int, int, int]],
              first: int, stop: int, live: list[Block | None], pending: dict[int, Block],
              deferred: bool, stop_at_oom: bool, state: LoopState) -> int:
    """Replay ``events[first:stop]`` on ``model`` (``model._plain``), as ``replay``'s
    per-event loop does. Returns the index after the last event replayed: ``stop``, or one
    past the first OOM under ``stop_at_oom``."""
    assert model._plain
    mss = model.max_split
    mnsr = model.s.max_non_split_rounding_size
    allowed, capacity = model.allowed, model.capacity
    unlimited = allowed is None and capacity is None
    records = model.demand_records
    changes_append = model.changes.append
    # (size, stream) -> the request's rounded size, pool, and what decides a found block's
    # use and split (malloc's conditions, precomputed).
    requests: dict[int | tuple[int, int], tuple] = {}
    allocated = model.allocated
    peak_allocated = model.peak_allocated
    inactive_split = model.inactive_split
    i = first
    while i < stop:
        code, slot, size, stream = events[i]
        if code == ALLOC and live[slot] is None:
            req = requests.get(size if not stream else (size, stream))
            if req is None:
                sizing = model._sizing.get(size)
                if sizing is None:  # malloc's sizing, into the model's cache as it fills it
                    model._sizing[size] = sizing = _sizing(model, size)
                rsize, small, alloc_size = sizing
                pool = model._pools_by_stream[small].get(stream)
                if pool is None:
                    pool = model._pool(small, stream)
                under = rsize < mss
                req = (rsize, small, alloc_size, pool, pool.sorted, pool.sorted._maxes,
                       pool.sorted._lists, pool.blocks, rsize << _KEY_SHIFT,
                       mss if under else rsize + mnsr,
                       kMinBlockSize if small else (kSmallSize + 1 if under else _NEVER))
                requests[size if not stream else (size, stream)] = req
            (rsize, small, alloc_size, pool, srt, maxes, lists, blocks, search, limit,
             split_at) = req
            # get_free_block: the smallest free block of at least rsize bytes.
            c = bisect_left(maxes, search)
            if c < len(maxes):
                keys = lists[c]
                j = bisect_left(keys, search)
                key = keys[j]
                b = blocks[key]
                bsize = b.size
                if bsize < limit:
                    remaining = bsize - rsize
                    if remaining >= split_at:
                        # The found block stays free as the remainder, at its new address
                        # and key; a new block is handed out below it.
                        ptr = b.ptr
                        block = Block(rsize, ptr, pool)
                        prev = b.prev
                        block.prev = prev
                        if prev is not None:
                            prev.next = block
                        block.next = b
                        b.prev = block
                        b.ptr = ptr + rsize
                        b.size = remaining
                        new_key = (remaining << _KEY_SHIFT) | (ptr + rsize)
                        # The smaller key takes the old one's place when it sorts there.
                        if (j > 0 and keys[j - 1] < new_key) or \
                                (j == 0 and (c == 0 or maxes[c - 1] < new_key)):
                            keys[j] = new_key
                            if j == len(keys) - 1:
                                maxes[c] = new_key
                        else:
                            srt.remove_at(c, j)
                            srt.add(new_key)
                        del blocks[key]
                        blocks[new_key] = b
                        b.key = new_key
                        inactive_split += remaining - b.nonrel
                        b.nonrel = remaining
                    else:
                        del keys[j]  # SortedKeys.remove_at, inline
                        if not keys:
                            del lists[c]
                            del maxes[c]
                        elif j == len(keys):
                            maxes[c] = keys[-1]
                        del blocks[key]
                        inactive_split -= b.nonrel
                        block = b
                    block.allocated = True
                    allocated += block.size
                    if allocated > peak_allocated:
                        peak_allocated = allocated
                    live[slot] = block
                    i += 1
                    continue
            if unlimited:
                # alloc_block: a new segment (no limit to check), then alloc_found_block.
                reserved = model.reserved + alloc_size
                if reserved > model.max_demand:
                    model.max_demand = reserved
                    if records is not None:
                        records.append(reserved)
                        records.append(-1 if model.pending else
                                       allocated + inactive_split + alloc_size)
                va = model._va_down - alloc_size
                if va >= 0:  # _new_va, inline for its usual case
                    ptr = va // _VA_ALIGN * _VA_ALIGN
                    model._va_down = ptr
                else:
                    ptr = model._new_va(alloc_size)
                model.num_device_alloc += 1
                model.reserved = reserved
                new_peak = reserved > model.peak_reserved
                if new_peak:
                    model.peak_reserved = reserved
                changes_append((i, reserved))
                if alloc_size - rsize >= split_at:
                    rest = Block(alloc_size - rsize, ptr + rsize, pool)
                    block = Block(rsize, ptr, pool)
                    block.next = rest
                    rest.prev = block
                    # insert_into_blocks(rest): split, so all of it is inactive_split's.
                    rest.key = key = ((alloc_size - rsize) << _KEY_SHIFT) | (ptr + rsize)
                    c = bisect_left(maxes, key)  # SortedKeys.add, inline for the usual case
                    if c < len(maxes) and len(lists[c]) < 2 * _LOAD:
                        insort(lists[c], key)
                    else:
                        srt.add(key)
                    blocks[key] = rest
                    rest.nonrel = alloc_size - rsize
                    inactive_split += alloc_size - rsize
                else:
                    block = Block(alloc_size, ptr, pool)
                block.allocated = True
                allocated += block.size
                if allocated > peak_allocated:
                    peak_allocated = allocated
                if new_peak:
                    model.inactive_split_at_peak = inactive_split
                live[slot] = block
                i += 1
                continue
        elif code == FREE or (code == FREE_REQUESTED and not deferred):
            held = live[slot]
            if held is not None:
                block = held
                live[slot] = None
                # free_now and _free_plain, inline: merged with its free neighbours, then
                # back in its pool.
                block.allocated = False
                allocated -= block.size
                pool = block.pool
                srt = pool.sorted
                blocks = pool.blocks
                maxes, lists = srt._maxes, srt._lists
                prev, nxt = block.prev, block.next
                if prev is not None and not prev.allocated and not prev.pending:
                    key = prev.key  # SortedKeys.remove, inline
                    c = bisect_left(maxes, key)
                    lst = lists[c]
                    j = bisect_left(lst, key)
                    del lst[j]
                    if not lst:
                        del lists[c]
                        del maxes[c]
                    elif j == len(lst):
                        maxes[c] = lst[-1]
                    del blocks[key]
                    inactive_split -= prev.nonrel
                    block.ptr = prev.ptr
                    block.prev = pp = prev.prev
                    if pp is not None:
                        pp.next = block
                    block.size += prev.size
                if nxt is not None and not nxt.allocated and not nxt.pending:
                    key = nxt.key
                    c = bisect_left(maxes, key)
                    lst = lists[c]
                    j = bisect_left(lst, key)
                    del lst[j]
                    if not lst:
                        del lists[c]
                        del maxes[c]
                    elif j == len(lst):
                        maxes[c] = lst[-1]
                    del blocks[key]
                    inactive_split -= nxt.nonrel
                    block.next = nn = nxt.next
                    if nn is not None:
                        nn.prev = block
                    block.size += nxt.size
                block.key = key = (block.size << _KEY_SHIFT) | block.ptr
                c = bisect_left(maxes, key)
                if c < len(maxes) and len(lists[c]) < 2 * _LOAD:
                    insort(lists[c], key)
                else:
                    srt.add(key)
                blocks[key] = block
                # gc_base stays 0: without GC, get_free_block counts no calls.
                nonrel = block.size if (block.prev is not None or block.next is not None) \
                    else 0
                block.nonrel = nonrel
                inactive_split += nonrel
            else:
                state.unmatched += 1
            i += 1
            continue
        # Anything else takes the model's own methods, its counters written back first.
        model.allocated, model.inactive_split = allocated, inactive_split
        model.peak_allocated = peak_allocated
        model.now = i
        oom_at = _general_step(model, code, slot, size, stream, live, pending, deferred,
                               state)
        allocated, inactive_split = model.allocated, model.inactive_split
        peak_allocated = model.peak_allocated
        i += 1
        if oom_at and state.oom_event is None:
            state.oom_event, state.oom_size = i - 1, size
            if stop_at_oom:
                break
    model.allocated, model.inactive_split = allocated, inactive_split
    model.peak_allocated = peak_allocated
    return i


def _sizing(model: DeviceCachingAllocator, size: int) -> tuple[int, bool, int]:
    s = model.s
    rounded = round_size(size, s.roundup_power2_divisions)
    return rounded, rounded <= kSmallSize, get_allocation_size(rounded, s.large_segment_size)


def _general_step(model: DeviceCachingAllocator, code: int, slot: int, size: int,
                  stream: int, live: list[Block | None], pending: dict[int, Block],
                  deferred: bool, state: LoopState) -> bool:
    """One event through the model's methods, as ``replay``'s per-event loop takes it;
    whether it was a request that ran out."""
    from .replay import FREE_COMPLETED, OOM

    if code == ALLOC:
        old = live[slot]
        if old is not None:  # a second alloc at a live address: an entry went missing
            model.free_now(old)
            state.unmatched += 1
        block, oom = model.malloc(size, stream)
        live[slot] = block
        return oom
    if code == FREE_REQUESTED:  # deferred
        old = live[slot]
        if old is None:
            state.unmatched += 1
        else:
            live[slot] = None
            pending[slot] = old
            model.free(old, deferred=True)
        return False
    if code == FREE_COMPLETED:
        if slot in pending:
            model.complete(pending.pop(slot))
        return False
    if code == OOM:
        block, oom = model.malloc(size, stream)
        model.free_now(block)
        return oom
    model.empty_cache()
    return False
