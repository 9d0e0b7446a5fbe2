"""The retention search's last step: from the parents it found to each storage's roots, its
shortest path in the words a user types, the container a ``clear()`` empties, and the classes
of the cycles that keep what nothing reaches."""

from __future__ import annotations

import gc
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
from .roots import Root


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
