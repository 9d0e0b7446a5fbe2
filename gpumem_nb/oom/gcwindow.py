"""Python's garbage collections after a failure, each measured (``gc.callbacks``).

PyTorch does not run Python's collector before it raises: tensors kept only by reference
cycles count against the failing request, and a later collection frees them. The retention
search names such cycles by their reference counts; this measures what collections actually
freed, from the failure until the end of the next cell: PyTorch's allocated bytes before and
after each collection. Memory that only a collection freed was garbage at the failure.

Armed only after a CUDA out-of-memory error (CUDA is up then: reading starts nothing), for a
bounded number of collections, and removed at the window's end and at unload.

Where the observer cannot be attached (cudaMallocAsync), nothing runs at the failure: the error
is explained at the cell's end, after IPython has shown its traceback, whose formatting
allocates enough to collect. ``WhileHandled`` stands for that stretch: installed while such a
backend is in use, it reads nothing unless a CUDA out-of-memory error is being handled on the
collecting thread (one ``sys.exc_info()`` per collection otherwise).
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["MAX_COLLECTIONS", "Collections", "WhileHandled", "collector_held", "frozen_objects"]

MAX_COLLECTIONS = 64  # two allocator reads each; past it, the window closes early


class _Measured:
    """A gc callback that measures collections: installed and removed once, never raising
    (an exception in a gc callback is printed as unraisable on every collection), never
    re-entered (a read that allocates may itself collect)."""

    def __init__(self, limit: int) -> None:
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

    def _count(self, before: int | None, now: int | None) -> None:
        self.collections += 1
        if before is not None and now is not None and before > now:
            self.freed_bytes += before - now
            self.freeing += 1

    def _reset(self) -> None:
        self.freed_bytes = self.collections = self.freeing = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if self._busy or self._closed:
            return
        self._busy = True
        try:
            self._measure(phase)
        except Exception:
            self.stop()
        finally:
            self._busy = False

    def _measure(self, phase: str) -> None:
        raise NotImplementedError


class Collections(_Measured):
    """One window of measured collections. ``read`` gives PyTorch's allocated bytes on the
    failing device (None where it cannot be read); it must not start CUDA."""

    def __init__(self, read: Callable[[], int | None], generation: int,
                 limit: int = MAX_COLLECTIONS) -> None:
        super().__init__(limit)
        self.read = read
        self.generation = generation  # the failing cell's

    def _measure(self, phase: str) -> None:
        now = self.read()
        if phase == "start":
            self._before = now
            return
        before, self._before = self._before, None
        self._count(before, now)
        if self.collections >= self.limit:
            self.stop()


class WhileHandled(_Measured):
    """Standing, for a backend the observer cannot see: the collections that run while a CUDA
    out-of-memory error is being handled (IPython shows its traceback inside its ``except``),
    each measured, until the explanation takes them. ``is_oom`` tells such an error (the one
    handled, or one it chains to); ``read(exc)`` gives PyTorch's allocated bytes on its
    device."""

    def __init__(self, read: Callable[[BaseException], int | None],
                 is_oom: Callable[[BaseException], bool],
                 limit: int = MAX_COLLECTIONS) -> None:
        super().__init__(limit)
        self.read = read
        self.is_oom = is_oom
        self._exc: BaseException | None = None  # the error whose handling is measured

    def stop(self) -> None:
        super().stop()
        self._exc = None

    def take(self, *errors: BaseException | None) -> tuple[int, int, int] | None:
        """(freed bytes, collections, collections that freed) while one of ``errors`` was
        handled, then forgotten; None where none of them was."""
        exc, self._exc = self._exc, None
        if exc is None or not any(exc is e for e in errors):
            return None
        out = (self.freed_bytes, self.collections, self.freeing)
        self._reset()
        return out

    def _measure(self, phase: str) -> None:
        if phase == "start":
            self._before = None
            exc = sys.exc_info()[1]
            if exc is None or (self.collections >= self.limit and exc is self._exc):
                return
            if exc is not self._exc:
                if not self.is_oom(exc):
                    return
                self._exc = exc
                self._reset()
            self._before = self.read(exc)
            return
        before, self._before = self._before, None
        exc = self._exc
        if before is None or exc is None:
            return
        self._count(before, self.read(exc))


class _Held:
    """How many threads hold the collector off, and whether it was on before the first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.was_enabled = False


_HELD = _Held()


@contextlib.contextmanager
def collector_held() -> Iterator[None]:
    """Python's collector off for a few reads, then as it was: it is the user's, and a
    collection deferred for a moment is run at the next threshold. The on/off state is the
    process's: two failures read at once on two threads hold it off together, and only the
    last to finish turns it back on (only if it was on before the first)."""
    with _HELD.lock:
        if _HELD.depth == 0:
            _HELD.was_enabled = gc.isenabled()
            gc.disable()
        _HELD.depth += 1
    try:
        yield
    finally:
        with _HELD.lock:
            _HELD.depth -= 1
            if _HELD.depth == 0 and _HELD.was_enabled:
                gc.enable()


# The permanent generation's size when gpumem_nb was imported: the interpreter's own, not a
# user's `gc.freeze()`. Python 3.12 reports a few hundred objects there with no freeze at all
# (375 on 3.12.1, and back after every collection even once unfrozen); on the H100 (Python
# 3.12) the OOM explanation named "the 375 objects frozen by gc.freeze()" as the likely holder.
_FREEZE_BASELINE = gc.get_freeze_count()


def frozen_objects() -> int:
    """Objects a ``gc.freeze()`` moved out of the collector's view since gpumem_nb was
    imported: the count beyond the interpreter's own."""
    return max(0, gc.get_freeze_count() - _FREEZE_BASELINE)
