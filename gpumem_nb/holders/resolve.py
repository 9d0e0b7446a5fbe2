"""The retention search's last step: from the parents it found to each storage's roots, its
shortest path in the words a user types, the container a ``clear()`` empties, and the classes
of the cycles that keep what nothing reaches."""

from __future__ import annotations

import gc
import re
import sys
import types
from collections import deque
from collections.abc import Mapping
from typing import Any

from .edges import _instance_dict
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

    # -- paths, root sets and what nothing reaches ---------------------------------------------
    def _resolve(self, retained: dict[tuple[str, int], Retained],
                 members: dict[tuple[str, int], list[int]], alive: dict[int, Any],
                 parents: dict[int, list[tuple[int, _Step]]],
                 roots_of: dict[int, list[tuple[Root, _Step | None]]],
                 unresolved: set[int], cut: str) -> None:
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
                entries = self._entry_cuts(members[key], alive, parents, roots_of)
                if entries is not None:
                    roots = {x for x in roots if x.code or x.kind not in _ENTRY_KINDS}
                    roots.update(entries)
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

    def _entry_cuts(self, tids: list[int], alive: dict[int, Any],
                    parents: dict[int, list[tuple[int, _Step]]],
                    roots_of: dict[int, list[tuple[Root, _Step | None]]],
                    ) -> list[Root] | None:
        """Where a root with no line of its own keeps a storage (``gc.callbacks``, the shell's
        ``user_ns_hidden``, a library's registry), the removal of the entry its path enters:
        ``del gc.callbacks[0]``, one root each; a container whose entries the paths enter
        more than twice is emptied instead (``filters[0].records.clear()``). Checked on the
        graph the search found, not by a rule about the library: the edges each line removes
        are taken out, and the search's paths are walked again until no such root reaches the
        storage (each new path its own entry). None where one of them has no entry a line can
        name, or more than ``_MOST_ENTRIES`` lines would have to go."""
        cut: set[tuple[int, int]] = set()
        emptied: set[int] = set()
        made: dict[int, list[Root]] = {}  # by container id
        while True:
            hit = _stuck_path(tids, parents, roots_of, cut, emptied)
            if hit is None:
                return [root for roots in made.values() for root in roots]
            entry = _entry(hit, alive)
            if entry is None:
                return None
            root, child, container, expr, clearable = entry
            mine = made.setdefault(container, [])
            if container in emptied or (child, container) in cut:
                return None  # no progress: the walk's edges and the graph's disagree
            # A list that holds the tensors themselves is emptied at once: one line for all
            # of them, not an entry each (``filters[0].records.clear()``).
            direct = clearable and child in tids
            if (len(mine) < 2 or not clearable) and not direct:
                mine.append(root)
                cut.add((child, container))
            else:
                line = f"{expr}.clear()"
                mine[:] = [Root(root.kind, expr, f"import {root.module}; {line}"
                                if root.module else line, container=True, module=root.module)]
                emptied.add(container)
            if sum(len(roots) for roots in made.values()) > _MOST_ENTRIES:
                return None

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
            refs = gc.get_referents(obj)
            own = _instance_dict(obj)
            if own is not None and id(own) not in inside and any(r is own for r in refs):
                # An object and its own __dict__ are one node. The dict may have been made
                # after the object was met (reading ``vars(obj)``, this search's own attribute
                # edges, materialise a dict whose values the object held inline): its values
                # were found as the object's, and are counted as its references here.
                refs.extend(gc.get_referents(own))
            own = None
            for c in refs:
                if id(c) in inside:
                    inside[id(c)] += 1
            refs.clear()
        for obj in self._explained:
            for c in gc.get_referents(obj):
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


def _entry(hit: _Hit, alive: Mapping[int, Any],
           ) -> tuple[Root, int, int, str, bool] | None:
    """The builtin container nearest the target on the path whose expression a line can name,
    the line that removes the entry the path goes through (a root), the ids of that entry and
    of its container, the container's expression, and whether emptying it is a line to give:
    only a list an object keeps as an attribute below the root (``filters[0].records``), never
    the registry a root names itself (``gc.callbacks.clear()`` drops every other library's
    callback) nor a dict (``user_ns_hidden``). None where there is none (the path goes
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
        if not _ENTRY_EXPR.fullmatch(expr):
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
        line = f"del {expr}[{text}]"
        code = f"import {root.module}; {line}" if root.module else line
        clearable = type(container) is not dict and k + offset > 0 and (
            above[-1].kind == "attr" or (len(above) > 1 and above[-2].kind == "dict"))
        entry = Root(root.kind, f"{expr}[{text}]", code, module=root.module)
        return entry, chain[k + 1], chain[k], expr, clearable
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
