"""Containers the garbage collector does not track but that can hold tensors: numpy object
arrays (numpy traverses neither their items nor a view's base) and the dicts and tuples of
untracked objects that hold them. Found once per search, in chunks within its deadline, and
read by identity as explicit edges. ``Search`` mixes in ``UntrackedPass``."""

from __future__ import annotations

import gc
import operator
from collections.abc import Callable, Iterator
from itertools import compress, islice, repeat
from typing import Any

from ..referents import referents
from .edges import EdgeReader
from .pathtext import _Step
from .reading import static_attribute

__all__ = ["UNTRACKED_CHUNK", "UntrackedPass"]

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
    _unread: int

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
        self._unread = 0
        try:
            for start in range(0, total, UNTRACKED_CHUNK):
                chunk = objs[start:start + UNTRACKED_CHUNK]
                n = len(chunk)
                # What the chunk refers to, read in slices too: one dict of 5,000,000
                # entries has 10,000,000 referents.
                refs = referents(*chunk)
                chunk.clear()
                for i in range(0, len(refs), UNTRACKED_CHUNK):
                    if not first and self.clock() > self._deadline:
                        break
                    first = False
                    if not self._untracked_in(refs[i:i + UNTRACKED_CHUNK], out):
                        break
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

    def _untracked_in(self, level: list[Any], out: list[Any], depth: int = 3) -> bool:
        """The untracked containers among ``level`` (what tracked objects refer to) and,
        ``depth`` levels down, among what those refer to, added to ``out``; ``level`` is
        emptied. A class no object of a level has costs no pass over that level.

        Each level is read ``UNTRACKED_CHUNK`` objects at a time, the search's clock read
        after each such amount (``_spent``): one untracked tuple of 5,000,000 items, or dict
        of 3,000,000 atoms, took 0.6-0.85 s of CPU in one read. False when the clock ran out
        before all of it was read (what was found stays in ``out``)."""
        ndarray = getattr(self.numpy, "ndarray", None)
        is_ = operator.is_
        try:
            for start in range(0, len(level), UNTRACKED_CHUNK):
                part = level[start:start + UNTRACKED_CHUNK]
                # Classes compared by identity (``is``, their ids): no hash or ``__eq__`` of
                # a metaclass runs.
                kinds = list(map(type, part))
                present = set(map(id, kinds))
                if ndarray is not None and id(ndarray) in present:
                    for arr in compress(part, map(is_, kinds, repeat(ndarray))):
                        out.extend(_object_arrays(arr, ndarray))
                untracked: list[Any] = []
                # Lists are always tracked; a dict or tuple of untracked objects is not.
                for box in (dict, tuple):
                    if id(box) not in present:
                        continue
                    found = list(compress(part, map(is_, kinds, repeat(box))))
                    untracked.extend(compress(found,
                                              map(operator.not_, map(gc.is_tracked, found))))
                    found.clear()
                kinds.clear()
                out.extend(untracked)
                if depth > 1:
                    for below in _referent_slices(untracked, UNTRACKED_CHUNK):
                        if not self._untracked_in(below, out, depth - 1):
                            return False
                untracked.clear()
                if self._spent(len(part)):
                    return False
        finally:
            level.clear()
        return True


    def _spent(self, n: int) -> bool:
        """``n`` more objects read by the untracked pass: True when the search's clock, read
        once every ``UNTRACKED_CHUNK`` objects, says its budget ran out."""
        self._unread += n
        if self._unread < UNTRACKED_CHUNK:
            return False
        self._unread = 0
        return self.clock() > self._deadline

    def _array_edges(self, orphans: list[Any],
                     heap: list[Any] | None) -> list[tuple[Any, _Step, Any]]:
        """(container, step, orphan) for each untracked container that holds one of these
        objects, its items compared by identity.

        Read ``UNTRACKED_CHUNK`` items at a time, the search's clock read between (``_spent``):
        four object arrays of 2,000,000 items took 0.5 s of CPU in one go. When the clock
        cuts it, ``_untracked_cut`` says how many containers were not looked through."""
        wanted = {id(o) for o in orphans}
        ndarray = getattr(self.numpy, "ndarray", None)
        out: list[tuple[Any, _Step, Any]] = []
        boxes = self._untracked(heap)
        self._unread = 0
        done = 0
        try:
            # The dicts and tuples are looked into one by one only when one of them holds an
            # orphan (rare): first all of them at once, a slice at a time.
            held = self._holds([c for c in boxes if type(c) is not ndarray], wanted)
            for i, c in enumerate(boxes):
                done = i
                if type(c) is not ndarray and not held:
                    continue
                try:
                    if type(c) is ndarray:
                        self._items_of(c, ndarray, wanted, out)
                    elif self._holds([c], wanted):
                        out.extend((c, st, v) for v, st in self._edges(c, wanted))
                except _OutOfTime:
                    raise
                except Exception:
                    continue
        except _OutOfTime:
            if not self._untracked_cut:
                self._untracked_cut = _untracked_cut_words(
                    self.budget_s, done, len(boxes), of="untracked containers it found")
        return out


    def _holds(self, boxes: list[Any], wanted: set[int]) -> bool:
        """Whether these untracked dicts and tuples refer to a wanted object, read a slice at
        a time; ``_OutOfTime`` when the clock ran out."""
        held = False
        for items in _referent_slices(boxes, UNTRACKED_CHUNK):
            held = held or not wanted.isdisjoint(map(id, items))
            n = len(items)
            items.clear()
            if self._spent(n):
                raise _OutOfTime
        return held


    def _items_of(self, arr: Any, ndarray: Any, wanted: set[int],
                  out: list[tuple[Any, _Step, Any]]) -> None:
        """The edges from one object array (and its base) to the wanted objects, its items
        read ``UNTRACKED_CHUNK`` at a time; ``_OutOfTime`` when the clock ran out."""
        base = _ARRAY_BASE.get(ndarray)
        b = base.__get__(arr, ndarray) if base is not None else None
        if b is not None and id(b) in wanted:
            # A view keeps its base array, and the base all its items: numpy traverses
            # neither, so `row = grid[2]` kept 44 GiB unfound.
            out.append((arr, _Step("attr", "base"), b))
        if arr.size >= 10_000_000:
            return
        shape = tuple(arr.shape)
        flat = arr.ravel(order="C")
        step = UNTRACKED_CHUNK
        for at in range(0, len(flat), step):
            items = flat[at:at + step].tolist()
            for i, v in enumerate(items, at):
                if id(v) in wanted:
                    out.append((arr, _Step("index", _unravel(i, shape)), v))
            n = len(items)
            items.clear()
            if self._spent(n):
                raise _OutOfTime


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


class _OutOfTime(Exception):
    """The search's clock ran out in the middle of one untracked container."""


def _referent_slices(boxes: list[Any], n: int) -> Iterator[list[Any]]:
    """What these untracked dicts and tuples (of exactly those types: no user code runs)
    refer to, about ``n`` objects at a time: small ones together in one C call, one of
    millions of items a slice at a time (its one ``gc.get_referents`` took 50-60 ms)."""
    small: list[Any] = []
    size = 0
    for c in boxes:
        k = len(c)
        if k <= n:
            small.append(c)
            size += 2 * k if type(c) is dict else k
            if size >= n:
                yield referents(*small)
                small.clear()
                size = 0
        elif type(c) is tuple:
            for at in range(0, k, n):
                yield list(c[at:at + n])
        else:
            keys, values = iter(dict.keys(c)), iter(dict.values(c))
            try:
                while part := list(islice(keys, n)):
                    yield part
                    yield list(islice(values, n))
            except RuntimeError:  # changed while it was read (another thread): all at once
                yield referents(c)
    if small:
        yield referents(*small)


def _untracked_cut_words(budget_s: float, read: int, total: int,
                         of: str = "objects it tracks") -> str:
    """What the untracked pass did not look through, when the budget cut it ("not
    searched", as every cut is said)."""
    where = (f"after {read:,} of the {total:,} {of}; what only a container among "
             f"the other {total - read:,} holds" if read else
             f"before it had read any of the {total:,} {of} in full; what only "
             "such a container holds")
    return (f"the search's {budget_s:g} s budget ran out while it looked for containers the "
            f"garbage collector does not track, {where} was not searched")
