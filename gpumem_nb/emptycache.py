"""What ``torch.cuda.empty_cache()`` would give back, by each allocator backend's own rule.

Free memory inside PyTorch's cache is not all returnable. ``%gpumem cleanup --dry-run`` and
the OOM explainer used to promise reserved − allocated; on the H200, 20 free 1 GiB holes in a
40 GiB segment that still held tensors were promised as 20 GiB, and empty_cache gave back
nothing. The rules, from ``c10/cuda/CUDACachingAllocator.cpp`` and
``CUDAMallocAsyncAllocator.cpp`` (torch 2.11):

- **Native.** ``release_cached_blocks`` runs ``release_blocks`` on each pool, which frees a
  free block only when it has no neighbour (``!block->prev && !block->next``): a segment with
  nothing left in it. A free block inside a segment that still holds a tensor stays, and
  ``free_block`` counts it in ``inactive_split_bytes`` (a free block that ``is_split()``).
  From the stats: reserved − allocated − inactive_split, at most (a block freed on another
  stream waits for its event in neither figure; empty_cache syncs those first, and one then
  frees its segment only if it was the segment's last). From the segments, when they can be
  read: the segments none of whose blocks is allocated.
- **Expandable segments.** ``release_blocks`` unmaps, in every free block, the whole pages
  inside it (``ExpandableSegment::unmap`` rounds the block's start up and its end down to a
  page: 2 MiB in the small pool, ``large_segment_size`` (20 MiB) in the large one). Those
  blocks are left out of ``inactive_split`` on purpose, so only the segments tell how much;
  from the stats alone, reserved − allocated is a bound.
- **cudaMallocAsync.** ``emptyCache`` synchronizes and trims the driver's pool
  (``cudaMemPoolTrimTo(pool, 0)``): it releases what the pool holds unused, at most
  reserved − allocated. The driver decides; memory it cannot release stays.

Segments of private pools (CUDA graphs, ``MemPool``) are freed only once their graph is gone,
so they are never counted. Pure: readings and snapshot segments in, an estimate out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .model import AllocatorReading
from .units import format_bytes
from .whatif.config import BACKEND_ASYNC
from .whatif.rules import kLargeBuffer, kSmallBuffer

__all__ = [
    "PAGES",
    "PAGES_BOUND",
    "POOL",
    "SEGMENTS",
    "STATS",
    "CacheRelease",
    "estimate",
    "from_segments",
    "from_stats",
]

SEGMENTS = "segments"  # native, counted from the segments
STATS = "stats"  # native, reserved − allocated − inactive_split
PAGES = "pages"  # expandable segments, counted from the segments
PAGES_BOUND = "pages, bound"  # expandable segments without their segments: a bound
POOL = "pool"  # cudaMallocAsync's trim


@dataclass(frozen=True)
class CacheRelease:
    """What empty_cache would give back (``nbytes``), what of the cache's free memory it
    would keep (``kept_bytes``, None when unknown), and by which rule."""

    nbytes: int
    kept_bytes: int | None
    rule: str
    segments: int = 0  # wholly free segments (rule SEGMENTS)
    page_bytes: int = kLargeBuffer  # the large pool's page (rules PAGES, PAGES_BOUND)

    @property
    def exact(self) -> bool:
        return self.rule in (SEGMENTS, PAGES)

    def _kept(self, where: str) -> str:
        return (f"; {format_bytes(self.kept_bytes)} free {where} stays"
                if self.kept_bytes else "")

    def did(self) -> str:
        """The dry run's row: what empty_cache would do, and what it would leave."""
        inside = "inside segments that still hold tensors"
        if self.rule == SEGMENTS:
            return (f"would free the {self.segments} wholly free segment(s)"
                    + self._kept(inside) + " (empty_cache never splits a segment)")
        if self.rule == STATS:
            return ("would free wholly free segments: at most reserved − allocated − "
                    "inactive_split" + self._kept(inside))
        page = format_bytes(self.page_bytes)
        if self.rule == PAGES:
            return (f"would unmap the whole free pages ({page} large, 2 MiB small) of "
                    "expandable segments" + self._kept("in pages still partly used"))
        if self.rule == PAGES_BOUND:
            return ("would unmap the whole free pages of expandable segments: at most "
                    "reserved − allocated (the segments could not be read)")
        return ("would trim the cudaMallocAsync pool (cudaMemPoolTrimTo): at most reserved − "
                "allocated; the driver decides what it gives back")

    def brief(self) -> str:
        """The same in a few words, for the OOM explainer's dry-run line."""
        n = ("" if self.exact else "up to ") + format_bytes(self.nbytes)
        if self.rule in (SEGMENTS, STATS):
            return f"{n} in wholly free cached segments (empty_cache)"
        if self.rule in (PAGES, PAGES_BOUND):
            return f"{n} in free pages of expandable segments (empty_cache unmaps them)"
        return f"{n} unused in the cudaMallocAsync pool (empty_cache trims it)"


def from_stats(reading: AllocatorReading) -> int:
    """The native rule from one stats read: reserved − allocated − inactive_split."""
    return max(reading.reserved_bytes - reading.allocated_bytes
               - reading.inactive_split_bytes, 0)


def _default_pool(seg: Mapping[str, Any]) -> bool:
    pool = seg.get("segment_pool_id")
    return pool is None or tuple(pool) == (0, 0)


def _free_runs(seg: Mapping[str, Any]) -> list[tuple[int, int]]:
    """(start, size) of each run of free blocks, merged as empty_cache's event sync would
    merge them (a block pending its free is free by then). Addresses are the blocks' own,
    or laid end to end from the segment's start when a snapshot omits them."""
    runs: list[tuple[int, int]] = []
    at = int(seg.get("address", 0) or 0)
    run_start = run_size = None
    for b in seg.get("blocks") or ():
        size = int(b.get("size", 0) or 0)
        start = int(b.get("address", at) or at)
        if b.get("state") == "active_allocated":
            if run_start is not None and run_size:
                runs.append((run_start, run_size))
            run_start = run_size = None
        elif run_start is None or run_size is None:
            run_start, run_size = start, size
        else:
            run_size += size
        at = start + size
    if run_start is not None and run_size:
        runs.append((run_start, run_size))
    return runs


def _whole_pages(base: int, start: int, size: int, page: int) -> int:
    """Bytes of the whole pages (counted from ``base``) inside [start, start + size)."""
    first = -(-(start - base) // page)
    last = (start + size - base) // page
    return max(last - first, 0) * page


def from_segments(segments: Iterable[Mapping[str, Any]], devices: Iterable[int] | None = None,
                  *, large_page_bytes: int = kLargeBuffer) -> tuple[int, int, int]:
    """(returnable bytes, free bytes kept, wholly free segments) over the default pools'
    segments of ``devices`` (all when None), each by its own kind's rule."""
    wanted = None if devices is None else set(devices)
    returnable = kept = whole = 0
    for seg in segments:
        if wanted is not None and int(seg.get("device", 0) or 0) not in wanted:
            continue
        if not _default_pool(seg):
            continue
        runs = _free_runs(seg)
        free = sum(size for _, size in runs)
        if seg.get("is_expandable"):
            page = kSmallBuffer if seg.get("segment_type") == "small" else large_page_bytes
            base = int(seg.get("address", 0) or 0)
            back = sum(_whole_pages(base, s, n, page) for s, n in runs)
        elif not any(b.get("state") == "active_allocated" for b in seg.get("blocks") or ()):
            back = int(seg.get("total_size", free) or 0)
            whole += 1
        else:
            back = 0
        returnable += back
        kept += max(free - back, 0)
    return returnable, kept, whole


def estimate(readings: Mapping[int, AllocatorReading], *, backend: str, expandable: bool,
             segments: Sequence[Mapping[str, Any]] | None,
             large_page_bytes: int = kLargeBuffer) -> CacheRelease | None:
    """What empty_cache would give back on these devices; None without a reading."""
    if not readings:
        return None
    unused = sum(max(r.reserved_bytes - r.allocated_bytes, 0) for r in readings.values())
    if backend == BACKEND_ASYNC:
        return CacheRelease(unused, None, POOL)
    if segments is not None:
        back, kept, whole = from_segments(segments, readings, large_page_bytes=large_page_bytes)
        expandable = expandable or any(s.get("is_expandable") for s in segments)
        return CacheRelease(back, kept, PAGES if expandable else SEGMENTS, segments=whole,
                            page_bytes=large_page_bytes)
    if expandable:
        return CacheRelease(unused, None, PAGES_BOUND, page_bytes=large_page_bytes)
    back = sum(from_stats(r) for r in readings.values())
    return CacheRelease(back, sum(min(r.inactive_split_bytes,
                                      max(r.reserved_bytes - r.allocated_bytes, 0))
                                  for r in readings.values()), STATS)
