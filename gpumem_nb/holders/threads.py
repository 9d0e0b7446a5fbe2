"""Live threads' frames: roots the garbage collector's traversal cannot see.

A running frame's locals are not traversed by the collector (CPython visits a frame's locals
only once the frame object owns them: a finished frame, a suspended generator's). So a
background thread whose loop keeps tensors in a local list holds them where no referrer
search reaches. Each other thread's frames are read here, as the thread's roots, named by
the thread's name, the function and the local.

Reading ``f_locals`` of a running frame on Python <= 3.12 stores a snapshot dict on the
frame, which would keep those locals alive after the thread rebinds them, until the frame
ends. The snapshot is emptied right after it is read; the frame repopulates it whenever
anything asks for its locals again. From 3.13 (PEP 667) ``f_locals`` is a proxy that keeps
nothing.
"""

from __future__ import annotations

import re
import sys
import threading
from typing import Any

from .retention import ROOT_THREAD, Root

__all__ = ["FRAMES_CAP", "thread_locals"]

_SNAPSHOT = sys.version_info < (3, 13)
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FRAMES_CAP = 200  # frames read per thread, from the innermost


def thread_locals(exclude: set[int] | None = None) -> dict[int, Root]:
    """id(value) -> the root naming it, for every local of every other live thread's frames
    (the calling thread's are the running computation, not a holder)."""
    me = threading.get_ident()
    skip = exclude or set()
    names = {t.ident: t.name for t in threading.enumerate()}
    out: dict[int, Root] = {}
    frames = sys._current_frames()
    try:
        for ident, top in frames.items():
            if ident == me or ident in skip:
                continue
            thread = names.get(ident, f"thread {ident}")
            f: Any = top
            n = 0
            while f is not None and n < FRAMES_CAP:
                _read(f, thread, out)
                f = f.f_back
                n += 1
    finally:
        frames.clear()
    return out


def _read(frame: Any, thread: str, out: dict[int, Root]) -> None:
    code = frame.f_code
    if code.co_filename.endswith(("threading.py", "selectors.py", "queue.py")):
        return  # the thread machinery's own frames: `self`, the target, the lock
    try:
        local = frame.f_locals
        items = list(dict.items(local)) if type(local) is dict else list(local.items())
        if _SNAPSHOT and type(local) is dict:
            local.clear()
    except Exception:
        return
    for name, value in items:
        if type(name) is not str:
            continue
        out.setdefault(id(value), Root(
            ROOT_THREAD, f"thread '{thread}': {code.co_name}() local {name}"))
    items.clear()
