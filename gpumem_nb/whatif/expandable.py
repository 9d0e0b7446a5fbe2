"""Expandable segments (``expandable_segments:True``): one segment's address space per stream
and pool, its pages mapped as requests need them and unmapped when the cache is released.
"""

from __future__ import annotations

from bisect import bisect_left

from .allocstate import AllocatorState
from .blocks import Block, BlockPool, ExpandableSegment, _splice
from .rules import (
    EXPANDABLE_ADDRESS_SPACE_DEN,
    EXPANDABLE_ADDRESS_SPACE_NUM,
    kSmallBuffer,
)

__all__ = ["ExpandableSegments"]


class ExpandableSegments(AllocatorState):
    """``DeviceCachingAllocator``'s expandable-segment calls, by their C++ names."""

    # find_expandable_block remembers where the lowest room was: False scans from the lowest
    # address every time, as PyTorch does (the tests check both give the same blocks).
    use_room_hint = True

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
