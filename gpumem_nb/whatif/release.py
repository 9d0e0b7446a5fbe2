"""Giving cached memory back: the oversize blocks a request needs released, the whole cache
(``empty_cache``, the last retry before an OOM), and the garbage collection of the large
pool's oldest blocks (``garbage_collection_threshold``).
"""

from __future__ import annotations

from .blocks import _KEY_SHIFT, Block, BlockPool, _whole
from .expandable import ExpandableSegments
from .rules import (
    SIZE_MAX,
)

__all__ = ["CacheRelease"]


class CacheRelease(ExpandableSegments):
    """``DeviceCachingAllocator``'s release paths, by their C++ names."""

    def complete(self, block: Block) -> None:
        """The event a deferred free waited on has completed (``process_events``)."""
        if self.pending.pop(id(block), None) is not None:
            block.pending = False
            self.free_block(block)

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
        """PyTorch walks every free block of the pool, in its order, giving back the whole
        segments, then unmapping the expandable blocks' whole pages. The others (split
        blocks, expandable blocks within a page) it passes over untouched: only the
        releasable ones are walked, in the same order. A capped replay's last retry before
        each OOM releases the whole cache: walking each pool's thousands of split free
        blocks every time made a replay far past its cap quadratic."""
        if not pool.releasable:
            return
        to_unmap = []
        for b in [pool.blocks[k] for k in sorted(pool.releasable)]:
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
        # An unsplit free block is releasable (a whole segment, ordinary or expandable).
        freeable = [b for p in large for b in map(p.blocks.__getitem__, p.releasable)
                    if not b.is_split()]
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
                for b in [p.blocks[k] for k in sorted(p.releasable)]:
                    age = calls - b.gc_base
                    if not b.is_split() and b.es is None and age >= age_threshold:
                        freed = True
                        reclaimed += b.size
                        total_age -= age
                        count -= 1
                        self.release_block(b)
