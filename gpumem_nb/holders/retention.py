"""The retention graph: from live tensors up to the references a user can act on.

The fast scan (``scan.py``) walks down from the names a user sees and finds what its reaches
enumerate. This search starts from the truth instead: the tensors themselves, found among the
objects the garbage collector tracks, and walks *up* their referrers, level by level, until
every path ends at a root:

- the notebook's variables, the output cache, a stored exception (the shell's own records);
- a module's globals, a class's attributes (a class is reached through its module);
- a live thread's frame locals (``threads.py``: frames the collector cannot see into);
- none at all: the tensor is in reference cycles that nothing reaches (garbage the collector
  has not collected yet), or something Python cannot see keeps a reference to it (a running
  frame, a C extension), said as such.

Edges come from the collector's own traversal (``gc.get_referrers``/``get_referents``: C code,
no user code runs). Where that traversal is blind, explicit edges are added: numpy object
arrays (a data frame's object column), live threads' frames, and a tensor's own ``__dict__``
(PyTorch's ``tp_traverse`` visits nothing of a tensor whose C++ object has another owner, so
``x.meta = {'source': x}`` made a cycle whose dict no referrer search reached). An object and
its own ``__dict__`` count as one node: the dict may be made mid-search (reading it makes a
dict of values the object held inline), after the object's references were found.

The referrers of a frontier are found with one heap pass per level: ``gc.get_referrers`` for a
few objects, one Python pass over a snapshot of the heap with a set of ids for many (the C
call compares each reference with every argument).

The search is bounded in levels, objects and time. Whatever it had not resolved when a bound
cut it is "not searched", with the reason: never "found".
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..referents import referents
from .closure import NEAR_CAP, local_referrers
from .edges import _instance_dict
from .pathtext import _Step, _unquote
from .reading import running_frame_ids, static_attribute
from .resolve import Resolver
from .retained import (
    STATE_FREED,
    STATE_GARBAGE,
    STATE_NOT_SEARCHED,
    STATE_ROOTED,
    STATE_UNSEEN,
    Outcome,
    Retained,
)
from .roots import (
    ROOT_CLASS,
    ROOT_CONTEXT,
    ROOT_EXCEPTION,
    ROOT_HOOK,
    ROOT_MODULE,
    ROOT_OUTPUT,
    ROOT_SHELL,
    ROOT_SIGNAL,
    ROOT_THREAD,
    ROOT_VARIABLE,
    Root,
    RootContext,
    RootIndex,
)
from .untracked import _UNTRACKED_LEVELS, UntrackedPass

# The search's public names; the roots' (``Root``, ``RootContext``, ``ROOT_*``) are defined in
# ``roots.py`` and given from here, where the modules that ask the search import them.
__all__ = [
    "BUDGET_S",
    "MAX_LEVELS",
    "OBJECT_CAP",
    "ROOT_CLASS",
    "ROOT_CONTEXT",
    "ROOT_EXCEPTION",
    "ROOT_HOOK",
    "ROOT_MODULE",
    "ROOT_OUTPUT",
    "ROOT_SHELL",
    "ROOT_SIGNAL",
    "ROOT_THREAD",
    "ROOT_VARIABLE",
    "STATE_FREED",
    "STATE_GARBAGE",
    "STATE_NOT_SEARCHED",
    "STATE_ROOTED",
    "STATE_UNSEEN",
    "Outcome",
    "Retained",
    "Root",
    "RootContext",
    "Search",
]

# Up to this many frontier objects are looked up by the C call (one heap pass that compares
# each reference with each of them: 0.3 ns a comparison); more by one Python pass over the
# heap with a set of ids (about 0.6 s for a million objects on the development machine).
_SMALL_FRONTIER = 256
# A search stops trying levels near what it entered after this many in a row that reference
# counts did not prove (each costs up to a few ms): the heap pass is what decides them.
_LOCAL_MISSES = 3
MAX_LEVELS = 40
OBJECT_CAP = 500_000
BUDGET_S = 1.0


class Search(RootIndex, UntrackedPass, Resolver):
    """One search over the heap as it is now. Not thread-safe; call on the main thread."""

    def __init__(self, storage_of: Callable[[Any], tuple[str, int, tuple[str, int]] | None],
                 context: RootContext, *, budget_s: float | None = None,
                 object_cap: int = OBJECT_CAP, max_levels: int = MAX_LEVELS,
                 clock: Callable[[], float] = time.perf_counter,
                 numpy: Any = None) -> None:
        self.storage_of = storage_of
        self.ctx = context
        # Read at each search, not bound at import: a caller (or a test on a loaded machine)
        # may give the whole graph more time through the module's value.
        self.budget_s = BUDGET_S if budget_s is None else budget_s
        self.object_cap = object_cap
        self.max_levels = max_levels
        self.clock = clock
        self.numpy = numpy if numpy is not None else sys.modules.get("numpy")
        self._scaffold: set[int] = set()
        self._explained: list[Any] = []  # referrers taken as gone (run's ``explained``)
        # Objects an explained referrer refers to: what the cut itself lets go, never "held
        # from where Python cannot see" for having no other referrer.
        self._cut_children: set[int] = set()
        self._named: dict[int, tuple[str, str, Any]] = {}  # id(dict) -> (kind, prefix, owner)
        self._root_objects: dict[int, Root] = {}
        self._skip: set[int] = set()
        self._arrays_looked = False
        self._untracked_cache: list[Any] | None = None
        self._untracked_cut = ""  # how much of the heap the untracked pass did not read
        self._orphans_cut: set[int] = set()  # the objects that pass was looking for then
        self._deadline = 0.0
        # id(class) -> (a weak reference to it, whether it is gpumem_nb's): a strong one would
        # be a referrer of the class that this search itself made, and explains nowhere.
        self._own_types: dict[int, tuple[Any, bool]] = {}
        self._running: set[int] = set()
        self._module_alias: dict[int, str] = {}
        # The running context's variables, by name: a value set with ContextVar.set lives in
        # the context, which only the thread state refers to (Python cannot see it).
        self._context: dict[str, Any] = {}
        self._context_code: dict[str, str] = {}
        # id(a target's own __dict__) -> the target, where the collector's traversal of the
        # target does not show that dict (the explicit edge up from the dict).
        self._hidden_dicts: dict[int, Any] = {}
        # Levels found near the entered objects by reference counts, without a heap pass
        # (``closure.py``); ``local_first`` False: every level by a heap pass.
        self.local_first = True
        self.local_levels = 0
        self._local_misses = 0  # attempts in a row that the counts did not prove
        # What the explained referrers hold that no root's dict holds: the values a cut
        # deletes, whose objects mostly refer to each other (seeds of ``closure.py``).
        self._cut_values: list[Any] = []

    # -- one level: who refers to the frontier -----------------------------------------------
    def _referrers(self, frontier: list[Any], heap: list[Any] | None,
                   alive: dict[int, Any] | None = None) -> list[Any]:
        if heap is None and alive is not None and self.local_first and \
                self._local_misses < _LOCAL_MISSES and len(alive) < NEAR_CAP:
            # Near the objects entered already, where reference counts prove it complete
            # (``closure.py``): no heap pass. Never with a heap snapshot, whose slots would
            # be references the counts do not explain.
            held = dict.fromkeys(alive, 1)
            for v in self._cut_values:
                held[id(v)] = held.get(id(v), 0) + 1
            v = None
            found = local_referrers(frontier, itertools.chain(alive.values(), self._cut_values),
                                    held, self._explained, self._root_ids())
            held.clear()
            if found is not None:
                self.local_levels += 1
                self._local_misses = 0
                self._scaffold.add(id(found))
                return found
            self._local_misses += 1
        if len(frontier) <= _SMALL_FRONTIER or heap is None:
            found = gc.get_referrers(*frontier)  # C: one pass, each reference against each
        else:
            ids = {id(o) for o in frontier}
            self._scaffold.add(id(ids))
            found = []
            for x in heap:
                if not ids.isdisjoint(map(id, referents(x))):
                    found.append(x)
        # The namespace and Out as roots even when the collector does not track them (a dict
        # of atoms and capsules only is untracked, and so unseen by a referrer search).
        want = {id(o) for o in frontier}
        for d in (self.ctx.user_ns, self.ctx.out):
            if type(d) is dict and not gc.is_tracked(d) and \
                    not want.isdisjoint(map(id, dict.values(d))):
                found.append(d)
        want.clear()
        d = None
        self._scaffold.add(id(found))
        return found

    def _root_ids(self) -> set[int]:
        return {*self._named, *self._root_objects}

    def _find_cut_values(self) -> None:
        """The objects the explained referrers hold and the variables' dict does not."""
        self._cut_values = []
        self._scaffold.add(id(self._cut_values))
        if not self._explained:
            return
        ns = self.ctx.user_ns
        kept = {id(v) for v in referents(ns)} if ns is not None else set()
        for e in self._explained:
            self._cut_values.extend(v for v in referents(e)
                                    if id(v) not in kept and gc.is_tracked(v))

    # -- the search ----------------------------------------------------------------------------
    def run(self, targets: Iterable[Any], *, ignore: Iterable[int] = (),
            explained: Sequence[Any] = ()) -> Outcome:
        """The search from these objects (tensors, or whatever ``storage_of`` keys) up to
        their roots. ``ignore``: ids of referrers that are the caller's own records, never
        a holder (the stores a cleanup is about to drop). ``explained``: ignored referrers
        whose references are taken as gone (the namespace a proposed ``del`` edits), so that
        what only they and cycles keep counts as garbage, not as held by something unseen."""
        self._explained = list(explained)
        explained_ids = {id(o) for o in self._explained}
        self._cut_children = set()
        t0 = self.clock()
        deadline = t0 + self.budget_s
        self._running = running_frame_ids()
        self._index_roots()
        retained: dict[tuple[str, int], Retained] = {}
        members: dict[tuple[str, int], list[int]] = {}
        alive: dict[int, Any] = {}
        parents: dict[int, list[tuple[int, _Step]]] = {}
        roots_of: dict[int, list[tuple[Root, _Step | None]]] = {}
        self._untracked_cache = None
        self._untracked_cut = ""
        self._orphans_cut = set()
        self._deadline = deadline
        self._scaffold = {id(retained), id(members), id(alive), id(parents), id(roots_of),
                          id(self), id(self.__dict__)}
        frontier: list[Any] = []
        self._scaffold.add(id(frontier))
        if type(targets) in (list, tuple, set):
            self._scaffold.add(id(targets))  # the caller's own list of them
        self._scaffold.update(ignore)
        for t in targets:
            info = self.storage_of(t)
            if info is None or id(t) in alive:
                continue
            device, nbytes, key = info
            r = retained.get(key)
            if r is None:
                r = retained[key] = Retained(key=key, device=device, nbytes=nbytes)
            members.setdefault(key, []).append(id(t))
            alive[id(t)] = t
            frontier.append(t)
        self._index_hidden_dicts(alive)
        self._find_cut_values()
        self._local_misses = 0
        levels = 0
        cut = ""
        heap: list[Any] | None = None
        arrays_done = 0  # levels that looked into untracked containers
        try:
            while frontier:
                if levels >= self.max_levels:
                    cut = f"deeper than {self.max_levels} references"
                    break
                if len(alive) > self.object_cap:
                    cut = f"more than {self.object_cap:,} objects on the way up"
                    break
                if self.clock() > deadline:
                    cut = f"the search's {self.budget_s:g} s budget ran out"
                    break
                levels += 1
                if heap is None and len(frontier) > _SMALL_FRONTIER:
                    heap = gc.get_objects()
                    self._scaffold.add(id(heap))
                nxt = self._level(frontier, heap, alive, parents, roots_of,
                                  arrays=arrays_done < _UNTRACKED_LEVELS,
                                  explained_ids=explained_ids)
                arrays_done += self._arrays_looked
                frontier.clear()
                frontier.extend(nxt)
                nxt.clear()
                del nxt
                if self._untracked_cut:
                    # What only an unread container holds is not searched, nor is anything
                    # above: the budget is spent.
                    cut = self._untracked_cut
                    break
            if heap is not None:
                heap.clear()
            unresolved = {id(o) for o in frontier} | self._orphans_cut
            frontier.clear()
            # Before any reference count is read: the cut's values held here are references
            # nothing would explain, and so are the untracked containers the pass kept (an
            # untracked tuple of a name and a DLPack capsule looked held by something unseen).
            self._cut_values.clear()
            if self._untracked_cache is not None:
                self._untracked_cache.clear()
            self._resolve(retained, members, alive, parents, roots_of, unresolved, cut)
        finally:
            frontier.clear()
            alive.clear()
            self._hidden_dicts.clear()
            self._cut_values.clear()
        return Outcome(list(retained.values()), elapsed_s=self.clock() - t0, levels=levels,
                       objects=len(parents), cut=cut)

    def _level(self, frontier: list[Any], heap: list[Any] | None, alive: dict[int, Any],
               parents: dict[int, list[tuple[int, _Step]]],
               roots_of: dict[int, list[tuple[Root, _Step | None]]], *,
               arrays: bool, explained_ids: set[int] | frozenset[int] = frozenset(),
               ) -> list[Any]:
        """One level up: the frontier's referrers, as edges, roots or the next frontier. Its
        locals (which refer to the objects it met) end with it, before any reference count
        is read."""
        self._arrays_looked = False
        self._orphans_cut = set()
        self._thread_roots(frontier, roots_of)
        refs = self._referrers(frontier, heap, alive)
        wanted = {id(o) for o in frontier}
        nxt: list[Any] = []
        self._scaffold.update((id(wanted), id(nxt)))
        got: set[int] = set()
        for r in refs:
            rid = id(r)
            if rid in explained_ids:
                children = {id(child) for child, _ in self._edges(r, wanted)}
                self._cut_children.update(children)
                # Found a referrer: no orphan to look for in untracked containers. (Taken
                # for one, every object the cut names sent the search through the whole heap
                # for untracked containers, and its budget ran out before the answer.)
                got.update(children)
                continue
            if rid in self._scaffold or rid in self._running or rid == id(refs) or \
                    self._ours(r):
                continue
            named = self._named.get(rid)
            if named is not None:
                kind, prefix, owner = named
                for child, step in self._edges(r, wanted):
                    if step.kind != "key":
                        continue
                    key = _unquote(step.text, r, child)
                    roots_of.setdefault(id(child), []).append(
                        (self._named_root(kind, prefix, owner, key, child), None))
                    got.add(id(child))
                continue
            root = self._root_objects.get(rid)
            edges = self._edges(r, wanted)
            for child, step in edges:
                got.add(id(child))
                if root is not None:
                    roots_of.setdefault(id(child), []).append((root, step))
                else:
                    parents.setdefault(id(child), []).append((rid, step))
            if root is None and edges and rid not in alive:
                alive[rid] = r
                nxt.append(r)
        refs.clear()
        for o in frontier:
            owner = self._hidden_dicts.get(id(o))
            if owner is not None:
                # The explicit edge: a target's own __dict__, which its traversal hides.
                got.add(id(o))
                parents.setdefault(id(o), []).append((id(owner), _Step("dict", "")))
        owner = None
        if arrays:
            # Untracked containers: an object array's items are invisible to the
            # collector's traversal (numpy does not traverse them).
            orphans = [o for o in frontier if id(o) not in got and id(o) not in roots_of]
            if orphans:
                self._arrays_looked = True
                for arr, step, child in self._array_edges(orphans, heap):
                    parents.setdefault(id(child), []).append((id(arr), step))
                    if id(arr) not in alive:
                        alive[id(arr)] = arr
                        nxt.append(arr)
                if self._untracked_cut:
                    self._orphans_cut = {id(o) for o in orphans}
            orphans.clear()
        self._scaffold.discard(id(nxt))
        return nxt

    def _index_hidden_dicts(self, targets: Mapping[int, Any]) -> None:
        """Each target's own ``__dict__`` (read through its class's C descriptor: no property
        or ``__getattr__`` runs) that the collector's traversal of the target does not show.

        PyTorch's ``THPVariable_subclass_traverse`` returns at once for a tensor whose C++
        object has another owner (PyObject preservation: the Python object is then kept from
        C++, and traversing it would let the collector clear it), and on Python 3.12 a
        tensor's managed dict is made during that traversal, after a referrer search has
        passed the young objects. Either way the dict's referrer is not found, and a cycle
        through a tensor's attribute (``x.meta = {'source': x}``) looked held from where
        Python cannot see."""
        self._hidden_dicts = {}
        self._scaffold.add(id(self._hidden_dicts))
        for t in targets.values():
            d = _instance_dict(t)
            if not d:
                continue
            if any(r is d for r in referents(t)):
                continue
            self._hidden_dicts[id(d)] = t
        d = None

    def _ours(self, obj: Any) -> bool:
        """An object of gpumem_nb's own classes (the monitor's note of the last exception,
        the chart): never a holder the user can act on. Its class is judged once."""
        t = type(obj)
        known = self._own_types.get(id(t))
        if known is not None and known[0]() is t:
            return known[1]
        module = static_attribute(t, "__module__")
        ours = type(module) is str and module.split(".", 1)[0] == "gpumem_nb"
        # A class that takes no weak reference is judged again next time.
        with contextlib.suppress(TypeError):
            self._own_types[id(t)] = (weakref.ref(t), ours)
        return ours
