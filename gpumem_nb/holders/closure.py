"""A level of the retention search without a pass over the heap, where reference counts prove
it complete.

Each level of the search up from a storage asks who refers to its frontier: one
``gc.get_referrers`` pass over every object the collector tracks (30 ms at 300,000 objects on
the development machine, under load 100). A cut's dry run climbs through the objects around
what it deletes, which mostly refer to each other: an event loop's selector, its keys, their
handles, each found one level (one heap pass) after the last. On the H100, `del flush_loop`
needed 14 levels and its check's 0.3 s ran out, so the advice went out unchecked and freed 0.

Those referrers are mostly near objects the search has entered already. So the objects those
reach down (``gc.get_referents``, C code: no user code runs) within a few steps are tried
first: where, for every frontier object, the references from them account for its whole
reference count, they are all of its referrers, and the level needs no heap pass. Where any
reference is left unexplained (a root's dict, C code, an object not among them), the caller
makes the heap pass as before: the proof can only fail towards the slow path.
"""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Container, Iterable, Mapping
from typing import Any

from ..referents import referents

__all__ = ["DEPTH", "NEAR_CAP", "local_referrers"]

# Not followed down: a module or a class reaches a library's whole state.
_NOT_FOLLOWED = (types.ModuleType, type)

DEPTH = 32  # steps down from the entered objects (a chain of parts of one object)
NEAR_CAP = 2_000  # objects looked at (4 ms under load); beyond, the heap pass decides


def local_referrers(frontier: list[Any], seeds: Iterable[Any], held: Mapping[int, int],
                    also: Iterable[Any] = (), stop: Container[int] = ()) -> list[Any] | None:
    """Every referrer of each object of ``frontier`` (a list that holds each once), found among
    ``also`` and what ``seeds`` reach down within ``DEPTH`` steps, or None where reference
    counts do not prove that list complete.

    ``held``: the references the caller holds to objects, by id (its own records of the
    objects it entered); ``seeds`` must hold none (an iterator over those records).
    ``also``: objects whose references count but which are not followed down (the namespace
    a cut edits: it reaches every variable). ``stop``: ids of
    objects not followed down either (roots: a module's globals); nor are modules and
    classes, which reach a library's whole state."""
    wanted = {id(o): 0 for o in frontier}
    if not wanted or len(wanted) != len(frontier):
        return None
    near: list[Any] = [a for a in also if gc.is_tracked(a)]
    seen: set[int] = {id(a) for a in near}
    level = [s for s in seeds if gc.is_tracked(s)]
    try:
        for _ in range(DEPTH + 1):
            nxt: list[Any] = []
            for x in level:
                if id(x) in seen:
                    continue
                seen.add(id(x))
                near.append(x)
                if len(near) >= NEAR_CAP:
                    break  # what was not reached is not among them: the counts will say
                # By its real type: ``isinstance`` would ask a proxy's ``__class__``.
                if id(x) in stop or issubclass(type(x), _NOT_FOLLOWED):
                    continue
                nxt.extend(c for c in referents(x) if gc.is_tracked(c))
            if len(near) >= NEAR_CAP:
                nxt.clear()
            level.clear()
            level = nxt
            if not level:
                break
        level.clear()
        found: list[Any] = []
        found_ids: set[int] = set()
        for x in near:
            refers = False
            for c in referents(x):
                n = wanted.get(id(c))
                if n is not None:
                    wanted[id(c)] = n + 1
                    refers = True
            if refers:
                found.append(x)
                found_ids.add(id(x))
        c = x = None
        for i in range(len(frontier)):
            oid = id(frontier[i])
            # getrefcount's argument and the frontier list's slot; ``near`` and ``found``
            # where the object is in them; the caller's own record where it has one.
            own = 2 + (oid in seen) + (oid in found_ids) + held.get(oid, 0)
            if sys.getrefcount(frontier[i]) - own != wanted[oid]:
                found.clear()
                return None
        return found
    finally:
        near.clear()
        level.clear()
