"""The replay's hot loops, for a model without GC: of ordinary segments (the model's
``_plain`` paths: ``malloc``, ``free`` and a new segment's ``alloc_block`` inline), and under
expandable segments (a request a free block serves, and a free, inline); the counters in
local variables, the sizing and the pool of each (size, stream) looked up once.

A million-entry history made 2.5 million method calls and as many attribute reads of the
model's counters per replay: 2.2 s of CPU for the review's history, over the 2 s bound.
Everything else (a limit check that fails, a free that waits on an event, an OOM entry,
``empty_cache``, a second allocation at a live address) goes through the model's own
methods, the counters written back first and read again after. The steps are the model's,
in its order: ``tests/test_whatif_frozen.py`` holds every field of every replay to the
model as it was before these loops, and to the per-event method calls (what ``on_event``
replays take).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from itertools import islice

from .allocator import DeviceCachingAllocator
from .allocstate import _VA_ALIGN
from .blocks import _KEY_SHIFT, _LOAD, Block
from .rules import get_allocation_size, kMinBlockSize, kSmallSize, round_size

__all__ = ["LoopState", "run_expandable", "run_plain"]

# The compiled history's event codes (``replay.compile_trace`` writes them; replay imports
# them from here, the lower of the two modules).
ALLOC, FREE_REQUESTED, FREE_COMPLETED, OOM, EMPTY_CACHE, FREE = range(6)
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
    full = 2 * _LOAD  # a chunk that takes no more keys without being split
    allocated = model.allocated
    peak_allocated = model.peak_allocated
    inactive_split = model.inactive_split
    for i, (code, slot, size, stream) in enumerate(islice(events, first, stop), first):
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
                       kMinBlockSize if small else (kSmallSize + 1 if under else _NEVER),
                       pool.releasable)
                requests[size if not stream else (size, stream)] = req
            (rsize, small, alloc_size, pool, srt, maxes, lists, blocks, search, limit,
             split_at, releasable) = req
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
                            del keys[j]  # SortedKeys.remove_at and add, inline
                            if not keys:
                                del lists[c]
                                del maxes[c]
                            elif j == len(keys):
                                maxes[c] = keys[-1]
                            c = bisect_left(maxes, new_key)
                            if c < len(maxes):
                                if len(lists[c]) < full:
                                    insort(lists[c], new_key)
                                else:
                                    srt.add(new_key)
                            elif not maxes:
                                lists.append([new_key])
                                maxes.append(new_key)
                            elif len(lists[-1]) < full:
                                lists[-1].append(new_key)
                                maxes[-1] = new_key
                            else:
                                srt.add(new_key)
                        del blocks[key]
                        blocks[new_key] = b
                        b.key = new_key
                        nonrel = b.nonrel
                        if not nonrel:  # it was a whole segment: split now
                            releasable.discard(key)
                        inactive_split += remaining - nonrel
                        b.nonrel = remaining
                    else:
                        del keys[j]  # SortedKeys.remove_at, inline
                        if not keys:
                            del lists[c]
                            del maxes[c]
                        elif j == len(keys):
                            maxes[c] = keys[-1]
                        del blocks[key]
                        nonrel = b.nonrel
                        if not nonrel:
                            releasable.discard(key)
                        inactive_split -= nonrel
                        block = b
                    block.allocated = True
                    allocated += block.size
                    if allocated > peak_allocated:
                        peak_allocated = allocated
                    live[slot] = block
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
                    c = bisect_left(maxes, key)  # SortedKeys.add, inline but for a split
                    if c < len(maxes):
                        if len(lists[c]) < full:
                            insort(lists[c], key)
                        else:
                            srt.add(key)
                    elif not maxes:
                        lists.append([key])
                        maxes.append(key)
                    elif len(lists[-1]) < full:
                        lists[-1].append(key)
                        maxes[-1] = key
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
                continue
        elif code == FREE or (code == FREE_REQUESTED and not deferred):
            held = live[slot]
            if held is not None:
                block = held
                live[slot] = None
                # free_now and _free_plain, inline: merged with its free neighbours, then
                # back in its pool.
                block.allocated = False
                bsize = block.size
                allocated -= bsize
                ptr = block.ptr
                srt, blocks, maxes, lists, releasable = block.pool.parts
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
                    block.ptr = ptr = prev.ptr
                    block.prev = pp = prev.prev
                    if pp is not None:
                        pp.next = block
                    bsize += prev.size
                    prev = pp
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
                    bsize += nxt.size
                    nxt = nn
                block.size = bsize
                block.key = key = (bsize << _KEY_SHIFT) | ptr
                c = bisect_left(maxes, key)  # SortedKeys.add, inline but for a split
                if c < len(maxes):
                    if len(lists[c]) < full:
                        insort(lists[c], key)
                    else:
                        srt.add(key)
                elif not maxes:
                    lists.append([key])
                    maxes.append(key)
                elif len(lists[-1]) < full:
                    lists[-1].append(key)
                    maxes[-1] = key
                else:
                    srt.add(key)
                blocks[key] = block
                # gc_base stays 0: without GC, get_free_block counts no calls.
                # Its neighbours, split, were not releasable; it is when it is whole now.
                if prev is not None or nxt is not None:
                    block.nonrel = bsize
                    inactive_split += bsize
                else:
                    block.nonrel = 0
                    releasable.add(key)
            else:
                state.unmatched += 1
            continue
        # Anything else takes the model's own methods, its counters written back first.
        model.allocated, model.inactive_split = allocated, inactive_split
        model.peak_allocated = peak_allocated
        model.now = i
        oom_at = _general_step(model, code, slot, size, stream, live, pending, deferred,
                               state)
        allocated, inactive_split = model.allocated, model.inactive_split
        peak_allocated = model.peak_allocated
        if oom_at and state.oom_event is None:
            state.oom_event, state.oom_size = i, size
            if stop_at_oom:
                return i + 1  # the model's counters are the loop's
    model.allocated, model.inactive_split = allocated, inactive_split
    model.peak_allocated = peak_allocated
    return stop


def _sizing(model: DeviceCachingAllocator, size: int) -> tuple[int, bool, int]:
    s = model.s
    rounded = round_size(size, s.roundup_power2_divisions)
    return rounded, rounded <= kSmallSize, get_allocation_size(rounded, s.large_segment_size)


def _general_step(model: DeviceCachingAllocator, code: int, slot: int, size: int,
                  stream: int, live: list[Block | None], pending: dict[int, Block],
                  deferred: bool, state: LoopState) -> bool:
    """One event through the model's methods, as ``replay``'s per-event loop takes it;
    whether it was a request that ran out."""
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


def run_expandable(model: DeviceCachingAllocator,
                   events: Sequence[tuple[int, int, int, int]], first: int, stop: int,
                   live: list[Block | None], pending: dict[int, Block], deferred: bool,
                   stop_at_oom: bool, state: LoopState) -> int:
    """``run_plain`` for a model under ``expandable_segments`` without GC: a request a free
    block serves (``get_free_block``'s best fit by the size a block can grow to, then
    ``alloc_found_block``) and a free (``free_block``) inline; mapping pages and everything
    else through the model's methods."""
    assert model.s.expandable_segments and not model.gc_active
    mss = model.max_split
    mnsr = model.s.max_non_split_rounding_size
    requests: dict[int | tuple[int, int], tuple] = {}
    allocated = model.allocated
    peak_allocated = model.peak_allocated
    inactive_split = model.inactive_split
    for i, (code, slot, size, stream) in enumerate(islice(events, first, stop), first):
        if code == ALLOC and live[slot] is None:
            req = requests.get(size if not stream else (size, stream))
            if req is None:
                sizing = model._sizing.get(size)
                if sizing is None:
                    model._sizing[size] = sizing = _sizing(model, size)
                rsize, small, _alloc_size = sizing
                pool = model._pools_by_stream[small].get(stream)
                if pool is None:
                    pool = model._pool(small, stream)
                req = (rsize, pool, pool.sorted, pool.sorted._maxes, pool.sorted._lists,
                       pool.blocks, rsize << _KEY_SHIFT, pool.releasable)
                requests[size if not stream else (size, stream)] = req
            rsize, pool, srt, maxes, lists, blocks, search, releasable = req
            c = bisect_left(maxes, search)
            if c < len(maxes):
                keys = lists[c]
                j = bisect_left(keys, search)
                b = blocks[keys[j]]
                if b.es is not None:
                    # The best fit by the size a block can grow to: an expandable block
                    # followed by unmapped pages counts those pages too.
                    nx = b.next
                    grows = b.size + (nx.size if nx is not None and not nx.mapped else 0)
                    k, m = c, j
                    while True:
                        m += 1
                        if m == len(lists[k]):
                            k, m = k + 1, 0
                            if k == len(lists):
                                break
                        nb = blocks[lists[k][m]]
                        nx = nb.next
                        nb_grows = nb.size + (nx.size if nx is not None and not nx.mapped
                                              else 0)
                        if nb_grows >= grows:
                            break
                        b, c, j, grows = nb, k, m, nb_grows
                        if b.es is None:
                            break
                    keys = lists[c]
                bsize = b.size
                if not ((rsize < mss and bsize >= mss) or
                        (rsize >= mss and bsize >= rsize + mnsr)):
                    del keys[j]  # SortedKeys.remove_at, inline
                    if not keys:
                        del lists[c]
                        del maxes[c]
                    elif j == len(keys):
                        maxes[c] = keys[-1]
                    del blocks[b.key]
                    if b.nonrel < bsize:
                        releasable.discard(b.key)
                    inactive_split -= b.nonrel
                    if bsize - rsize >= kMinBlockSize:
                        # alloc_found_block's split: the found block stays free as the
                        # remainder (insert_into_blocks), a new one is handed out below it.
                        rest = b
                        es = rest.es
                        ptr = rest.ptr
                        block = Block(rsize, ptr, rest.pool, es)
                        prev = rest.prev
                        block.prev = prev
                        if prev is not None:
                            prev.next = block
                        block.next = rest
                        rest.prev = block
                        rest.ptr = ptr = ptr + rsize
                        rest.size = rest_size = bsize - rsize
                        rest.key = key = (rest_size << _KEY_SHIFT) | ptr
                        c = bisect_left(maxes, key)  # SortedKeys.add, inline but for a split
                        if c < len(maxes):
                            if len(lists[c]) < 2 * _LOAD:
                                insort(lists[c], key)
                            else:
                                srt.add(key)
                        elif not maxes:
                            lists.append([key])
                            maxes.append(key)
                        elif len(lists[-1]) < 2 * _LOAD:
                            lists[-1].append(key)
                            maxes[-1] = key
                        else:
                            srt.add(key)
                        blocks[key] = rest
                        # gc_base stays 0: without GC, get_free_block counts no calls.
                        if es is None:
                            nonrel = rest_size  # split: it has a neighbour
                        else:  # the parts of pages unmap() would not cover
                            off = ptr - es.base
                            page = es.page
                            pages = (off + rest_size) // page - (-(-off // page))
                            nonrel = rest_size - (pages * page if pages > 0 else 0)
                        rest.nonrel = nonrel
                        inactive_split += nonrel
                        if nonrel < rest_size:
                            releasable.add(key)
                    else:
                        block = b
                    block.allocated = True
                    allocated += block.size
                    if allocated > peak_allocated:
                        peak_allocated = allocated
                    live[slot] = block
                    continue
        elif code == FREE or (code == FREE_REQUESTED and not deferred):
            held = live[slot]
            if held is not None:
                block = held
                live[slot] = None
                # free_now and free_block, inline: merged with its free mapped neighbours,
                # then back in its pool.
                block.allocated = False
                allocated -= block.size
                pool = block.pool
                es = block.es
                if es is not None:
                    pool.room_hint = None  # a free block can make room below the hint
                srt, blocks, maxes, lists, releasable = pool.parts
                prev, nxt = block.prev, block.next
                if prev is not None and not prev.allocated and not prev.pending and \
                        prev.mapped:
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
                    if prev.nonrel < prev.size:
                        releasable.discard(key)
                    inactive_split -= prev.nonrel
                    block.ptr = prev.ptr
                    block.prev = pp = prev.prev
                    if pp is not None:
                        pp.next = block
                    block.size += prev.size
                if nxt is not None and not nxt.allocated and not nxt.pending and nxt.mapped:
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
                    if nxt.nonrel < nxt.size:
                        releasable.discard(key)
                    inactive_split -= nxt.nonrel
                    block.next = nn = nxt.next
                    if nn is not None:
                        nn.prev = block
                    block.size += nxt.size
                bsize, ptr = block.size, block.ptr
                block.key = key = (bsize << _KEY_SHIFT) | ptr
                c = bisect_left(maxes, key)  # SortedKeys.add, inline but for a split
                if c < len(maxes):
                    if len(lists[c]) < 2 * _LOAD:
                        insort(lists[c], key)
                    else:
                        srt.add(key)
                elif not maxes:
                    lists.append([key])
                    maxes.append(key)
                elif len(lists[-1]) < 2 * _LOAD:
                    lists[-1].append(key)
                    maxes[-1] = key
                else:
                    srt.add(key)
                blocks[key] = block
                if es is None:
                    nonrel = bsize if (block.prev is not None or block.next is not None) \
                        else 0
                else:
                    off = ptr - es.base
                    page = es.page
                    pages = (off + bsize) // page - (-(-off // page))
                    nonrel = bsize - (pages * page if pages > 0 else 0)
                block.nonrel = nonrel
                inactive_split += nonrel
                if nonrel < bsize:
                    releasable.add(key)
            else:
                state.unmatched += 1
            continue
        model.allocated, model.inactive_split = allocated, inactive_split
        model.peak_allocated = peak_allocated
        model.now = i
        oom_at = _general_step(model, code, slot, size, stream, live, pending, deferred,
                               state)
        allocated, inactive_split = model.allocated, model.inactive_split
        peak_allocated = model.peak_allocated
        if oom_at and state.oom_event is None:
            state.oom_event, state.oom_size = i, size
            if stop_at_oom:
                return i + 1  # the model's counters are the loop's
    model.allocated, model.inactive_split = allocated, inactive_split
    model.peak_allocated = peak_allocated
    return stop
