"""Reading objects without running their code: a class's name and attributes through
``type``'s own C descriptors, and the frames running now. The ground every holder search
stands on."""

from __future__ import annotations

import sys
import types
from typing import Any

__all__ = ["MISSING", "UNDERS", "running_frame_ids", "static_attribute", "type_name"]

_TYPE_MRO = type.__dict__["__mro__"]
_TYPE_DICT = type.__dict__["__dict__"]
_TYPE_NAME = type.__dict__["__name__"]
MISSING = object()
# The output cache's last three results, as IPython names them.
UNDERS = ("_", "__", "___")


def type_name(t: Any) -> str:
    """A class's ``__name__`` without its metaclass's code; "?" where it has none."""
    try:
        name = _TYPE_NAME.__get__(t)
    except Exception:
        return "?"
    return name if type(name) is str else "?"


def static_attribute(t: Any, name: str) -> Any:
    """What ``name`` is in the class's own dictionaries, along its MRO, found without running
    any code of the class or its metaclass; ``MISSING`` where none defines it."""
    try:
        for klass in _TYPE_MRO.__get__(t):
            ns = _TYPE_DICT.__get__(klass)
            if name in ns:
                return ns[name]
    except Exception:
        pass
    return MISSING


def running_frame_ids() -> set[int]:
    """Frames executing now, on every thread."""
    ids: set[int] = set()
    tops: list[types.FrameType | None] = [sys._getframe(), *sys._current_frames().values()]
    f: types.FrameType | None = None
    try:
        for top in tops:
            f = top
            while f is not None and id(f) not in ids:
                ids.add(id(f))
                f = f.f_back
    finally:
        # This frame is among ``tops``: left in its locals it would refer to itself, a cycle
        # that outlives the call, and a finished frame keeps its caller's frame (``f_back``),
        # which keeps the next, up the whole stack. Called from the OOM observer, that stack
        # runs through the user's failing function: its tensors then survived the user's own
        # ``del`` until the garbage collector ran (tutorial 04 on Python 3.12).
        tops.clear()
        f = top = None
    return ids
