"""Host memory of this process (resident set size).

On Linux the figure comes from ``/proc/self/statm`` through a descriptor kept open, which
costs about a microsecond; psutil (about 15 µs a call, most of it opening the file) is the
fallback elsewhere. Both run twice per cell, so the difference is on the hot path.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Any

__all__ = ["HostSource", "release_free_heap"]


def release_free_heap() -> bool:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``), so that
    memory allocated afterwards shows in the RSS even where it reuses what was freed
    earlier. False where the C library has no such call (macOS, musl, Windows).

    Without it an RSS reading undercounts growth by whatever the process freed before and
    kept resident: a kernel that has run many cells reuses those pages without the RSS
    moving. It walks the heap once (milliseconds), so it is for a one-off guard, never a
    hot path."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True


class HostSource:
    """Reads this process's RSS; ``None`` if no method works."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._page_bytes = 4096
        self._proc: Any = None
        try:
            self._fd = os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            self._page_bytes = os.sysconf("SC_PAGE_SIZE")
        except (OSError, AttributeError, ValueError):
            self._fd = None
            try:
                import psutil

                self._proc = psutil.Process()
            except Exception:
                self._proc = None

    def rss_bytes(self) -> int | None:
        if self._fd is not None:
            try:
                return int(os.pread(self._fd, 128, 0).split()[1]) * self._page_bytes
            except (OSError, IndexError, ValueError):
                return None
        if self._proc is not None:
            try:
                return int(self._proc.memory_info().rss)
            except Exception:
                return None
        return None

    def close(self) -> None:
        """Close the descriptor; later reads give None (the number may already be another
        file's, so it is forgotten before it is closed)."""
        fd, self._fd = self._fd, None
        self._proc = None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self.close()
