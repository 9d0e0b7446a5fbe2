"""The caching allocator's constants and sizing rules, named as in
``c10/cuda/CUDACachingAllocator.cpp`` so the two can be read side by side.

Pure functions of a request's size and the settings; the block bookkeeping that uses them
is ``allocator.py``.
"""

from __future__ import annotations

__all__ = [
    "SIZE_MAX",
    "get_allocation_size",
    "kLargeBuffer",
    "kMB",
    "kMinBlockSize",
    "kMinLargeAlloc",
    "kRoundLarge",
    "kRoundUpPowerOfTwoIntervals",
    "kRoundUpPowerOfTwoStart",
    "kSmallBuffer",
    "kSmallSize",
    "round_size",
    "roundup_power2_divisions",
    "roundup_power2_next_division",
    "should_split",
]

kMB = 1 << 20
kMinBlockSize = 512  # all sizes are rounded to at least 512 bytes
kSmallSize = 1 << 20  # largest "small" allocation is 1 MiB
kSmallBuffer = 2 << 20  # "small" allocations are packed in 2 MiB blocks
kMinLargeAlloc = 10 << 20  # allocations between 1 and 10 MiB may use kLargeBuffer
kRoundLarge = 2 << 20  # round up large allocations to 2 MiB
kLargeBuffer = 20 << 20  # "large" allocations may be packed in 20 MiB blocks
# AllocatorConfig.cpp: roundup_power2_divisions has one value per power of two from 1 MiB
# to 64 GiB.
kRoundUpPowerOfTwoIntervals = 16
kRoundUpPowerOfTwoStart = 1 << 20
SIZE_MAX = (1 << 64) - 1  # max_split_size when unset: nothing is "oversize"
# ExpandableSegment reserves address space for 1 1/8 of the GPU's memory.
EXPANDABLE_ADDRESS_SPACE_NUM, EXPANDABLE_ADDRESS_SPACE_DEN = 9, 8


def roundup_power2_divisions(size: int, table: tuple[int, ...]) -> int:
    """``AcceleratorAllocatorConfig::roundup_power2_divisions``: the divisions for the
    power-of-two interval holding ``size``."""
    log_size = size.bit_length() - 1
    start = kRoundUpPowerOfTwoStart.bit_length() - 1
    index = log_size - start if log_size > start else 0
    return table[min(index, kRoundUpPowerOfTwoIntervals - 1)]


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """Round ``size`` up to the next of ``divisions`` equal steps between the powers of two
    around it (1200 with 4 divisions: 1024, 1280, 1536, 1792 -> 1280)."""
    if size & (size - 1) == 0:
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    power2_division = power2_floor >> (divisions.bit_length() - 1)
    if power2_division == 0:
        return power2_floor << 1
    round_size_floor = size & ~(power2_division - 1)
    return size if round_size_floor == size else round_size_floor + power2_division


def round_size(size: int, table: tuple[int, ...]) -> int:
    if size < kMinBlockSize:
        return kMinBlockSize
    divisions = roundup_power2_divisions(size, table)
    # size_t arithmetic: from 2**55 divisions on, kMinBlockSize * divisions wraps to 0.
    if divisions > 1 and size > (kMinBlockSize * divisions) & SIZE_MAX:
        return roundup_power2_next_division(size, divisions)
    return kMinBlockSize * ((size + kMinBlockSize - 1) // kMinBlockSize)


def get_allocation_size(size: int, large_segment_size: int = kLargeBuffer) -> int:
    """The segment a request of ``size`` (already rounded) gets when nothing cached fits."""
    if size <= kSmallSize:
        return kSmallBuffer
    if size < kMinLargeAlloc:
        return large_segment_size
    return kRoundLarge * ((size + kRoundLarge - 1) // kRoundLarge)


def should_split(block_size: int, size: int, *, small: bool, expandable_active: bool,
                 max_split_size: int) -> bool:
    """Whether the rest of a reused block becomes a free block of its own."""
    remaining = block_size - size
    if small or expandable_active:
        return remaining >= kMinBlockSize
    return size < max_split_size and remaining > kSmallSize
