"""Python's garbage collections after a failure, each measured (``gc.callbacks``).

PyTorch does not run Python's collector before it raises: tensors kept only by reference
cycles count against the failing request, and a later collection frees them. The retention
search names such cycles by their reference counts; this measures what collections actually
freed, from the failure until the end of the next cell: PyTorch's allocated bytes before and
after each collection. Memory that only a collection freed was garbage at the failure.

Armed only after a CUDA out-of-memory error (CUDA is up then: reading starts nothing), for a
bounded number of collections, and removed at the window's end and at unload.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

MAX_COLLECTIONS = 64  # two allocator reads each; past it, the window closes early


class Collections:
    """One window of measured collections. ``read`` gives PyTorch's allocated bytes on the
    failing device (None where it cannot be read); it must not start CUDA."""

    def __init__(self, read: Callable[[], int | None], generation: int,
                 limit: int = MAX_COLLECTIONS) -> None:
        self.read = read
        self.generation = generation  # the failing cell's
        self.limit = limit
        self.freed_bytes = 0
        self.collections = 0
        self.freeing = 0  # collections that freed CUDA memory
        self._before: int | None = None
        self._busy = False
        self._closed = False

    def start(self) -> None:
        if not self._closed and self not in gc.callbacks:
            gc.callbacks.append(self)

    def stop(self) -> None:
        self._closed = True
        while self in gc.callbacks:
            gc.callbacks.remove(self)

    @property
    def open(self) -> bool:
        return not self._closed

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        # Never raises (an exception in a gc callback is printed as unraisable on every
        # collection), never re-enters (a read that allocates may itself collect).
        if self._busy or self._closed:
            return
        self._busy = True
        try:
            now = self.read()
            if phase == "start":
                self._before = now
                return
            before, self._before = self._before, None
            self.collections += 1
            if before is not None and now is not None and before > now:
                self.freed_bytes += before - now
                self.freeing += 1
            if self.collections >= self.limit:
                self.stop()
        except Exception:
            self.stop()
        finally:
            self._busy = False
