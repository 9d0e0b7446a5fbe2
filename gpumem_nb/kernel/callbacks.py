"""The user's per-cell callbacks (``gpumem_nb.on_cell``): each cell's record, handed on.

For logging each cell's figures to W&B, TensorBoard or MLflow without the extension depending
on any of them. A callback runs once per recorded top-level cell, a moment after the cell ends
(usually on the sampler's thread, in the cell's output context, so what it prints lands under
that cell). One that raises is contained: the first failure is reported as one line, later ones
are only counted on its handle, and it stays registered. The callbacks belong to one loaded
extension and go with it at unload.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .. import userexc
from ..model import CellRecord
from .contain import log

__all__ = ["CellCallback", "CellCallbacks"]


class CellCallback:
    """The handle ``on_cell`` returns: ``remove()`` stops the calls. Also a context manager,
    which removes the callback on exit."""

    def __init__(self, owner: CellCallbacks, fn: Callable[[CellRecord], Any]) -> None:
        self._owner = owner
        self.fn = fn
        self.calls = 0
        self.failures = 0
        self.last_error = ""  # "ValueError: ..." of the latest failure; "" when none

    @property
    def active(self) -> bool:
        return self._owner.holds(self)

    def remove(self) -> None:
        """Stop calling the callback; removing it twice is harmless."""
        self._owner.remove(self)

    def __enter__(self) -> CellCallback:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", None) or repr(self.fn)
        state = "active" if self.active else "removed"
        return (f"<gpumem_nb cell callback {name}: {state}, {self.calls} calls, "
                f"{self.failures} failed>")


class CellCallbacks:
    """The callbacks of one monitor, in the order they were added."""

    def __init__(self) -> None:
        self._handles: list[CellCallback] = []
        self._lock = threading.Lock()

    def add(self, fn: Callable[[CellRecord], Any]) -> CellCallback:
        if not callable(fn):
            raise TypeError(f"on_cell takes a function of one argument (the cell's record), "
                            f"not {type(fn).__name__}")
        handle = CellCallback(self, fn)
        with self._lock:
            self._handles.append(handle)
        return handle

    def remove(self, handle: CellCallback) -> None:
        with self._lock:
            if handle in self._handles:
                self._handles.remove(handle)

    def holds(self, handle: CellCallback) -> bool:
        with self._lock:
            return handle in self._handles

    def clear(self) -> None:
        with self._lock:
            self._handles.clear()

    def __len__(self) -> int:
        return len(self._handles)

    def dispatch(self, record: CellRecord) -> None:
        """Hand ``record`` to every callback; never raises."""
        with self._lock:
            handles = list(self._handles)
        for handle in handles:
            handle.calls += 1
            try:
                handle.fn(record)
            except BaseException as e:  # the user's code: nothing of it reaches the hooks
                handle.failures += 1
                handle.last_error = f"{userexc.type_name(e)}: {userexc.text(e)}"
                if handle.failures == 1:
                    name = getattr(handle.fn, "__qualname__", None) or "callback"
                    log.warning("gpumem_nb: the on_cell callback %s raised %s (reported once; "
                                "it stays registered, and its handle counts failures)",
                                name, handle.last_error)
