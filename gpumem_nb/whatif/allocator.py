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

from .allocstate import Limits
from .blocks import _KEY_SHIFT, _LOAD, Block, BlockPool
from .release import CacheRelease
from .rules import (
    get_allocation_size,
    kMinBlockSize,
    kSmallSize,
    round_size,
    should_split,
)
from .seeding import SegmentLoader

__all__ = ["DeviceCachingAllocator", "Limits"]


class DeviceCachingAllocator(SegmentLoader, CacheRelease):
    """The allocator's public calls and malloc's steps. Its parts, one file each: the state
    and shared bookkeeping (``allocstate``), expandable segments (``expandable``), the
    release and garbage-collection paths (``release``), the start state (``seeding``), and
    the blocks and pools (``blocks``)."""

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
                        if not b.nonrel:  # it was a whole segment: split now
                            pool.releasable.discard(key)
                        self.inactive_split += remaining - b.nonrel
                        b.nonrel = remaining
                    else:
                        srt.remove_at(c, i)
                        del blocks[key]
                        if not b.nonrel:
                            pool.releasable.discard(key)
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
        # Its neighbours, split, were not releasable; it is when it is a whole segment now.
        nonrel = block.size if (block.prev is not None or block.next is not None) else 0
        block.nonrel = nonrel
        self.inactive_split += nonrel
        if not nonrel:
            pool.releasable.add(key)

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
        if b.nonrel < b.size:
            pool.releasable.discard(b.key)
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
