"""The retention search's last step: from the parents it found to each storage's roots, its
shortest path in the words a user types, the container a ``clear()`` empties, and the classes
of the cycles that keep what nothing reaches."""

from __future__ import annotations

import re
import sys
import types
from collections import deque
from collections.abc import Mapping
from typing import Any

from ..referents import referents
from .edges import _finished_frame_locals, _instance_dict
from .pathtext import _EXPRESSION, _describe, _render, _Step
from .reading import static_attribute, type_name
from .retained import (
    STATE_FREED,
    STATE_GARBAGE,
    STATE_NOT_SEARCHED,
    STATE_ROOTED,
    STATE_UNSEEN,
    Retained,
)
from .roots import ROOT_CLASS, ROOT_CONTEXT, ROOT_MODULE, ROOT_SHELL, Root

__all__ = ["Resolver"]

# Roots with no line of their own that a line can still reach into: a library's module global
# or class attribute, the shell, a context variable no notebook name sets. (A live thread's
# local is not: only the thread can let go of it.)
_ENTRY_KINDS = frozenset((ROOT_MODULE, ROOT_CLASS, ROOT_SHELL, ROOT_CONTEXT))
# More entries than this to remove for one storage is no line a person would run.
_MOST_ENTRIES = 4
# What an entry's line may name: public names and attributes, int or plain str subscripts,
# from a root or from ``get_ipython()``. Never a private name: a registry a library documents
# for its users to edit (``gc.callbacks``, IPython's event callbacks) is public; its private
# state is not (clearing ``threading._active`` broke the library, on the H200).
_ENTRY_EXPR = re.compile(
    r"(?:get_ipython\(\)|[A-Za-z]\w*)(?:\.[A-Za-z]\w*|\[-?\d+\]|\['[\w .-]*'\])*")
# A dict's key is found by reading its items (never by hashing: a key's own ``__eq__`` is the
# user's code), once for each storage; a bigger dict gives no line.
_MOST_KEYS_READ = 4096
_Hit = tuple[Root, "_Step | None", list[_Step], list[int]]


class Resolver:
    """The part of ``Search`` that turns what a search found into paths and states."""

    # Set by ``Search`` for each run.
    _explained: list[Any]
    _cut_children: set[int]
    _hidden_dicts: dict[int, Any]
    _running: set[int]  # ids of the frames running now

    # -- paths, root sets and what nothing reaches ---------------------------------------------
    def _resolve(self, retained: dict[tuple[str, int], Retained],
                 members: dict[tuple[str, int], list[int]], alive: dict[int, Any],
                 parents: dict[int, list[tuple[int, _Step]]],
                 roots_of: dict[int, list[tuple[Root, _Step | None]]],
                 unresolved: set[int], cut: str) -> None:
        names: dict[int, str] | None = None  # the notebook's names by id, read once if needed
        for key, r in retained.items():
            roots: set[Root] = set()
            best: tuple[int, str, str] | None = None
            reached_cut = False
            ancestors: set[int] = set()
            tops = False
            top: tuple[int, list[_Step]] | None = None  # the nearest object nothing seen holds
            clears: set[str] = set()
            # The shortest path down from each ancestor to the storage: what names the object
            # something unseen holds.
            down: dict[int, list[_Step]] = {}
            for tid in members[key]:
                # Breadth first up the parents: the first root met is the nearest.
                q: deque[tuple[int, list[_Step], list[int]]] = deque([(tid, [], [tid])])
                seen = {tid}
                nearest: tuple[Root, _Step | None, list[_Step], list[int]] | None = None
                while q:
                    oid, steps, chain = q.popleft()
                    ancestors.add(oid)
                    down.setdefault(oid, steps)
                    for root, step in roots_of.get(oid, ()):
                        roots.add(root)
                        path = [step, *steps] if step is not None else steps
                        text = _render(root.name, path)
                        if best is None or (len(path), text) < best[:2]:
                            best = (len(path), text, root.kind)
                        if nearest is None:
                            nearest = (root, step, steps, chain)
                    ps = parents.get(oid)
                    if not ps and oid not in roots_of:
                        if oid in unresolved:
                            reached_cut = True
                        elif oid not in self._cut_children:
                            tops = True
                            if top is None or len(steps) < len(top[1]):
                                top = (oid, steps)
                    for pid, step in ps or ():
                        if pid not in seen:
                            seen.add(pid)
                            q.append((pid, [step, *steps], [pid, *chain]))
                clears.add(self._clear_code(nearest, alive, parents, roots_of)
                           if nearest is not None else "")
            if any(not x.code and x.kind in _ENTRY_KINDS for x in roots):
                if names is None:
                    names = self._names_by_id()
                entries = _entry_cuts(members[key], alive, parents, roots_of, names)
                if entries is not None:
                    # Only the roots that still reach it once the entries go: every logger
                    # reaches every other through the logging manager's registry, and a
                    # notebook's `logger` was told to go with the entry that held the bytes.
                    lines, cut_edges, emptied = entries
                    roots = _roots_left(members[key], parents, roots_of, cut_edges, emptied)
                    roots.update(lines)
            if roots:
                r.state, r.roots = STATE_ROOTED, frozenset(roots)
                assert best is not None
                r.path, r.root_kind = best[1], best[2]
                (r.clear_code,) = clears if len(clears) == 1 else ("",)
                r.cyclic = _has_cycle(ancestors, parents)
            elif reached_cut:
                r.state, r.why = STATE_NOT_SEARCHED, cut
            elif tops:
                r.state = STATE_UNSEEN
                if top is not None and top[0] in alive:
                    # Named by the object that something unseen holds (a C extension's
                    # registry, a running frame), and the path from it down.
                    what = Root(STATE_UNSEEN, f"({_describe(alive[top[0]])})")
                    r.path = _render(what.name, top[1])
            else:
                r.state = STATE_GARBAGE
                r.classes, held = self._cycle_classes(ancestors, alive, set(members[key]))
                if r.classes is None:  # a reference from outside the cycle, unseen
                    r.state, r.classes = STATE_UNSEEN, ()
                    if held in alive and held in down:
                        # Named by the object whose references the cycle does not explain
                        # (a hook C code keeps: torch's saved-tensor hooks' bound methods).
                        what = Root(STATE_UNSEEN, f"({_describe(alive[held])})")
                        r.path = _render(what.name, down[held])
                elif not _has_cycle(ancestors, parents):
                    # Only the explained referrers kept it: the cut frees it at once.
                    r.state, r.classes = STATE_FREED, ()

    def _names_by_id(self) -> dict[int, str]:
        """id(value) -> the notebook's name for it (plain identifiers only)."""
        ns = getattr(getattr(self, "ctx", None), "user_ns", None)
        if not isinstance(ns, dict):
            return {}
        return {id(v): k for k, v in list(dict.items(ns))
                if type(k) is str and k.isidentifier() and not k.startswith("_")}

    def _clear_code(self, nearest: tuple[Root, _Step | None, list[_Step], list[int]],
                    alive: dict[int, Any], parents: dict[int, list[tuple[int, _Step]]],
                    roots_of: dict[int, list[tuple[Root, _Step | None]]]) -> str:
        """``reg.clear()``: the container nearest the tensor on its shortest path whose class
        has a ``clear`` of its own (found on the class, never called), where every path from
        any root to the tensor runs through it, so that emptying it frees the tensor and
        keeps the object. Never through a private attribute (a library's internals) nor
        under a root with no line of its own (a library's globals: clearing
        ``threading._active`` broke the library)."""
        root, step, steps, chain = nearest
        if not root.code or root.code.startswith("%"):
            return ""
        path = [step, *steps] if step is not None else list(steps)
        # chain[k] is reached by the first ``offset + k`` steps of ``path``.
        offset = 1 if step is not None else 0
        for k in range(len(chain) - 2, -1, -1):
            obj = alive.get(chain[k])
            if obj is None or (k + offset and path[k + offset - 1].kind == "dict"):
                continue  # an object's own __dict__: clearing it drops every attribute
            if not callable(static_attribute(type(obj), "clear")) or \
                    issubclass(type(obj), type):
                continue
            if k + offset == 0 and type(obj) in (list, dict, set):
                return ""  # the root's own builtin container: its line says so already
            expr = _render(root.name, path[:k + offset])
            if not _EXPRESSION.fullmatch(expr) or "._" in expr or \
                    not self._dominates(chain[k], chain[-1], parents, roots_of):
                return ""
            return f"{expr}.clear()"
        return ""

    @staticmethod
    def _dominates(cid: int, tid: int, parents: dict[int, list[tuple[int, _Step]]],
                   roots_of: dict[int, list[tuple[Root, _Step | None]]]) -> bool:
        """Every path from a root to ``tid`` runs through ``cid``."""
        seen = {tid, cid}
        todo = [tid]
        while todo:
            oid = todo.pop()
            if oid in roots_of:
                return False
            for pid, _ in parents.get(oid, ()):
                if pid not in seen:
                    seen.add(pid)
                    todo.append(pid)
        return True

    def _cycle_classes(self, ids: set[int], alive: dict[int, Any],
                       targets: set[int]) -> tuple[Any, int]:
        """The classes of the objects in a closed set of referrers, if nothing outside it
        refers to them (each one's reference count is what the set's own edges explain);
        None where something unseen does, with the id of the object it refers to (0 with
        the classes)."""
        inside: dict[int, int] = dict.fromkeys(ids, 0)
        for oid in ids:
            obj = alive.get(oid)
            if obj is None:
                continue
            refs = referents(obj)
            own = _instance_dict(obj)
            if own is None:
                own = _finished_frame_locals(obj, self._running)
            if own is not None and id(own) not in inside and any(r is own for r in refs):
                # An object and its own __dict__ are one node. The dict may have been made
                # after the object was met (reading ``vars(obj)``, this search's own attribute
                # edges, materialise a dict whose values the object held inline): its values
                # were found as the object's, and are counted as its references here. So is
                # a finished frame's cache of its locals, which the frame's edges made:
                # uncounted, a function's `err = e` cycle read as held by something unseen.
                refs.extend(referents(own))
            own = None
            for c in refs:
                if id(c) in inside:
                    inside[id(c)] += 1
            refs.clear()
        for obj in self._explained:
            for c in referents(obj):
                if id(c) in inside:
                    inside[id(c)] += 1
        for did, owner in self._hidden_dicts.items():
            if did in inside and id(owner) in inside:
                inside[did] += 1  # the explicit edge: the target refers to its own dict
        obj = c = None  # a local left bound would count as one more reference
        classes: set[str] = set()
        for oid in ids:
            if oid in targets or oid not in alive:
                continue
            # Held here by ``alive`` and by getrefcount's own argument.
            if sys.getrefcount(alive[oid]) - 2 > inside[oid]:
                return None, oid
            t = type(alive[oid])
            if t not in (dict, list, tuple, set, types.CellType, types.FunctionType):
                classes.add(type_name(t))
            owner = self._hidden_dicts.get(oid)
            if owner is not None:
                # The cycle runs through the tensor's own attributes: its class is in it.
                classes.add(type_name(type(owner)))
        owner = None
        return tuple(sorted(classes)), 0


class _Entries:
    """The entries one storage's paths enter, by container: what the lines remove."""

    def __init__(self) -> None:
        self.cut: set[tuple[int, int]] = set()  # (entry id, container id)
        self.emptied: set[int] = set()
        # container id -> (root, its expression, the container, [(index or key as written,
        # the entry's id)])
        self.by_container: dict[int, tuple[Root, str, Any, list[tuple[str, int]]]] = {}

    def lines(self, names: Mapping[int, str]) -> list[Root]:
        """One root per container, its line independent of every other line's: a list's
        entries are filtered out by identity (an index shifts when another line, or anyone,
        removes an entry before it, and a callable registered twice is two entries), a dict's
        go by key, a deque's by index from the last."""
        out: list[Root] = []
        for cid, (root, expr, container, entries) in self.by_container.items():
            depth = expr.count(".") + expr.count("[")
            if cid in self.emptied:
                line = f"{expr}.clear()"
                name = expr
            elif type(container) is list:
                ids = sorted({entry for _, entry in entries})
                if all(i in names for i in ids):
                    # Said by the notebook's own names where it has them (the line runs before
                    # any `del` of those names).
                    test = " and ".join(f"x is not {names[i]}" for i in ids)
                elif len(ids) == 1:
                    test = f"id(x) != {ids[0]}"
                else:
                    test = f"id(x) not in {tuple(ids)}"
                line = f"{expr}[:] = [x for x in {expr} if {test}]"
                name = expr if len(entries) > 1 else f"{expr}[{entries[0][0]}]"
            else:
                keys = sorted({text for text, _ in entries},
                              key=lambda t: -int(t) if type(container) is deque else 0)
                line = "; ".join(f"del {expr}[{k}]" for k in keys)
                name = expr if len(keys) > 1 else f"{expr}[{keys[0]}]"
            code = f"import {root.module}; {line}" if root.module else line
            out.append(Root(root.kind, name, code, cid in self.emptied, module=root.module,
                            depth=depth))
        return out


def _entry_cuts(tids: list[int], alive: dict[int, Any],
                parents: dict[int, list[tuple[int, _Step]]],
                roots_of: dict[int, list[tuple[Root, _Step | None]]],
                names: Mapping[int, str],
                ) -> tuple[list[Root], set[tuple[int, int]], set[int]] | None:
    """Where a root with no line of its own keeps a storage (``gc.callbacks``, the shell's
    ``user_ns_hidden``, a library's registry), the removal of the entries its paths enter:
    one line per container (``_Entries.lines``); a list that an object keeps as an attribute
    and whose every item is on the way to these bytes is emptied instead. Checked on the
    graph the search found, not by a rule about the library: the edges each line removes
    are taken out, and the search's paths are walked again until no such root reaches the
    storage (each new path its own entry). The lines, with the edges and containers they
    cut; None where one of the paths has no entry a line can name, or more than
    ``_MOST_ENTRIES`` entries would have to go."""
    found = _Entries()
    entries = 0
    while True:
        hit = _stuck_path(tids, parents, roots_of, found.cut, found.emptied)
        if hit is None:
            return found.lines(names), found.cut, found.emptied
        entry = _entry(hit, alive)
        if entry is None:
            return None
        root, expr, child, container, text = entry
        if container in found.emptied or (child, container) in found.cut:
            return None  # no progress: the walk's edges and the graph's disagree
        obj = alive[container]
        entries += 1
        mine = found.by_container.setdefault(container, (root, expr, obj, []))[3]
        mine.append((text, child))
        found.cut.add((child, container))
        if type(obj) is list and _emptiable(hit, expr, obj, alive, len(mine), child in tids):
            found.emptied.add(container)
        obj = None
        if entries > _MOST_ENTRIES and not found.emptied:
            return None


def _emptiable(hit: _Hit, expr: str, container: list[Any], alive: Mapping[int, Any],
               entries: int, direct: bool) -> bool:
    """Emptying the list is the line: an object keeps it as an attribute below the root
    (never the registry a root names itself: ``gc.callbacks.clear()`` drops every other
    library's callback), every item in it is on the way to these bytes (never a bystander),
    and it holds the tensors themselves or is entered more than twice."""
    if not (direct or entries > 2):
        return False
    if not expr.rsplit(".", 1)[-1].isidentifier() or expr == hit[0].name:
        return False
    return len(container) <= _MOST_KEYS_READ and \
        all(id(x) in alive for x in list.__iter__(container))


def _stuck_path(tids: list[int], parents: Mapping[int, list[tuple[int, _Step]]],
                roots_of: Mapping[int, list[tuple[Root, _Step | None]]],
                cut: set[tuple[int, int]], emptied: set[int]) -> _Hit | None:
    """The shortest path up from these objects to a root with no line that a line can reach
    into, without the ``cut`` edges (child id, parent id) and the ``emptied`` containers'
    edges: the root, its own step, the steps down to the target and the ids along them; None
    where no such root is reached."""
    for tid in tids:
        q: deque[tuple[int, list[_Step], list[int]]] = deque([(tid, [], [tid])])
        seen = {tid}
        while q:
            oid, steps, chain = q.popleft()
            for root, step in roots_of.get(oid, ()):
                if not root.code and root.kind in _ENTRY_KINDS:
                    return root, step, steps, chain
            for pid, step in parents.get(oid, ()):
                if pid not in seen and pid not in emptied and (oid, pid) not in cut:
                    seen.add(pid)
                    q.append((pid, [step, *steps], [pid, *chain]))
    return None


def _roots_left(tids: list[int], parents: Mapping[int, list[tuple[int, _Step]]],
                roots_of: Mapping[int, list[tuple[Root, _Step | None]]],
                cut: set[tuple[int, int]], emptied: set[int]) -> set[Root]:
    """Every root that still reaches these objects without the cut edges and containers."""
    out: set[Root] = set()
    seen = set(tids)
    todo = list(tids)
    while todo:
        oid = todo.pop()
        if oid not in emptied:
            out.update(root for root, _ in roots_of.get(oid, ()))
        for pid, _ in parents.get(oid, ()):
            if pid not in seen and pid not in emptied and (oid, pid) not in cut:
                seen.add(pid)
                todo.append(pid)
    return out


def _private(steps: list[_Step]) -> bool:
    """A step through a private name (``._modules``, ``._cache``), read from the steps: the
    rendered path says torch's ``_modules['enc']`` as ``.enc``."""
    after_dict = False
    for s in steps:
        name = s.text.strip("'") if s.kind == "key" and after_dict else \
            s.text if s.kind == "attr" else ""
        if name.startswith("_"):
            return True
        after_dict = s.kind == "dict"
    return False


def _entry(hit: _Hit, alive: Mapping[int, Any]) -> tuple[Root, str, int, int, str] | None:
    """The builtin container nearest the target on the path whose expression a line can name:
    the root, the container's expression, the ids of the entry and of the container, and the
    entry's index or key as a line writes it. None where there is none (the path goes
    through a closure or a frame first, all the way up)."""
    root, step, steps, chain = hit
    path = [step, *steps] if step is not None else list(steps)
    offset = 1 if step is not None else 0  # chain[k] is reached by path[:k + offset]
    for k in range(len(chain) - 2, -1, -1):
        container = alive.get(chain[k])
        child = alive.get(chain[k + 1])
        if type(container) not in (list, dict, deque) or child is None:
            continue
        above, into = path[:k + offset], path[k + offset]
        if above and above[-1].kind == "dict":
            continue  # an object's own __dict__: its keys are attributes, not entries
        expr = _render(root.name, above)
        if not _ENTRY_EXPR.fullmatch(expr) or _private(above):
            continue
        if type(container) is dict:
            if len(container) > _MOST_KEYS_READ:
                continue
            keys = [key for key, v in dict.items(container) if v is child]
            if into.kind != "key" or len(keys) != 1 or type(keys[0]) not in (str, int):
                continue
            text = repr(keys[0])
            if len(text) > 60 or not text.isprintable():
                continue
        elif into.kind == "index":
            text = into.text
        else:
            continue
        return root, expr, chain[k + 1], chain[k], text
    return None


def _has_cycle(ids: set[int], parents: Mapping[int, list[tuple[int, _Step]]]) -> bool:
    """Whether the references among these objects (each one's referrers in ``parents``) close
    a cycle: a depth-first search that meets an object still on its path."""
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    for start in ids:
        if start in state:
            continue
        state[start] = 1
        stack = [(start, iter(parents.get(start, ())))]
        while stack:
            oid, it = stack[-1]
            for pid, _ in it:
                if pid not in ids:
                    continue
                seen = state.get(pid)
                if seen == 1:
                    return True
                if seen is None:
                    state[pid] = 1
                    stack.append((pid, iter(parents.get(pid, ()))))
                    break
            else:
                state[oid] = 2
                stack.pop()
    return False
