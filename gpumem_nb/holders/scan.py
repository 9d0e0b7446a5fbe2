"""Who holds memory: tensors reachable from the user's namespace, the output cache and the
stored exception of a failed cell, each attributed once, largest first.

Runs only on demand and on the main thread (it walks user objects, which may change under a
background thread). torch is looked up in ``sys.modules`` and never imported: without torch
there are no tensors, and numpy-like arrays are still reported as host memory.

Attribution order decides whose name a shared tensor gets: a user variable first (deleting it
is what frees the memory), then the output cache, then the stored traceback, then anything
found only through the garbage collector.

``Scanner`` composes the parts, one job to a module: the walk down from each name
(``walk.py``), the tensors' facts (``facts.py``), the tally into holders (``tally.py``), their
autograd graphs (``autograd.py``), second references between holders (``shared.py``), the
names that are no variables (``names.py``), the stored exception's frames (``stored.py``), and
for what the walk did not reach, the heap pass (``heap.py``) and the retention search
(``retention.py``).
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
import types
import warnings
from collections.abc import Container, Iterable, Mapping
from dataclasses import replace
from typing import Any

from .. import userexc
from ..model import Holder
from . import heap, retention
from .autograd import graph_walker, size_graphs
from .facts import TensorFacts
from .named import KIND_NOT_SEARCHED, holder_groups, pandas_name
from .names import SHELL_NAMES, alias_order, exact_int_keys, name_of, output_cache_names
from .peek import is_atom
from .reading import MISSING
from .retention import RootContext, Search
from .shared import check_shared
from .stored import finished_frame_locals
from .tally import Tally, holder_of
from .threads import thread_locals
from .verify import check_cuts, checked
from .walk import CONTAINER_DEPTH, OBJECT_CAP, WALK_BUDGET_S, ObjectWalk

__all__ = ["GRAPH_BUDGET_S", "HEAP_CHUNK", "HEAP_CUT_NAME", "Scanner"]

# Autograd graphs are walked after every holder has taken its own tensors, in this time per
# scan (the OOM explainer has 50 ms in all, `who` 100 ms on the H200): a GPT-2 step's graph
# of about 600 nodes takes a few milliseconds.
GRAPH_BUDGET_S = 0.03
# The heap pass of the search for what the walk did not reach reads the collector's objects
# this many at a time, checking its time between chunks.
HEAP_CHUNK = 1 << 16
HEAP_CUT_NAME = "the rest of the heap"


def _shell_objects(user_ns: Mapping[Any, Any], output_cache: Mapping[int, Any] | None,
                   roots: RootContext | None) -> set[int]:
    """The ids of the namespace, the output cache and the shell's own objects that the
    namespace names (``get_ipython``'s shell, ``In``, ``Out``, ``exit``): roots of their own,
    which no variable's walk goes through. The shell is found by the bound method's C
    ``__self__`` (no code of it runs); keys compared only as exact strs."""
    ids = {id(user_ns)}
    if output_cache is not None:
        ids.add(id(output_cache))
    if roots is not None and roots.shell is not None:
        ids.add(id(roots.shell))
    if type(user_ns) is dict:
        for key, obj in list(dict.items(user_ns)):
            if type(key) is not str or key not in SHELL_NAMES or key.startswith("__"):
                continue
            ids.add(id(obj))
            if type(obj) is types.MethodType:
                ids.add(id(obj.__self__))
    return ids


class _Either:
    """In either of two key collections (the walk's and the heap pass's), without a copy."""

    def __init__(self, a: Container[Any], b: Container[Any]) -> None:
        self.a, self.b = a, b

    def __contains__(self, k: object) -> bool:
        return k in self.a or k in self.b


class Scanner(ObjectWalk):
    """One interpreter's holders. A scan walks down from the names (``ObjectWalk``, which this
    is, so that each object is entered once per scan whoever reaches it), tallies each
    storage under the first holder that reached it, sizes the holders' graphs, and with
    ``include_gc`` or ``rest_min_bytes`` searches the heap for the rest."""

    def __init__(self, modules: Mapping[str, Any] | None = None, *,
                 graph_budget_s: float = GRAPH_BUDGET_S, walk_budget_s: float = WALK_BUDGET_S,
                 object_cap: int = OBJECT_CAP) -> None:
        facts = TensorFacts(sys.modules if modules is None else modules)
        super().__init__(facts, walk_budget_s=walk_budget_s, object_cap=object_cap)
        self.reader = facts.reader
        self.graph_budget_s = graph_budget_s
        self.tally = Tally(facts)  # the last scan's, made afresh by each
        self.skipped = 0  # objects that raised while being looked at
        self._extras: dict[str, dict[str, Any]] = {}  # the retention search's holders' fields
        self.unreached_bytes = 0  # GPU bytes the walk did not reach, in the last scan
        self.search: retention.Outcome | None = None  # the last retention search, if one ran
        self.heap_cut = ""  # where the last heap pass stopped at its time, what it did not read
        self._say_cut = False
        self.graph_s = 0.0  # the last scan's time in graph walks
        self.graph_nodes = 0  # and the nodes they walked

    # -- one tensor's facts, as the walk reads them ----------------------------------------
    def _grad_fn(self, t: object) -> Any:
        return self.facts.grad_fn(t)

    def _describe(self, t: object, grad_fn: object = MISSING) -> str:
        return self.facts.describe(t, grad_fn)

    def shape_of(self, t: object) -> tuple[Any, ...] | None:
        return self.facts.shape_of(t)

    def own_bytes(self, t: object) -> int | None:
        return self.facts.own_bytes(t)

    # -- holders -----------------------------------------------------------------------------
    def _attribute(self, name: str, kind: str, obj: Any) -> None:
        try:
            self._attribute_each(name, kind, obj)
        except Exception:
            self.skipped += 1  # a hostile object: what was found before it still counts

    def _attribute_each(self, name: str, kind: str, obj: Any) -> None:
        self._begin_holder(name, namespace_root=kind == "traceback")
        try:
            add = self.tally.add
            for t, path in self._tensors_in(obj, CONTAINER_DEPTH):
                last = self._last_info  # read by the walk as it handed the tensor on
                info = last[1] if last[0] is t else self._tensor_info(t)
                if info is not None:
                    add(name, kind, t, path, info, id(t) in self._grad_ids)
                elif self.facts.is_graph_node(t):
                    self.tally.add_node(name, kind, t, path)
        finally:
            self._forget()  # no tensor outlives the walk here
            self.tally.close(name, self._path_classes, self._cut)
            if self._cut:
                self.walk_capped = True

    def _size_graphs(self) -> None:
        walker = graph_walker(self.tally, self.facts, self.graph_budget_s)
        try:
            size_graphs(self.tally, walker)
        finally:
            self.graph_s, self.graph_nodes = walker.elapsed_s, walker.nodes

    def _check_shared(self) -> None:
        shared, self._shared = self._shared, {}
        try:
            check_shared(shared, self.tally, self.tensors_of, self._tensor_info)
        finally:
            shared.clear()

    # -- what the walk did not reach ---------------------------------------------------------
    def _unreached(self, budget_s: float) -> list[Any]:
        """Every GPU tensor the garbage collector tracks that the walk did not reach, within
        ``budget_s`` (``heap.py``); ``heap_cut`` then says how much was not read."""
        self.heap_cut = ""
        tensors, self.heap_cut = heap.unreached(self.facts, self.tally.seen, budget_s,
                                                HEAP_CHUNK)
        return tensors

    def _exported(self, tensors: list[Any], sizes: dict[tuple[str, int], int],
                  budget_s: float) -> None:
        """The unconsumed DLPack capsules of GPU memory that no tensor found explains, added
        to ``tensors`` (``heap.exported``), within half of ``budget_s``."""
        caps, cut = heap.exported(self.facts, _Either(self.tally.seen, sizes),
                                  max(budget_s / 2, 0.05), HEAP_CHUNK)
        for c in caps:
            info = self._tensor_info(c)
            if info is not None and info[2] not in sizes:
                sizes[info[2]] = info[1]
                tensors.append(c)
        caps.clear()
        if cut and not self.heap_cut:
            self.heap_cut = cut

    def _search_rest(self, ctx: RootContext, min_bytes: int, budget_s: float | None,
                     allocated_bytes: int | None = None) -> None:
        """The retention search for what the walk did not reach, each group of storages
        attributed under its path from a root (or as garbage, unseen, not searched)."""
        t0 = time.perf_counter()
        budget = retention.BUDGET_S if budget_s is None else budget_s
        tensors = self._unreached(budget)
        try:
            sizes: dict[tuple[str, int], int] = {}
            for t in tensors:
                info = self._tensor_info(t)
                if info is not None:
                    sizes[info[2]] = info[1]
            left = None if allocated_bytes is None else \
                allocated_bytes - self.tally.gpu_bytes() - sum(sizes.values())
            if left is None or left > min_bytes:
                # Bytes no tensor explains: DLPack capsules, which the collector does not
                # track, are looked for among what it tracks refers to (a pass over the
                # heap's referents, so only then).
                self._exported(tensors, sizes, budget - (time.perf_counter() - t0))
            self.unreached_bytes = sum(sizes.values())
            # One bound for every pass: the search gets what the heap passes left of it, and
            # at least half of it, so that a heap pass cut at its bound still leaves a search.
            budget_s = max(budget - (time.perf_counter() - t0), budget / 2)
            if not tensors or self.unreached_bytes < min_bytes:
                return
            if not ctx.thread_locals:
                ctx.thread_locals = thread_locals()
            self._forget_classes()
            outcome = Search(self._tensor_info, ctx, budget_s=budget_s).run(tensors)
            self.search = outcome
            by_key: dict[tuple[str, int], list[Any]] = {}
            for t in tensors:
                info = self._tensor_info(t)
                if info is not None:
                    by_key.setdefault(info[2], []).append(t)
            ns = ctx.user_ns
            for template, keys in holder_groups(outcome.retained):
                group = [t for k in keys for t in by_key.get(k, ())]
                template = replace(template, name=pandas_name(template.name, ns))
                extras = {f: getattr(template, f) for f in
                          ("also_held_by", "code", "classes", "why", "clear_code")
                          if getattr(template, f)}
                self._extras[template.name] = {**extras, "searched": True}
                self._attribute(template.name, template.kind, group)
                group.clear()
            by_key.clear()
        finally:
            tensors.clear()

    def check_cuts(self, holders: Iterable[Holder], lines: Mapping[str, str],
                   context: RootContext, budget_s: float | None = None) -> list[Holder]:
        """Each holder named in ``lines`` (its name: the ``del a, b`` line its advice gives)
        with that line checked against the retention graph (``verify.py``): extended by the
        references it misses, or replaced by none where no one line frees it."""
        ns = context.user_ns
        held = list(holders)
        if not isinstance(ns, dict) or not lines:
            return held
        tensors: dict[str, list[Any]] = {}
        cuts: dict[str, list[str]] = {}
        # Looked up among exact-str keys only: a str subclass key's __eq__ is user code.
        named = {k: v for k, v in dict.items(ns) if type(k) is str}
        for name, line in lines.items():
            if name not in named or not line.startswith("del "):
                continue
            found = [t for t, _ in self.tensors_of(named[name])]
            tensors[name] = [t for t in found
                             if (self._tensor_info(t) or ("",))[0].startswith("cuda")]
            found.clear()  # a list of them left here would be one more referrer
            cuts[name] = [n.strip() for n in line[4:].split(",")]
        named.clear()  # it refers to every variable: cleared before the search looks
        self._forget()  # the walk's memo of its last tensor is one more reference to it
        self._forget_classes()
        if not context.thread_locals:
            context.thread_locals = thread_locals()
        try:
            checks = check_cuts(tensors, cuts, context, self._tensor_info,
                                **({} if budget_s is None else {"budget_s": budget_s}))
        except Exception as e:  # a hostile referrer: the advice stays, said unchecked
            checks = {}
            note = f"not checked: {type(e).__name__}"
            return [replace(h, cut_note=note) if h.name in lines else h for h in held]
        finally:
            tensors.clear()
        return [checked(h, checks[h.name], lines[h.name]) if h.name in checks else h
                for h in held]

    # -- whole scans -------------------------------------------------------------------------
    def scan(self, *args: Any, **kwargs: Any) -> list[Holder]:
        """See ``_scan``. Looking at user objects must never print: library warnings that
        mere inspection can trigger are silenced for the duration. It never raises either: a
        failure past every per-object guard returns what was found."""
        tally = self.tally = Tally(self.facts)
        # The walk allocates only short-lived iterators, freed as it goes; letting them
        # trigger collections over a large heap doubled its time on a million containers.
        collecting = gc.isenabled()
        gc.disable()
        try:
            with warnings.catch_warnings(), \
                    self.reader.held() if self.reader is not None else contextlib.nullcontext():
                warnings.simplefilter("ignore")
                self._scan(*args, **kwargs)
        except Exception:
            self.skipped += 1
        finally:
            self._forget()
            self._boundary = set()  # ids of this scan's roots: another object's later
            # The tally stays with the scanner until its next scan: no graph it noted may
            # (a failure before the graphs were sized left their roots).
            for f in tally.found.values():
                f.roots.clear()
            if collecting:
                gc.enable()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            holders = [holder_of(f) for f in tally.found.values()]
            holders = [replace(h, **self._extras[h.name]) if h.name in self._extras else h
                       for h in holders]
            holders = [replace(h, also_held_by=tuple(tally.also[h.name]))
                       if tally.also.get(h.name) and not h.also_held_by else h
                       for h in holders]
            holders.sort(key=lambda h: (-h.held_bytes, h.name))
            if self.heap_cut and self._say_cut:  # first: said before any -n cut
                holders.insert(0, Holder(
                    name=HEAP_CUT_NAME, kind=KIND_NOT_SEARCHED, device="cuda", nbytes=0,
                    detail=self.heap_cut, why=self.heap_cut, walk_capped=True))
            return holders

    def _scan(
        self,
        user_ns: Mapping[Any, Any],
        *,
        output_cache: Mapping[int, Any] | None = None,
        last_exception: Iterable[BaseException | types.TracebackType | None] = (),
        include_gc: bool = False,
        hidden: Mapping[str, Any] | None = None,
        rest_min_bytes: int | None = None,
        roots: RootContext | None = None,
        search_budget_s: float | None = None,
        allocated_bytes: int | None = None,
    ) -> None:
        """The fast walk from the names down; then, with ``include_gc``, the retention search
        (``retention.py``) for every GPU tensor the walk did not reach, and with
        ``rest_min_bytes`` the same search only when those tensors come to that much. Given
        what PyTorch has allocated on the GPUs now, the heap is not even looked at when the
        walk's own finds leave less than that unexplained."""
        self._extras = {}
        self.heap_cut = ""
        self._say_cut = include_gc  # `who --gc` lists it; the explainer's search does not
        self._reset_walk()
        self._boundary = _shell_objects(user_ns, output_cache, roots)
        self.graph_s, self.graph_nodes = 0.0, 0
        out = exact_int_keys(output_cache)
        cached = output_cache_names(user_ns, out, hidden)
        aliases: dict[int, list[str]] = {}
        for key, obj in list(user_ns.items()):
            name = name_of(key)
            if name is None:
                continue  # globals()[7] = ...: not a variable anyone can name
            if name in cached:
                aliases.setdefault(id(obj), []).append(name)
                continue
            if is_atom(obj) or name in SHELL_NAMES or name.startswith("__"):
                continue
            self._attribute(name, self.facts.kind_of(obj), obj)
        for n, obj in sorted(out.items()):
            label = f"Out[{n}]"
            also = [a for a in aliases.pop(id(obj), []) if a != f"_{n}"]
            if also:
                label += f" (also {', '.join(sorted(also, key=alias_order))})"
            self._attribute(label, "output cache", obj)
        for names in aliases.values():  # `_` and friends the cache set, no longer in Out
            obj = user_ns.get(names[0])
            self._attribute(" / ".join(sorted(names, key=alias_order)), "output cache", obj)
        for tb_name, frame_locals in finished_frame_locals(last_exception):
            self._attribute(tb_name, "traceback", frame_locals)
        self._size_graphs()
        if include_gc or (rest_min_bytes is not None and (
                allocated_bytes is None
                or allocated_bytes - self.tally.gpu_bytes() > rest_min_bytes)):
            ctx = roots if roots is not None else RootContext(
                user_ns=user_ns, out=output_cache,
                stored_exceptions=[e for e in last_exception if userexc.is_exception(e)])
            self._search_rest(ctx, 0 if include_gc else rest_min_bytes or 0,
                              search_budget_s, allocated_bytes)
            self._size_graphs()  # the graphs of what the search found
        self._check_shared()
