"""A history entry as torch writes it: the checks that tell one from anything else a user's
recording, or a future torch, may hold (such entries are skipped and counted).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = []


class _Malformed(Exception):
    """A history entry this analysis cannot read: skipped and counted."""


# Bounds on what a history entry's numbers can be: a size or an address fits in 64 bits, a
# time in microseconds since the epoch in 63, a line number in 9 digits. Beyond them a value
# is not torch's (10**400 overflowed float division, 10**5000 Python's int-to-text limit).
_MAX_FIELD = 1 << 64
_MAX_LINE = 10**9
_MAX_TIME_US = 1e17  # the year 5138: a later time is no clock's (1e18 gave absurd durations)


def _plain(obj: Any) -> dict[str, Any] | None:
    """A history entry or frame as a plain dict (a mapping whose own methods raise, or that
    is not a mapping, is None): read through dict's own methods from here on."""
    if type(obj) is dict:
        return obj
    if not isinstance(obj, Mapping):
        return None
    try:
        return dict(obj)
    except Exception:
        return None


def _usable(e: Any) -> dict[str, Any] | None:
    """The entry as a plain dict when its own fields are what torch writes (its frames are
    checked where they are read); None otherwise. A user's own recording, or a future torch,
    may hold others."""
    e = _plain(e)
    if e is None or not isinstance(e.get("action"), str):
        return None
    t = e.get("time_us")
    if t is not None and (not _finite(t) or not 0 <= t < _MAX_TIME_US):
        return None
    size = e.get("size", 0)
    if not _count(size):
        return None
    addr = e.get("addr")
    return e if addr is None or _count(addr) else None


def _count(v: Any) -> bool:
    """A non-negative int of at most 64 bits (not a bool)."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _MAX_FIELD


def _finite(v: Any) -> bool:
    """A number that converts to a finite float (a huge int would overflow)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return -_MAX_FIELD < v < _MAX_FIELD if isinstance(v, int) else math.isfinite(v)


def _as_list(entries: Any) -> list[Any]:
    """A device's trace as a list; anything that is not a list of entries reads as none."""
    if isinstance(entries, list | tuple):
        return list(entries)
    return []
