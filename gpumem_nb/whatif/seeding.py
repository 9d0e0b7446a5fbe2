"""The allocator's state at the trace's start: a snapshot's segments rebuilt as blocks (the
history's frees of earlier allocations find them); and taking a finished replay's blocks
apart, and listing its segments for the property tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import pairwise
from typing import Any

from .allocstate import AllocatorState
from .blocks import Block, BlockPool, ExpandableSegment
from .rules import (
    EXPANDABLE_ADDRESS_SPACE_DEN,
    EXPANDABLE_ADDRESS_SPACE_NUM,
    kSmallBuffer,
)

__all__ = ["SegmentLoader"]


class SegmentLoader(AllocatorState):
    """``DeviceCachingAllocator`` seeded from a snapshot, and taken apart after."""

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

    def dismantle(self, *held: Iterable[Block | None]) -> None:
        """Unlink every block from its neighbours and its pool, ``held`` being the blocks
        handed out (which no pool holds): a finished replay's blocks are then freed by
        reference counting as soon as the model is dropped, not left to the cycle collector
        as a million cycles. The model holds no blocks after."""
        for group in (*held, self.pending.values(),
                      *(p.blocks.values() for p in self.pools.values()),
                      *(p.unmapped.values() for p in self.pools.values())):
            for b in group:
                if b is not None:
                    b.prev = b.next = None
        for p in self.pools.values():
            p.blocks.clear()
            p.releasable.clear()
            p.unmapped.clear()
        self.pending.clear()

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
