"""The caching allocator model's blocks and pools: ``Block`` (a piece of a segment, linked
to its neighbours), ``ExpandableSegment``, and ``BlockPool``, one stream's free blocks of the
small or the large pool, kept sorted as ``BlockComparatorSize`` sorts them (``SortedKeys``).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator

__all__ = ["Block", "BlockPool", "ExpandableSegment", "SortedKeys"]

_KEY_SHIFT = 64  # free blocks sort by (size, address): one int, (size << 64) | address
_LOAD = 512  # SortedKeys' chunks hold LOAD to 2 * LOAD keys (the last one fewer)


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

    __slots__ = ("blocks", "parts", "releasable", "room_hint", "small", "sorted", "stream",
                 "unmapped", "unmapped_ptrs")

    def __init__(self, small: bool, stream: int) -> None:
        self.small = small
        self.stream = stream
        # (size << 64) | ptr of the free mapped blocks, sorted (BlockComparatorSize).
        self.sorted = SortedKeys()
        self.blocks: dict[int, Block] = {}
        # The keys of the free blocks that releasing the cache gives back memory from: a
        # whole ordinary segment, or an expandable block covering a whole page; those
        # whose ``nonrel`` (the bytes it cannot give back) is less than their size. The
        # last retry before each OOM releases them; a capped replay runs out thousands of
        # times over pools of thousands of split blocks, none of which it can give back.
        self.releasable: set[int] = set()
        self.unmapped_ptrs: list[int] = []  # expandable segments' unmapped ranges, by address
        self.unmapped: dict[int, Block] = {}
        # (size, ptr): below ptr no unmapped range has room for size bytes (see
        # find_expandable_block); None when unknown.
        self.room_hint: tuple[int, int] | None = None
        # What the replay's inline loops read of it on each free, in one read.
        self.parts = (self.sorted, self.blocks, self.sorted._maxes, self.sorted._lists,
                      self.releasable)

    @property
    def keys(self) -> list[int]:
        """The free blocks' keys in order, as one list (for the tests' invariants)."""
        return list(self.sorted)
