"""What a snapshot's fields, or the user's words, may hold before the what-if uses them.

A snapshot file can come from anywhere: numbers are kept only when they fit what the
allocator records (a ``size_t``, a finite double), and text shown in a message has its
control characters escaped (a module name in a pickle can hold a newline or an ANSI escape)
and is cut (a 100,000-character path or setting must not come back whole).
"""

from __future__ import annotations

import math
from typing import Any, TypedDict

from ..units import printable

__all__ = ["SIZE_T_END", "Block", "Segment", "finite", "plain", "quoted", "uint"]

SIZE_T_END = 1 << 64  # addresses and sizes are size_t: anything larger is junk


def uint(v: Any) -> int | None:
    """``v`` if it is an int that fits a ``size_t``."""
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < SIZE_T_END else None


def finite(v: Any) -> float | None:
    """``v`` as a finite float (``1e400``, ``10**400`` and ``inf`` are no recorded time)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:  # an int too large for a double
        return None
    return f if math.isfinite(f) else None


def plain(text: str, limit: int = 120) -> str:
    """``text`` with every control character written as its escape, cut to ``limit``."""
    return printable(text[:limit]) + ("…" if len(text) > limit else "")


def quoted(text: str, limit: int = 60) -> str:
    """``text`` in quotes, as ``repr`` writes it, cut to ``limit`` characters."""
    return repr(text[:limit]) + ("…" if len(text) > limit else "")


class Block(TypedDict):
    """One block of a segment as the model reads it (``segments_of``)."""

    address: int
    size: int
    state: str


class Segment(TypedDict):
    """One segment as the model reads it: its numbers fit a ``size_t``, its blocks tile it."""

    device: int
    address: int
    total_size: int
    stream: int
    segment_type: str
    is_expandable: bool
    blocks: list[Block]
