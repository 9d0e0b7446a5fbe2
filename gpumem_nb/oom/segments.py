"""The allocator's segments at a failure: each private pool's bytes (a CUDA graph's, a
``MemPool``'s) and the user variable that owns it, the default pool's largest free block and
its segments with nothing allocated. Read from a snapshot's plain dicts: no torch call."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from ..holders import static_attribute, type_name
from .facts import POOL_GRAPH, POOL_USER, PoolUse

__all__ = ["graph_trees_loaded", "named_pools", "pool_id_of", "pools_in"]


def pool_id_of(seg: Mapping[str, Any]) -> tuple[int, int]:
    """A segment's ``segment_pool_id`` (``(0, 0)``: the default pool), as
    ``torch/csrc/cuda/Module.cpp`` writes it from ``SegmentInfo.owner_private_pool_id``."""
    raw = seg.get("segment_pool_id", (0, 0))
    try:
        a, b = raw
        return int(a), int(b)
    except (TypeError, ValueError):
        return (0, 0)


def pools_in(segments: Iterable[Mapping[str, Any]], device: int,
             graph_trees: bool = False) -> tuple[PoolUse, ...]:
    """Each non-default pool's reserved and allocated bytes on ``device``."""
    sizes: dict[tuple[int, int], list[int]] = {}
    ranges: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for seg in segments:
        if seg.get("device", device) != device:
            continue
        pid = pool_id_of(seg)
        if pid == (0, 0):
            continue
        total = int(seg.get("total_size", 0) or 0)
        allocated = seg.get("allocated_size")
        if allocated is None:
            allocated = sum(int(b.get("size", 0)) for b in seg.get("blocks", ())
                            if b.get("state") == "active_allocated")
        entry = sizes.setdefault(pid, [0, 0])
        entry[0] += total
        entry[1] += int(allocated)
        address = seg.get("address")
        if isinstance(address, int):
            ranges.setdefault(pid, []).append((address, total))
    return tuple(PoolUse(pid, POOL_USER if pid[0] == 0 else POOL_GRAPH, r, a,
                         graph_trees=graph_trees and pid[0] != 0,
                         ranges=tuple(ranges.get(pid, ())))
                 for pid, (r, a) in sizes.items())


def _segment_facts(snapshot: Mapping[str, Any],
                   device: int) -> tuple[int | None, bool | None, int]:
    """(largest free block inside PyTorch's default pool's segments, expandable segments on,
    the default pool's segments with no block allocated) from a snapshot taken at the
    failure. A private pool's free blocks are not fragmentation: only that pool can use them
    (``pools_in``)."""
    largest: int | None = None
    expandable: bool | None = None
    idle = 0
    for seg in snapshot.get("segments", ()):
        if seg.get("device", device) != device:
            continue
        if seg.get("is_expandable"):
            expandable = True
        if pool_id_of(seg) != (0, 0):
            continue
        allocated = False
        for b in seg.get("blocks", ()):
            if b.get("state") == "inactive":
                largest = max(largest or 0, int(b.get("size", 0)))
            elif b.get("state") == "active_allocated":
                allocated = True
        if not allocated:
            idle += int(seg.get("total_size", 0))
    settings = snapshot.get("allocator_settings")
    if isinstance(settings, Mapping) and "expandable_segments" in settings:
        expandable = bool(settings["expandable_segments"]) or bool(expandable)
    return largest, expandable, idle


def graph_trees_loaded() -> bool:
    """Whether torch.compile's CUDA graph trees have been imported (mode="reduce-overhead")."""
    return "torch._inductor.cudagraph_trees" in sys.modules


def named_pools(pools: tuple[PoolUse, ...], user_ns: Any) -> tuple[PoolUse, ...]:
    """Each pool with the user variable that owns it, where one is found at the top of
    the namespace (a ``CUDAGraph``'s ``pool()``, a ``MemPool``'s ``id``: torch's own
    methods, read guarded)."""
    if not pools:
        return pools
    owners: dict[tuple[int, int], str] = {}
    if isinstance(user_ns, dict):
        for name, obj in list(user_ns.items()):
            # Read through type's own descriptors: a user's metaclass runs no code here,
            # and a user's class of the same name is not torch's (its pool() is theirs).
            cls = type_name(type(obj))
            if cls not in ("CUDAGraph", "MemPool") or type(name) is not str:
                continue
            module = static_attribute(type(obj), "__module__")
            if type(module) is not str or not module.startswith("torch."):
                continue
            try:
                raw = obj.pool() if cls == "CUDAGraph" else obj.id
                owners.setdefault((int(raw[0]), int(raw[1])), name)
            except Exception:
                continue
    return tuple(replace(p, owner=owners.get(p.pool_id, "")) for p in pools)
