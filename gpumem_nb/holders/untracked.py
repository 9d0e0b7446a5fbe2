"""Containers the garbage collector does not track but that can hold tensors: numpy object
arrays (numpy traverses neither their items nor a view's base) and the dicts and tuples of
untracked objects that hold them. Found once per search, in chunks within its deadline, and
read by identity as explicit edges. ``Search`` mixes in ``UntrackedPass``."""

from __future__ import annotations

import gc
import operator
from collections.abc import Callable
from itertools import compress, repeat
from typing import Any

from .edges import EdgeReader
from .pathtext import _Step
from .reading import static_attribute

# Levels at which objects with no tracked referrer are looked for in untracked containers
# (an object array inside an untracked dict inside a namespace is three).
_UNTRACKED_LEVELS = 4
# The heap is looked through for untracked containers this many objects at a time, the search's
# clock read between them: one pass over 5,000,000 objects in one call took 2.6 s of a
# cleanup's 0.5 s search (and 4.2 s of its 4.2 s) on the 2-core machine.
UNTRACKED_CHUNK = 1 << 16


class UntrackedPass(EdgeReader):
    """The untracked containers, for ``Search``: found once per search (``_untracked_cache``),
    within its deadline; ``_untracked_cut`` says what the pass did not read when that cut it."""

    numpy: Any
    clock: Callable[[], float]
    budget_s: float
    _scaffold: set[int]
    _deadline: float
    _untracked_cache: list[Any] | None
    _untracked_cut: str

    def _untracked(self, heap: list[Any] | None) -> list[Any]:
        """Containers the collector does not track but that can hold tensors: numpy object
        arrays (numpy does not traverse their items) and the dicts, lists and tuples that
        hold them (a dict or tuple of untracked objects is itself untracked). Found
        among what tracked objects refer to, three levels of such nesting down, once per
        search, filtered by C-level maps (no Python call per object).

        Read ``UNTRACKED_CHUNK`` objects (and referents) at a time until the search's
        deadline, at least one slice: when it cuts the pass, ``_untracked_cut`` says how much
        of the heap was not looked through, and what only a container there holds is "not
        searched"."""
        if self._untracked_cache is not None:
            return self._untracked_cache
        objs = heap if heap is not None else gc.get_objects()
        out: list[Any] = []
        self._scaffold.add(id(out))
        total, read = len(objs), 0
        first = True
        try:
            for start in range(0, total, UNTRACKED_CHUNK):
                chunk = objs[start:start + UNTRACKED_CHUNK]
                n = len(chunk)
                # What the chunk refers to, read in slices too: one dict of 5,000,000
                # entries has 10,000,000 referents.
                refs = gc.get_referents(*chunk)
                chunk.clear()
                for i in range(0, len(refs), UNTRACKED_CHUNK):
                    if not first and self.clock() > self._deadline:
                        break
                    first = False
                    self._untracked_in(refs[i:i + UNTRACKED_CHUNK], out)
                else:
                    read += n
                refs.clear()
                if read < start + n:
                    break
        finally:
            if heap is None:
                objs.clear()
        if read < total:
            self._untracked_cut = _untracked_cut_words(self.budget_s, read, total)
        self._untracked_cache = out
        return out

    def _untracked_in(self, level: list[Any], out: list[Any]) -> None:
        """The untracked containers among ``level`` (what tracked objects refer to) and,
        three levels down, among what those refer to, added to ``out``; ``level`` is
        emptied. A class no object of a level has costs no pass over that level."""
        ndarray = getattr(self.numpy, "ndarray", None)
        is_ = operator.is_
        for _ in range(3):
            # Classes compared by identity (``is``, their ids): no hash or ``__eq__`` of a
            # metaclass runs.
            kinds = list(map(type, level))
            present = set(map(id, kinds))
            if ndarray is not None and id(ndarray) in present:
                for arr in compress(level, map(is_, kinds, repeat(ndarray))):
                    out.extend(_object_arrays(arr, ndarray))
            untracked: list[Any] = []
            # Lists are always tracked; a dict or tuple of untracked objects is not.
            for box in (dict, tuple):
                if id(box) not in present:
                    continue
                found = list(compress(level, map(is_, kinds, repeat(box))))
                untracked.extend(compress(found, map(operator.not_, map(gc.is_tracked, found))))
                found.clear()
            kinds.clear()
            level.clear()
            if not untracked:
                break
            out.extend(untracked)
            level = gc.get_referents(*untracked)
            untracked.clear()
        level.clear()

    def _array_edges(self, orphans: list[Any],
                     heap: list[Any] | None) -> list[tuple[Any, _Step, Any]]:
        """(container, step, orphan) for each untracked container that holds one of these
        objects, its items compared by identity."""
        wanted = {id(o) for o in orphans}
        ndarray = getattr(self.numpy, "ndarray", None)
        out: list[tuple[Any, _Step, Any]] = []
        referents = gc.get_referents
        boxes = self._untracked(heap)
        items = referents(*boxes)
        held = not wanted.isdisjoint(map(id, items))
        items.clear()
        for c in boxes:
            if type(c) is not ndarray and not held:
                continue
            try:
                if type(c) is ndarray:
                    base = _ARRAY_BASE.get(ndarray)
                    b = base.__get__(c, ndarray) if base is not None else None
                    if b is not None and id(b) in wanted:
                        # A view keeps its base array, and the base all its items: numpy
                        # traverses neither, so `row = grid[2]` kept 44 GiB unfound.
                        out.append((c, _Step("attr", "base"), b))
                    if c.size >= 10_000_000:
                        continue
                    shape = tuple(c.shape)
                    for i, v in enumerate(c.ravel(order="C").tolist()):
                        if id(v) in wanted:
                            out.append((c, _Step("index", _unravel(i, shape)), v))
                elif not wanted.isdisjoint(map(id, referents(c))):
                    out.extend((c, step, v) for v, step in self._edges(c, wanted))
            except Exception:
                continue
        return out


# numpy's ``ndarray.base`` descriptor, per ndarray class (read through it: no subclass code).
_ARRAY_BASE: dict[Any, Any] = {}


def _object_arrays(arr: Any, ndarray: Any) -> list[Any]:
    """``arr`` and the arrays it is a view of (``.base``, down the chain), those that hold
    Python objects: numpy traverses neither a view's base nor an object array's items, so a
    base reached only through a view is found here or nowhere."""
    base = _ARRAY_BASE.get(ndarray)
    if base is None:
        base = _ARRAY_BASE[ndarray] = static_attribute(ndarray, "base")
    out: list[Any] = []
    seen: set[int] = set()
    a: Any = arr
    while type(a) is ndarray and id(a) not in seen and len(seen) < 64:
        seen.add(id(a))
        try:
            if a.dtype.hasobject:
                out.append(a)
            a = base.__get__(a, ndarray)
        except Exception:
            break
    return out


def _unravel(i: int, shape: tuple[int, ...]) -> str:
    if len(shape) <= 1:
        return str(i)
    idx = []
    for n in reversed(shape):
        idx.append(i % n if n else 0)
        i = i // n if n else 0
    return ", ".join(str(x) for x in reversed(idx))


def _untracked_cut_words(budget_s: float, read: int, total: int) -> str:
    """What the untracked pass did not look through, when the budget cut it ("not
    searched", as every cut is said)."""
    where = (f"after {read:,} of the {total:,} objects it tracks; what only a container among "
             f"the other {total - read:,} holds" if read else
             f"before it had read any of the {total:,} objects it tracks in full; what only "
             "such a container holds")
    return (f"the search's {budget_s:g} s budget ran out while it looked for containers the "
            f"garbage collector does not track, {where} was not searched")
