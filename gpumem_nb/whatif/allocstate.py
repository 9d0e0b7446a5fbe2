"""The caching allocator model's state: its pools, counters (``DeviceStats``) and limits, and
the bookkeeping every path shares: a pool per stream, reserved bytes and their peak, made-up
segment addresses, the free blocks' sorted keys, and merging a freed block with its free
neighbours (``free_block``, ``try_merge_blocks``).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

from .blocks import _KEY_SHIFT, Block, BlockPool
from .config import AllocatorSettings

__all__ = ["AllocatorState", "Limits"]

# Made-up addresses for new segments: downwards from here (see _new_va), below any real
# device address a snapshot brought in.
_VA_BASE = 1 << 52
_VA_ALIGN = 2 << 20
_DEFAULT_DEVICE_BYTES = 1 << 40  # for an expandable segment's address space when unknown


@dataclass(frozen=True)
class Limits:
    """What the replay may reserve. ``allowed_bytes`` is ``set_per_process_memory_fraction``'s
    cap (checked as the allocator checks it, and what the GC threshold is a fraction of);
    ``capacity_bytes`` what the driver could hand out (a ``cudaMalloc`` or page map beyond
    it fails)."""

    allowed_bytes: int | None = None
    capacity_bytes: int | None = None


class AllocatorState:
    """What every part of ``DeviceCachingAllocator`` reads and changes; the paths themselves
    are the subclasses': expandable segments, the release paths, the start state, malloc."""

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
        if b.nonrel < b.size:
            pool.releasable.add(key)

    def erase_from_blocks(self, b: Block) -> None:
        pool = b.pool
        pool.sorted.remove(b.key)
        del pool.blocks[b.key]
        pool.releasable.discard(b.key)
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
