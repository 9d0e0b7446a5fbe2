"""The allocator's state when PyTorch's OOM observer fired, kept for the explanation that
follows the exception."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..model import AllocatorReading, CellStart, Holder, Sample
from .facts import PoolUse

__all__ = ["OomEvent", "with_counted_ooms"]


@dataclass
class OomEvent:
    """The allocator's state when its observer fired: before the exception, every tensor
    still alive."""

    device: int
    requested_bytes: int
    limit_bytes: int  # the memory-fraction cap when set, else the device total
    free_bytes: int
    wall_s: float
    generation: int
    reading: AllocatorReading | None = None
    processes: list[tuple[int, int | None]] | None = None
    holders: tuple[Holder, ...] | None = None
    largest_free_block_bytes: int | None = None
    idle_segments_bytes: int | None = None
    expandable_segments: bool | None = None
    grad_enabled: bool | None = None  # on the allocating thread (a backward runs on its own)
    cell: CellStart | None = None
    pools: tuple[PoolUse, ...] = ()
    workspaces_bytes: int = 0  # cuBLAS workspaces in the snapshot at the failure
    cost_s: float = 0.0
    stage_s: dict[str, float] = field(default_factory=dict)


def with_counted_ooms(sample: Sample, counts: Mapping[int, int]) -> Sample:
    """``sample`` with each device's OOM count at least what gpumem_nb counted itself: the
    cudaMallocAsync backend leaves ``num_ooms`` at 0."""
    devices = []
    for d in sample.devices:
        n = counts.get(d.index, 0)
        if d.allocator is not None and n > d.allocator.num_ooms:
            d = replace(d, allocator=replace(d.allocator, num_ooms=n))
        devices.append(d)
    return replace(sample, devices=tuple(devices))
