"""A model of PyTorch's native CUDA caching allocator (``DeviceCachingAllocator``), one
device, driven by a recorded history instead of a program.

It follows ``c10/cuda/CUDACachingAllocator.cpp`` of torch 2.11 step for step: the method
names below are the C++ ones, and ``rules.py`` holds the constants and sizing rules. What it
keeps is what decides reserved memory: blocks and their neighbours inside segments, the
free blocks of each pool and stream ordered as ``BlockComparatorSize`` orders them (size,
then address), oversize blocks (``max_split_size_mb``), the GC ages
(``garbage_collection_threshold``), the free-cached-and-retry path before an OOM, blocks
waiting on another stream's event (freed but not yet reusable), and expandable segments
mapping and unmapping pages. Addresses of new segments are made up (``cudaMalloc``'s are
unknowable) in the order the driver was measured to hand them out (see ``_new_va``), because
among equal-size free blocks the one at the lower address is reused first.

Left out: CUDA graphs' private pools and ``MemPool``s (their allocations are replayed as if
made in the default pools), the free-memory callbacks (none are registered in stock
PyTorch), and IPC.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from gpumem_nb.whatif.config import AllocatorSettings
from gpumem_nb.whatif.rules import (
    EXPANDABLE_ADDRESS_SPACE_DEN,
    EXPANDABLE_ADDRESS_SPACE_NUM,
    SIZE_MAX,
    get_allocation_size,
    kMinBlockSize,
    kSmallBuffer,
    kSmallSize,
    round_size,
    should_split,
)

_KEY_SHIFT = 64  # free blocks sort by (size, address): one int, (size << 64) | address
# Made-up addresses for new segments: downwards from here (see _new_va), below any real
# device address a snapshot brought in.
_VA_BASE = 1 << 52
_VA_ALIGN = 2 << 20
_DEFAULT_DEVICE_BYTES = 1 << 40  # for an expandable segment's address space when unknown


class ExpandableSegment:
    __slots__ = ("base", "page", "size")

    def __init__(self, base: int, page: int, size: int) -> None:
        self.base = base
        self.page = page  # 2 MiB for the small pool, large_segment_size for the large one
        self.size = size


class Block:
    __slots__ = ("allocated", "es", "gc_base", "key", "mapped", "next", "nonrel", "pending",
                 "pool", "prev", "ptr", "size")

    def __init__(self, size: int, ptr: int, pool: BlockPool,
                 es: ExpandableSegment | None = None, mapped: bool = True) -> None:
        self.size = size
        self.ptr = ptr
        self.pool = pool  # owning pool: small or large, and the stream
        self.es = es
        self.mapped = mapped
        self.allocated = False
        self.pending = False  # freed, waiting on another stream's event: not reusable yet
        self.prev: Block | None = None
        self.next: Block | None = None
        self.key = 0
        self.gc_base = 0
        self.nonrel = 0  # this free block's share of inactive_split_bytes

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


def _whole(b: Block) -> bool:
    """A whole ordinary segment: what ``release_block`` can give back."""
    return b.es is None and b.prev is None and b.next is None


def _splice(b: Block, before: Block | None, after: Block | None) -> None:
    if before is not None:
        before.next = b
    b.prev = before
    if after is not None:
        after.prev = b
    b.next = after


_LOAD = 512  # SortedKeys' chunks hold LOAD to 2 * LOAD keys (the last one fewer)


class SortedKeys:
    """A sorted set of ints (free blocks' keys) held in sorted chunks of at most
    ``2 * LOAD``, so that adding or removing one moves at most one chunk's slots: one sorted
    list moved half of its 47,000 keys at each change (a million-entry history spent 40% of
    its replay there). ``_maxes[c]`` is chunk ``c``'s largest key."""

    __slots__ = ("_lists", "_maxes")
    LOAD = _LOAD

    def __init__(self) -> None:
        self._lists: list[list[int]] = []
        self._maxes: list[int] = []

    def __len__(self) -> int:
        return sum(map(len, self._lists))

    def __iter__(self) -> Iterator[int]:
        for lst in self._lists:
            yield from lst

    def add(self, key: int) -> None:
        maxes, lists = self._maxes, self._lists
        if not maxes:
            lists.append([key])
            maxes.append(key)
            return
        c = bisect_left(maxes, key)
        if c == len(maxes):
            c -= 1
            lst = lists[c]
            lst.append(key)
            maxes[c] = key
        else:
            lst = lists[c]
            insort(lst, key)
        if len(lst) > 2 * _LOAD:
            half = lst[_LOAD:]
            del lst[_LOAD:]
            lists.insert(c + 1, half)
            maxes[c] = lst[-1]
            maxes.insert(c + 1, half[-1])

    def remove(self, key: int) -> None:
        c = bisect_left(self._maxes, key)
        lst = self._lists[c]
        i = bisect_left(lst, key)
        self.remove_at(c, i)

    def remove_at(self, c: int, i: int) -> None:
        lst = self._lists[c]
        del lst[i]
        if not lst:
            del self._lists[c]
            del self._maxes[c]
        elif i == len(lst):
            self._maxes[c] = lst[-1]

    def first_at_least(self, key: int) -> tuple[int, int] | None:
        """(chunk, index) of the smallest key >= ``key``, or None."""
        c = bisect_left(self._maxes, key)
        if c == len(self._maxes):
            return None
        return c, bisect_left(self._lists[c], key)

    def from_(self, c: int, i: int) -> Iterator[int]:
        """The keys from (chunk, index) on, in order (nothing may change meanwhile)."""
        lists = self._lists
        yield from lists[c][i:]
        for lst in lists[c + 1:]:
            yield from lst

    def between_descending(self, low: int, high: int) -> list[int]:
        """The keys in [low, high), largest first."""
        out: list[int] = []
        c = bisect_left(self._maxes, low)
        for lst in self._lists[c:]:
            if lst[0] >= high:
                break
            out += lst[bisect_left(lst, low):bisect_left(lst, high)]
        out.reverse()
        return out


class BlockPool:
    """One stream's free blocks of the small or the large pool."""

    __slots__ = ("blocks", "room_hint", "small", "sorted", "stream", "unmapped",
                 "unmapped_ptrs")

    def __init__(self, small: bool, stream: int) -> None:
        self.small = small
        self.stream = stream
        # (size << 64) | ptr of the free mapped blocks, sorted (BlockComparatorSize).
        self.sorted = SortedKeys()
        self.blocks: dict[int, Block] = {}
        self.unmapped_ptrs: list[int] = []  # expandable segments' unmapped ranges, by address
        self.unmapped: dict[int, Block] = {}
        # (size, ptr): below ptr no unmapped range has room for size bytes (see
        # find_expandable_block); None when unknown.
        self.room_hint: tuple[int, int] | None = None

    @property
    def keys(self) -> list[int]:
        """The free blocks' keys in order, as one list (for the tests' invariants)."""
        return list(self.sorted)


@dataclass(frozen=True)
class Limits:
    """What the replay may reserve. ``allowed_bytes`` is ``set_per_process_memory_fraction``'s
    cap (checked as the allocator checks it, and what the GC threshold is a fraction of);
    ``capacity_bytes`` what the driver could hand out (a ``cudaMalloc`` or page map beyond
    it fails)."""

    allowed_bytes: int | None = None
    capacity_bytes: int | None = None


class DeviceCachingAllocator:
    # find_expandable_block remembers where the lowest room was: False scans from the lowest
    # address every time, as PyTorch does (the tests check both give the same blocks).
    use_room_hint = True

    def __init__(self, settings: AllocatorSettings, limits: Limits | None = None, *,
                 device_total_bytes: int | None = None) -> None:
        limits = limits or Limits()
        self.s = settings
        self.allowed = limits.allowed_bytes
        self.capacity = limits.capacity_bytes
        self.device_total = device_total_bytes or _DEFAULT_DEVICE_BYTES
        self.gc_active = self.allowed is not None and settings.garbage_collection_threshold > 0
        self.max_split = settings.max_split_size
        self.pools: dict[tuple[bool, int], BlockPool] = {}
        self.gc_calls = {True: 0, False: 0}  # BlockPool::get_free_blocks_call_count
        self.pending: dict[int, Block] = {}  # id -> freed blocks waiting on an event
        self._va_down = _VA_BASE  # the lowest address in use so far
        self._va_up = _VA_BASE  # the end of the highest (only if there is no room below)
        self._force = False  # after a predicted OOM: carry on past the limits
        self._new_peak = False
        # A request's (round_size, small pool?, get_allocation_size), for the sizes seen so far.
        self._sizing: dict[int, tuple[int, bool, int]] = {}
        self._pools_by_stream: tuple[dict[int, BlockPool], dict[int, BlockPool]] = ({}, {})
        # No expandable segment, no GC: malloc and free take their inline paths (the same
        # steps as the general ones below, for the blocks and pools such a replay holds).
        self._plain = not settings.expandable_segments and not self.gc_active
        # DeviceStats, the ones the report uses.
        self.reserved = 0  # total_allocated_memory / reserved_bytes
        self.allocated = 0
        self.peak_reserved = 0
        self.peak_allocated = 0
        self.inactive_split = 0  # free bytes empty_cache could not give back
        self.inactive_split_at_peak = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.num_alloc_retries = 0
        self.num_ooms = 0
        # The most any limit check asked for (reserved plus the request or the pages to
        # map): with limits at least this high, and no GC, every check passes and a capped
        # replay is this one.
        self.max_demand = 0
        # When a list: each time max_demand grows at a segment's limit check, that demand
        # and what the check's last retry would ask for once every cached whole segment is
        # given back (the live and split free bytes plus the segment), or -1 when that is
        # not known from the counters (blocks waiting on events, expandable segments). A
        # replay capped at C is this one up to the first check asking more than C, and runs
        # out there when that check's retry asks more than C too (``DemandRecords``).
        self.demand_records: list[int] | None = None
        self.now = 0  # the replay's event index, stamped on each change of reserved
        self.changes: list[tuple[int, int]] = []

    # -- bookkeeping -------------------------------------------------------------------------
    def _pool(self, small: bool, stream: int) -> BlockPool:
        p = self.pools.get((small, stream))
        if p is None:
            p = self.pools[(small, stream)] = BlockPool(small, stream)
            self._pools_by_stream[small][stream] = p
        return p

    def _reserve(self, delta: int) -> None:
        self.reserved += delta
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
            self._new_peak = True  # its stranded bytes are read once the request is served
        self.changes.append((self.now, self.reserved))

    def _new_va(self, size: int, align: int = _VA_ALIGN) -> int:
        """A new segment goes below every earlier one. Of two equal-size free blocks the one
        at the lower address is reused, so this order decides which segment stays whole; it
        is the driver's, measured on the H200 (driver 580, every cudaMalloc of the validation
        runs): a new large-pool segment lies below an earlier one in 95% of pairs. 2 MiB
        segments fill holes the driver left and follow no one order (below in 36% of
        pairs); downwards moves 14 of 2,249 recorded segment events, upwards 21. With
        increasing addresses 5 of the 28 validation peaks missed, by up to 212 MiB."""
        if self._va_down - size < 0:
            ptr = -(-self._va_up // align) * align
            self._va_up = ptr + size
        else:
            ptr = (self._va_down - size) // align * align
            self._va_down = ptr
        return ptr

    def insert_into_blocks(self, b: Block) -> None:
        pool = b.pool
        b.key = key = (b.size << _KEY_SHIFT) | b.ptr
        pool.sorted.add(key)
        pool.blocks[key] = b
        b.gc_base = self.gc_calls[pool.small]
        es = b.es
        if es is None:
            b.nonrel = b.size if (b.prev is not None or b.next is not None) else 0
        else:  # what unmap() could not give back: the parts of pages it does not cover
            off = b.ptr - es.base
            pages = (off + b.size) // es.page - (-(-off // es.page))
            b.nonrel = b.size - max(pages, 0) * es.page
        self.inactive_split += b.nonrel

    def erase_from_blocks(self, b: Block) -> None:
        pool = b.pool
        pool.sorted.remove(b.key)
        del pool.blocks[b.key]
        self.inactive_split -= b.nonrel

    def _insert_unmapped(self, b: Block) -> None:
        pool = b.pool
        insort(pool.unmapped_ptrs, b.ptr)
        pool.unmapped[b.ptr] = b

    def _erase_unmapped(self, b: Block) -> None:
        pool = b.pool
        ptrs = pool.unmapped_ptrs
        del ptrs[bisect_left(ptrs, b.ptr)]
        del pool.unmapped[b.ptr]

    # -- the public calls --------------------------------------------------------------------
    def malloc(self, orig_size: int, stream: int) -> tuple[Block, bool]:
        """(the block handed out, whether the real allocator would have raised an OOM here).
        After a predicted OOM the block is still handed out, past the limits, so the replay
        goes on and the later figures say what the cell would have needed."""
        sizing = self._sizing.get(orig_size)
        if sizing is None:
            s = self.s
            rounded = round_size(orig_size, s.roundup_power2_divisions)
            sizing = self._sizing[orig_size] = (
                rounded, rounded <= kSmallSize,
                get_allocation_size(rounded, s.large_segment_size))
        size, small, alloc_size = sizing
        pool = self._pools_by_stream[small].get(stream)
        if pool is None:
            pool = self._pool(small, stream)
        if self._plain:
            # get_free_block, should_split and alloc_found_block inline, for ordinary
            # segments without GC (the general path below does the same steps).
            srt = pool.sorted
            maxes = srt._maxes
            search = size << _KEY_SHIFT
            c = bisect_left(maxes, search)
            if c < len(maxes):
                keys = srt._lists[c]
                i = bisect_left(keys, search)
                key = keys[i]
                blocks = pool.blocks
                b = blocks[key]
                bsize = b.size
                mss = self.max_split
                if (bsize < mss) if size < mss else \
                        (bsize < size + self.s.max_non_split_rounding_size):
                    remaining = bsize - size
                    if (remaining >= kMinBlockSize) if small else \
                            (size < mss and remaining > kSmallSize):
                        # The found block stays free as the remainder, at its new address
                        # and key; a new block is handed out below it.
                        ptr = b.ptr
                        block = Block(size, ptr, pool)
                        prev = b.prev
                        block.prev = prev
                        if prev is not None:
                            prev.next = block
                        block.next = b
                        b.prev = block
                        b.ptr = ptr + size
                        b.size = remaining
                        new_key = (remaining << _KEY_SHIFT) | (ptr + size)
                        # The smaller key takes the old one's place when it sorts there.
                        if (i > 0 and keys[i - 1] < new_key) or \
                                (i == 0 and (c == 0 or maxes[c - 1] < new_key)):
                            keys[i] = new_key
                            if i == len(keys) - 1:
                                maxes[c] = new_key
                        else:
                            srt.remove_at(c, i)
                            srt.add(new_key)
                        del blocks[key]
                        blocks[new_key] = b
                        b.key = new_key
                        self.inactive_split += remaining - b.nonrel
                        b.nonrel = remaining
                    else:
                        srt.remove_at(c, i)
                        del blocks[key]
                        self.inactive_split -= b.nonrel
                        block = b
                    block.allocated = True
                    self.allocated += block.size
                    if self.allocated > self.peak_allocated:
                        self.peak_allocated = self.allocated
                    return block, False
        return self._malloc(size, small, alloc_size, pool)

    def _malloc(self, size: int, small: bool, alloc_size: int,
                pool: BlockPool) -> tuple[Block, bool]:
        xa = self.s.expandable_segments
        block = self.get_free_block(pool, size, xa)
        oom = False
        if block is None:
            if self.gc_active:
                self.garbage_collect_cached_blocks()
            block = self.alloc_block(pool, size, alloc_size, False, xa)
            if block is None:
                if self.release_available_cached_blocks(pool, size):
                    block = self.alloc_block(pool, size, alloc_size, False, xa)
                if block is None:
                    self.release_cached_blocks()
                    block = self.alloc_block(pool, size, alloc_size, True, xa)
            if block is None:
                oom = True
                self.num_ooms += 1
                self._force = True
                try:
                    block = self.alloc_block(pool, size, alloc_size, False, xa)
                finally:
                    self._force = False
                assert block is not None
        split = should_split(block.size, size, small=small, expandable_active=xa,
                             max_split_size=self.max_split)
        block = self.alloc_found_block(block, size, split)
        if self._new_peak:
            self.inactive_split_at_peak = self.inactive_split
            self._new_peak = False
        return block, oom

    def free(self, block: Block, *, deferred: bool) -> None:
        """``free()``: the tensor is gone; ``deferred`` when the block waits on an event
        (used on another stream) and only returns to its pool at ``complete``."""
        block.allocated = False
        self.allocated -= block.size
        if deferred:
            block.pending = True
            self.pending[id(block)] = block
        elif self._plain:
            self._free_plain(block)
        else:
            self.free_block(block)

    def free_now(self, block: Block) -> None:
        """``free(block, deferred=False)``."""
        block.allocated = False
        self.allocated -= block.size
        if self._plain:
            self._free_plain(block)
        else:
            self.free_block(block)

    def _free_plain(self, block: Block) -> None:
        """``free_block`` inline for an ordinary segment's block without GC: merged with its
        free neighbours, then back in its pool."""
        pool = block.pool
        srt, blocks = pool.sorted, pool.blocks
        maxes, lists = srt._maxes, srt._lists
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated and not prev.pending:  # [prev block]
            key = prev.key  # SortedKeys.remove, inline
            c = bisect_left(maxes, key)
            lst = lists[c]
            i = bisect_left(lst, key)
            del lst[i]
            if not lst:
                del lists[c]
                del maxes[c]
            elif i == len(lst):
                maxes[c] = lst[-1]
            del blocks[prev.key]
            self.inactive_split -= prev.nonrel
            block.ptr = prev.ptr
            block.prev = pp = prev.prev
            if pp is not None:
                pp.next = block
            block.size += prev.size
        if nxt is not None and not nxt.allocated and not nxt.pending:  # [block next]
            key = nxt.key
            c = bisect_left(maxes, key)
            lst = lists[c]
            i = bisect_left(lst, key)
            del lst[i]
            if not lst:
                del lists[c]
                del maxes[c]
            elif i == len(lst):
                maxes[c] = lst[-1]
            del blocks[nxt.key]
            self.inactive_split -= nxt.nonrel
            block.next = nn = nxt.next
            if nn is not None:
                nn.prev = block
            block.size += nxt.size
        block.key = key = (block.size << _KEY_SHIFT) | block.ptr
        c = bisect_left(maxes, key)  # SortedKeys.add, inline for the usual cases
        if c < len(maxes) and len(lists[c]) < 2 * _LOAD:
            insort(lists[c], key)
        else:
            srt.add(key)
        blocks[key] = block
        block.gc_base = self.gc_calls[pool.small]
        nonrel = block.size if (block.prev is not None or block.next is not None) else 0
        block.nonrel = nonrel
        self.inactive_split += nonrel

    def complete(self, block: Block) -> None:
        """The event a deferred free waited on has completed (``process_events``)."""
        if self.pending.pop(id(block), None) is not None:
            block.pending = False
            self.free_block(block)

    def empty_cache(self) -> None:
        self.release_cached_blocks()

    # -- malloc's steps ----------------------------------------------------------------------
    def get_free_block(self, pool: BlockPool, size: int, xa: bool) -> Block | None:
        if self.gc_active:
            self.gc_calls[pool.small] += 1
        srt = pool.sorted
        maxes = srt._maxes
        search = size << _KEY_SHIFT
        c = bisect_left(maxes, search)
        if c == len(maxes):
            return None
        lists, blocks = srt._lists, pool.blocks
        i = bisect_left(lists[c], search)
        b = blocks[lists[c][i]]
        if b.es is not None:
            # The keys after (c, i), in order: (k, j) walks them chunk by chunk.
            k, j = c, i
            if xa:
                # Best fit by the size a block can grow to: an expandable block followed by
                # unmapped pages counts those pages too.
                def expandable_size(x: Block) -> int:
                    nx = x.next
                    return x.size + (nx.size if nx is not None and not nx.mapped else 0)

                while b.es is not None:
                    j += 1
                    if j == len(lists[k]):
                        k, j = k + 1, 0
                        if k == len(lists):
                            break
                    nb = blocks[lists[k][j]]
                    if expandable_size(nb) >= expandable_size(b):
                        break
                    b, c, i = nb, k, j
            else:  # expandable segments switched off: only ordinary blocks may be used
                while True:
                    j += 1
                    if j == len(lists[k]):
                        k, j = k + 1, 0
                        if k == len(lists):
                            return None
                    if blocks[lists[k][j]].es is None:
                        break
                b, c, i = blocks[lists[k][j]], k, j
        mss = self.max_split
        if size < mss and b.size >= mss:
            return None  # do not return an oversized block for a large request
        if size >= mss and b.size >= size + self.s.max_non_split_rounding_size:
            return None  # an oversized block may be rounded up, but within a limit
        srt.remove_at(c, i)
        del blocks[b.key]
        self.inactive_split -= b.nonrel
        return b

    def alloc_found_block(self, block: Block, size: int, split: bool) -> Block:
        if split:
            remaining = block
            block = Block(size, remaining.ptr, remaining.pool, remaining.es)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.ptr += size
            remaining.size -= size
            self.insert_into_blocks(remaining)
        block.allocated = True
        self.allocated += block.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        return block

    def free_block(self, block: Block) -> None:
        if block.es is not None:
            block.pool.room_hint = None  # a free block can make room below the hint
        for candidate in (block.prev, block.next):
            self.try_merge_blocks(block, candidate)
        self.insert_into_blocks(block)

    def try_merge_blocks(self, dst: Block, src: Block | None) -> int:
        if src is None or src.allocated or src.pending or dst.mapped != src.mapped:
            return 0
        if dst.prev is src:  # [src dst]
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:  # [dst src]
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        if src.mapped:
            self.erase_from_blocks(src)
        else:
            self._erase_unmapped(src)
        return src.size

    def alloc_block(self, pool: BlockPool, size: int, alloc_size: int, is_retry: bool,
                    xa: bool) -> Block | None:
        if is_retry:
            self.num_alloc_retries += 1
        demand = self.reserved + alloc_size
        if demand > self.max_demand:
            self.max_demand = demand
            records = self.demand_records
            if records is not None:
                records.append(demand)
                records.append(-1 if self.pending or not self._plain else
                               self.allocated + self.inactive_split + alloc_size)
        if not self._force and self.allowed is not None and demand > self.allowed:
            return None
        if xa:
            return self.try_allocate_expandable_block(pool, size)
        if not self._force and self.capacity is not None and \
                self.reserved + alloc_size > self.capacity:
            return None  # cudaMalloc: out of memory
        block = Block(alloc_size, self._new_va(alloc_size), pool)
        self.num_device_alloc += 1
        self._reserve(alloc_size)
        return block

    def release_available_cached_blocks(self, pool: BlockPool, size: int) -> bool:
        """Free oversize cached blocks, only as many as the request needs. Only a whole
        segment can be given back (``release_block`` cudaFrees the block's address, relying on
        oversize blocks never being split): a split one, which only a start state recorded
        under another setting can hold, is passed over like an expandable one."""
        mss = self.max_split
        if mss == SIZE_MAX:
            return False
        key_size = mss if size < mss else size
        srt, blocks = pool.sorted, pool.blocks
        at = srt.first_at_least(key_size << _KEY_SHIFT)
        if at is None or not _whole(blocks[srt._lists[at[0]][at[1]]]):
            # No single block is large enough: free several, the largest first, while they
            # are oversize (none when no block is smaller than the key).
            released = 0
            for key in srt.between_descending(mss << _KEY_SHIFT, key_size << _KEY_SHIFT):
                if released >= key_size:
                    break
                b = blocks[key]
                if _whole(b):
                    released += b.size
                    self.release_block(b)
            return released >= key_size
        self.release_block(blocks[srt._lists[at[0]][at[1]]])
        return True

    def release_cached_blocks(self) -> None:
        """``empty_cache`` and the last retry before an OOM: wait for every pending event,
        then give back every unsplit free segment and every free expandable page."""
        for b in list(self.pending.values()):
            self.complete(b)
        for small in (False, True):
            for (is_small, _), pool in list(self.pools.items()):
                if is_small == small:
                    self.release_blocks(pool)

    def release_blocks(self, pool: BlockPool) -> None:
        to_unmap = []
        for b in [pool.blocks[k] for k in pool.sorted]:
            if b.es is not None:
                to_unmap.append(b)
            elif b.prev is None and b.next is None:
                self.release_block(b)
        for b in to_unmap:
            self.unmap_block(b)
            if not b.mapped and b.prev is None and b.next is None:
                self._erase_unmapped(b)  # release_expandable_segment

    def release_block(self, b: Block) -> None:
        self.erase_from_blocks(b)
        self.num_device_free += 1
        self._reserve(-b.size)

    def garbage_collect_cached_blocks(self) -> None:
        """Give back the large pool's unsplit free blocks unused for longest, until reserved
        is under ``garbage_collection_threshold`` x the memory fraction's cap."""
        assert self.allowed is not None
        threshold = int(self.s.garbage_collection_threshold * self.allowed)
        if self.reserved <= threshold:
            return
        target = self.reserved - threshold
        calls = self.gc_calls[False]
        large = [p for (small, _), p in self.pools.items() if not small]
        freeable = [b for p in large for b in p.blocks.values() if not b.is_split()]
        if not freeable:
            return
        total_age = sum(calls - b.gc_base for b in freeable)
        count = len(freeable)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for p in large:
                for b in [p.blocks[k] for k in p.sorted]:
                    age = calls - b.gc_base
                    if not b.is_split() and b.es is None and age >= age_threshold:
                        freed = True
                        reclaimed += b.size
                        total_age -= age
                        count -= 1
                        self.release_block(b)

    # -- expandable segments -----------------------------------------------------------------
    def find_expandable_block(self, pool: BlockPool, size: int) -> Block:
        """The lowest address with ``size`` bytes of free or unmapped room in one of this
        stream's segments, or a new segment's whole address space."""
        def allocatable(b: Block | None) -> bool:
            return b is not None and not b.allocated and not b.pending

        def has_room(b: Block | None) -> bool:
            got = 0
            while got < size and b is not None and allocatable(b):
                got += b.size
                b = b.next
            return got >= size

        # PyTorch scans every unmapped range from the lowest address. Until a block is freed
        # or unmapped (allocating and mapping only take room away), the ranges below where
        # the last scan found room for as many bytes still have none: start there.
        ptrs = pool.unmapped_ptrs
        hint = pool.room_hint if self.use_room_hint else None
        first = bisect_left(ptrs, hint[1]) if hint is not None and size >= hint[0] else 0
        for k in range(first, len(ptrs)):
            c = pool.unmapped[ptrs[k]]
            if allocatable(c.prev):
                assert c.prev is not None
                c = c.prev
            if has_room(c):
                pool.room_hint = (size, ptrs[k])
                return c
        pool.room_hint = None  # the new segment goes below the others
        page = kSmallBuffer if pool.small else self.s.large_segment_size
        space = self.device_total * EXPANDABLE_ADDRESS_SPACE_NUM // EXPANDABLE_ADDRESS_SPACE_DEN
        # A request larger than that address space fails in PyTorch (no GPU has the memory
        # to map it); once the replay carries on past an OOM, the segment is made to fit.
        space = max(-(-space // page) * page, -(-size // page) * page)
        es = ExpandableSegment(self._new_va(space, page), page, space)
        c = Block(space, es.base, pool, es, mapped=False)
        self._insert_unmapped(c)
        return c

    def map_block(self, to_map: Block, size: int) -> bool:
        es = to_map.es
        assert es is not None and not to_map.mapped
        off = to_map.ptr - es.base
        mapped = (-(-(off + size) // es.page) - off // es.page) * es.page
        if self.reserved + mapped > self.max_demand:
            self.max_demand = self.reserved + mapped
        if not self._force and self.capacity is not None and \
                self.reserved + mapped > self.capacity:
            return False  # cuMemCreate: out of memory
        self._erase_unmapped(to_map)
        to_map.mapped = True
        if mapped < to_map.size:
            rest = Block(to_map.size - mapped, to_map.ptr + mapped, to_map.pool, es,
                         mapped=False)
            _splice(rest, to_map, to_map.next)
            self._insert_unmapped(rest)
            to_map.size = mapped
        self.try_merge_blocks(to_map, to_map.prev)
        self.try_merge_blocks(to_map, to_map.next)
        self.insert_into_blocks(to_map)
        self.num_device_alloc += 1
        self._reserve(mapped)
        return True

    def try_allocate_expandable_block(self, pool: BlockPool, size: int) -> Block | None:
        c = self.find_expandable_block(pool, size)
        if not c.mapped and not self.map_block(c, min(c.size, size)):
            return None
        while c.size < size:
            nxt = c.next
            assert nxt is not None
            if not self.map_block(nxt, min(size - c.size, nxt.size)):
                return None
            c = nxt
        self.erase_from_blocks(c)
        return c

    def unmap_block(self, b: Block) -> None:
        es = b.es
        assert es is not None
        off = b.ptr - es.base
        begin = -(-off // es.page)
        end = (off + b.size) // es.page
        if begin >= end:
            return
        # The range unmapped here takes in the unmapped range after it, room and all, at
        # its own lower address: that room may now lie below the remembered one.
        b.pool.room_hint = None
        self.erase_from_blocks(b)
        uptr = es.base + begin * es.page
        usize = (end - begin) * es.page
        before = uptr - b.ptr
        if before > 0:
            bf = Block(before, b.ptr, b.pool, es)
            _splice(bf, b.prev, b)
            self.insert_into_blocks(bf)
        after = b.size - (before + usize)
        if after > 0:
            af = Block(after, uptr + usize, b.pool, es)
            _splice(af, b, b.next)
            self.insert_into_blocks(af)
        b.ptr, b.size, b.mapped = uptr, usize, False
        self.try_merge_blocks(b, b.prev)
        self.try_merge_blocks(b, b.next)
        self._insert_unmapped(b)
        self.num_device_free += 1
        self._reserve(-usize)

    # -- the state at the trace's start ------------------------------------------------------
    def load_segments(self, segments: Iterable[Mapping[str, Any]], device: int,
                      page_bytes: int) -> tuple[dict[int, Block], dict[int, Block]]:
        """Rebuild the segments a snapshot lists (one device's), returning the allocated
        blocks and those waiting on an event, by address, so that the history's frees and
        completions of earlier allocations find them. Expandable ranges of one stream and
        pool become one segment, the gaps between them unmapped."""
        segments = list(segments)  # read more than once
        live: dict[int, Block] = {}
        waiting: dict[int, Block] = {}
        groups: dict[tuple[int, bool], list[Mapping[str, Any]]] = {}
        ordinary: list[Mapping[str, Any]] = []
        for seg in segments:
            if int(seg.get("device", device)) != device:
                continue
            small = seg.get("segment_type") == "small"
            stream = int(seg.get("stream", 0) or 0)
            (groups.setdefault((stream, small), []) if seg.get("is_expandable")
             else ordinary).append(seg)
        for (stream, small), segs in list(groups.items()):
            page = kSmallBuffer if small else page_bytes
            segs = sorted(segs, key=lambda s: int(s.get("address", 0)))
            base = int(segs[0].get("address", 0))
            # Mapped ranges are whole pages from the segment's start. Ranges that are not
            # (a snapshot recorded with other pages, or junk) are loaded as ordinary segments.
            if any((int(s.get("address", 0)) - base) % page or int(s.get("total_size", 0)) % page
                   for s in segs):
                ordinary += groups.pop((stream, small))
                continue
            # A real segment's address space is reserved whole: no other segment lies inside
            # the ranges it maps. One that does (a snapshot of junk) makes the group ordinary.
            end_used = max(int(s.get("address", 0)) + int(s.get("total_size", 0)) for s in segs)
            if any(base < int(o.get("address", 0)) < end_used for o in segments
                   if int(o.get("device", device)) == device and not any(o is g for g in segs)):
                ordinary += groups.pop((stream, small))
        for seg in ordinary:
            small = seg.get("segment_type") == "small"
            chain = self._chain(seg, self._pool(small, int(seg.get("stream", 0) or 0)), None,
                                live, waiting)
            if chain:
                self._reserve(sum(b.size for b in chain))
                self._link(chain)
        if groups:
            self._plain = False  # expandable blocks take the general paths
        for (stream, small), segs in groups.items():
            pool = self._pool(small, stream)
            page = kSmallBuffer if small else page_bytes
            segs = sorted(segs, key=lambda s: int(s.get("address", 0)))
            base = int(segs[0].get("address", 0))
            space = self.device_total * EXPANDABLE_ADDRESS_SPACE_NUM // EXPANDABLE_ADDRESS_SPACE_DEN
            end_used = max(int(s.get("address", 0)) + int(s.get("total_size", 0)) for s in segs)
            space = max(-(-space // page) * page, -(-(end_used - base) // page) * page + page)
            # Nor can it grow into the next segment the snapshot lists above it.
            above = [int(o.get("address", 0)) for o in segments
                     if int(o.get("device", device)) == device
                     and int(o.get("address", 0)) >= end_used and not any(o is g for g in segs)]
            if above:
                space = max(min(space, (min(above) - base) // page * page), end_used - base)
            es = ExpandableSegment(base, page, space)
            layout: list[Block] = []
            at = base
            for seg in segs:
                addr = int(seg.get("address", 0))
                if addr > at:
                    layout.append(Block(addr - at, at, pool, es, mapped=False))
                mapped = self._chain(seg, pool, es, live, waiting)
                self._reserve(sum(b.size for b in mapped))
                layout += mapped
                at = addr + int(seg.get("total_size", 0))
            if base + space > at:
                layout.append(Block(base + space - at, at, pool, es, mapped=False))
            self._link(layout)
        self.inactive_split_at_peak = self.inactive_split
        self._new_peak = False
        return live, waiting

    def _chain(self, seg: Mapping[str, Any], pool: BlockPool,
               es: ExpandableSegment | None, live: dict[int, Block],
               waiting: dict[int, Block]) -> list[Block]:
        at = int(seg.get("address", 0))
        chain = []
        for blk in seg.get("blocks") or ():
            size = int(blk.get("size", 0))
            if size <= 0:
                continue
            b = Block(size, int(blk.get("address", at)), pool, es)
            state = blk.get("state")
            if state == "active_allocated":
                b.allocated = True
                self.allocated += size
                live[b.ptr] = b
            elif state in ("active_awaiting_free", "active_pending_free"):
                b.pending = True
                self.pending[id(b)] = b
                waiting[b.ptr] = b
            chain.append(b)
            at = b.ptr + size
        return chain

    def _link(self, chain: list[Block]) -> None:
        for a, b in pairwise(chain):
            a.next, b.prev = b, a
        for b in chain:
            if not b.mapped:
                self._insert_unmapped(b)
            elif not b.allocated and not b.pending:
                self.insert_into_blocks(b)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self._va_down = min(self._va_down, *(b.ptr for b in chain))
        self._va_up = max(self._va_up, *(b.ptr + b.size for b in chain))

    # -- what the property tests check -----------------------------------------------------
    def segments(self, allocated: Iterable[Block] = ()) -> list[list[Block]]:
        """Every segment's blocks in address order, found from the free, unmapped and
        pending blocks and ``allocated`` (the blocks handed out, which no pool holds)."""
        everything: list[Block] = list(allocated)
        for pool in self.pools.values():
            everything += pool.blocks.values()
            everything += pool.unmapped.values()
        everything += self.pending.values()
        seen: set[int] = set()
        out = []
        for b in everything:
            while b.prev is not None:
                b = b.prev
            if id(b) in seen:
                continue
            seen.add(id(b))
            chain = []
            x: Block | None = b
            while x is not None:
                chain.append(x)
                x = x.next
            out.append(chain)
        return out
