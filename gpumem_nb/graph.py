"""The memory an autograd graph keeps alive: the tensors its nodes saved for backward.

A tensor with ``grad_fn`` keeps its whole graph alive, and every node keeps what it saved for
the backward pass: a stored loss is 4 bytes, but the activations behind it can be a hundred
GiB. Each node exposes those as ``_raw_saved_<name>`` (a ``SavedTensor``, or a tuple of them),
and a Python ``autograd.Function``'s node also keeps whatever was stored on its ``ctx``.

Looking must change nothing, and reading a ``_saved_<name>`` attribute unpacks it: with
saved-tensor hooks that runs user code (checkpointing recomputes the forward there, offloading
copies back to the GPU). So only ``SavedTensor.data`` is read: the saved tensor itself, or,
behind hooks, whatever the pack hook returned (a tensor is sized; anything else is counted as
not sized). A torch that cannot say whether hooks are set is never unpacked either.

Storages are counted once (by device and data pointer) across one scan: a storage a holder
already owns (a variable, a module's parameters) is not credited to a graph, and a storage two
graphs share goes to the first. A graph's leaves (``AccumulateGrad.variable``: a parameter, or an
input that requires grad) belong to whatever else keeps them: a module a holder owns, or one a
frame, a thread or a module global keeps (then dropping the graph frees only the activations).
Only a leaf nothing but graphs keeps (``del model`` after a forward pass) is the graph's; see
``_leaves_only_graphs_keep`` for how that is told without running any code of the user's.

The walk is bounded in nodes and in time; when cut, its figures are lower bounds. Nothing here
imports torch: tensors are recognised by a function the caller passes in.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .referents import referents

__all__ = ["DEFAULT_BUDGET_S", "DEFAULT_NODE_CAP", "GraphSize", "GraphWalker", "StorageOf"]

# type's own __name__: a metaclass's property of that name never runs.
_TYPE_NAME = type.__dict__["__name__"]

# (device, bytes, storage key) of a tensor, or None for anything else.
StorageOf = Callable[[Any], "tuple[str, int, tuple[str, int]] | None"]

_MISSING = object()
_SEQUENCES = (tuple, list)
# What a saved tensor's hooks keep is searched this deep and this wide (a checkpoint's frame
# keeps its inputs four objects below its unpack hook).
_HOOK_DEPTH = 8
_HOOK_OBJECTS = 4096
_FUNCTION = type(lambda: None)
_MODULE = type(sys)
_NOT_ENTERED = (type, _MODULE, type((lambda: None).__code__), str, bytes, int, float)


def _class_has(t: type, name: str) -> bool:
    """Whether a class defines ``name`` (looked up in the class dicts of its MRO: nothing of
    the class runs)."""
    return any(name in vars(k) for k in t.__mro__)
_CLOCK_EVERY = 32  # nodes between two looks at the clock
DEFAULT_NODE_CAP = 200_000
DEFAULT_BUDGET_S = 0.03


@dataclass(frozen=True)
class GraphSize:
    """What one holder's graphs keep alive, beyond what is counted elsewhere."""

    nodes: int  # nodes walked for this holder (a node shared with an earlier holder: not again)
    bytes_by_device: dict[str, int] = field(default_factory=dict)
    tensors: int = 0  # distinct storages counted
    capped: bool = False  # the walk stopped at its node or time budget: lower bounds
    hooked: int = 0  # saved behind hooks that packed them into something not a tensor
    released: int = 0  # already freed by a backward pass (retain_graph=False)
    unknown: int = 0  # this torch does not say whether hooks are set: left alone
    # Storages this graph saves that an earlier holder counted as its own (a variable that
    # is also a saved input): freeing that holder alone leaves them alive.
    shared: frozenset[tuple[str, int]] = frozenset()
    walk: int = 0  # this walk's number in its walker
    # Earlier walks (by number) whose nodes this one reached: two outputs of one forward
    # share its graph, which the first walk counted; `del` of its holder alone frees none of it.
    shared_walks: frozenset[int] = frozenset()

    @property
    def nbytes(self) -> int:
        return sum(self.bytes_by_device.values())


@dataclass
class _Plan:
    """Per node type: which attributes hold saved tensors."""

    raw_names: tuple[str, ...]
    has_dict: bool  # a Python Function's node: its ctx attributes may hold tensors
    leaf: bool  # AccumulateGrad: ``variable`` is a leaf (a parameter, or an input)


class GraphWalker:
    """One scan's graph walks. Storages in ``seen`` are counted elsewhere; what a walk
    counts is added to it, so the next holder's graph does not count it again.

    The nodes met are kept until the walker is dropped, so no id is reused while it runs.
    """

    def __init__(self, storage_of: StorageOf, seen: set[tuple[str, int]] | None = None, *,
                 exclude: Callable[[Any], bool] | None = None,
                 budget_s: float = DEFAULT_BUDGET_S, node_cap: int = DEFAULT_NODE_CAP,
                 clock: Callable[[], float] = time.perf_counter,
                 judge_leaves: bool = True) -> None:
        self.storage_of = storage_of
        self.seen = seen if seen is not None else set()
        self.exclude = exclude
        self.clock = clock
        self.deadline = clock() + budget_s
        self.node_cap = node_cap
        # Whether a leaf nothing else keeps is counted as the graph's (it may take one pass
        # over the heap); off for a caller that only wants the graph's storage keys.
        self.judge_leaves = judge_leaves
        self.nodes = 0  # over every walk of this scan
        self.elapsed_s = 0.0
        self.out_of_budget = False
        self._walked: dict[int, int] = {}  # node id -> the walk that met it first
        self._walks = 0
        self._held: list[Any] = []
        self._plans: dict[type, _Plan] = {}
        self._leaves: set[tuple[str, int]] = set()
        # This walk's leaves (AccumulateGrad's variables), with the objects themselves held
        # once each (their reference counts are read): a parameter whose module is gone is
        # kept alive by the graph alone (found on the H100: a deleted model's weights behind
        # two outputs' graphs were 99.6% "not found").
        self._walk_leaves: list[tuple[str, int, tuple[str, int]]] = []
        self._leaf_objects: list[Any] = []
        self._leaf_ids: set[int] = set()
        self._leaf_pass_done = False
        self._hook_seen: set[int] = set()  # what saved tensors' hooks keep, entered once
        self._hook_found: set[int] = set()  # packed values and hooks that led to tensors
        self._modules_seen: set[int] | None = None

    def size(self, roots: Iterable[Any]) -> GraphSize:
        """What the graphs behind these ``grad_fn`` nodes keep alive. Never raises."""
        t0 = self.clock()
        if t0 > self.deadline:
            self.out_of_budget = True
        found: list[tuple[str, int, tuple[str, int]]] = []
        self._forget_leaves()
        counts = {"hooked": 0, "released": 0, "unknown": 0}
        walk, self._walks = self._walks, self._walks + 1
        met: set[int] = set()
        stack = []
        for root in roots:
            if root is None:
                continue
            first = self._walked.get(id(root))
            if first is None:
                self._walked[id(root)] = walk
                self._held.append(root)
                stack.append(root)
            elif first != walk:
                met.add(first)
        walked = 0
        capped = False
        while stack:
            if self.out_of_budget or self.nodes >= self.node_cap or (
                    walked % _CLOCK_EVERY == 0 and walked and self.clock() > self.deadline):
                self.out_of_budget = capped = True
                break
            node = stack.pop()
            walked += 1
            self.nodes += 1
            self._saved_by(node, found, counts)
            try:
                edges = tuple(node.next_functions)
            except Exception:
                continue
            for edge in edges:
                try:
                    nxt = edge[0]
                except Exception:
                    continue
                if nxt is None:
                    continue
                first = self._walked.get(id(nxt))
                if first is not None:
                    if first != walk:
                        met.add(first)
                    continue
                self._walked[id(nxt)] = walk
                self._held.append(nxt)
                stack.append(nxt)
        by_device: dict[str, int] = {}
        tensors = 0
        shared: set[tuple[str, int]] = set()
        for device, nbytes, key in found:
            if key in self._leaves:
                continue
            if key in self.seen:
                shared.add(key)
                continue
            self.seen.add(key)
            by_device[device] = by_device.get(device, 0) + nbytes
            tensors += 1
        try:
            mine, unjudged = self._leaves_only_graphs_keep()
        finally:
            self._forget_leaves()
        capped = capped or unjudged
        for device, nbytes, key in mine:
            if key in self.seen:
                continue
            self.seen.add(key)
            by_device[device] = by_device.get(device, 0) + nbytes
            tensors += 1
        self.elapsed_s += self.clock() - t0
        return GraphSize(nodes=walked, bytes_by_device=by_device, tensors=tensors,
                         capped=capped, shared=frozenset(shared), walk=walk,
                         shared_walks=frozenset(met), **counts)

    # -- leaves ------------------------------------------------------------------------------
    def _forget_leaves(self) -> None:
        self._walk_leaves = []
        self._leaf_objects = []
        self._leaf_ids = set()

    def _leaves_only_graphs_keep(self) -> tuple[list[tuple[str, int, tuple[str, int]]], bool]:
        """This walk's leaves that no holder took and that nothing but graphs keeps alive,
        and whether some were left unjudged (the time ran out first).

        A leaf's Python object is referred to by whatever keeps its module (the module's
        ``_parameters`` dict, an optimizer's param list) and by C++ only through the tensor
        it wraps: since PyTorch's PyObject preservation, a tensor's C++ object holds at most
        one reference to its Python object (while anything in C++, here AccumulateGrad, keeps
        the tensor), and before it none (the reference ``variable`` returned was handed over).
        So, beyond our own two (the list that holds it here, getrefcount's argument):

        - two or more: something besides the graph keeps it (a live module, an optimizer);
        - none: only the graph (C++ handed its reference to us);
        - one: the graph's (C++, or a fake graph's slot), or, where C++ holds none, one
          Python referrer. One ``gc.get_referrers`` pass (C code, no user code runs) over
          these few tells them apart: a referrer that is not a node of the walked graphs.

        A reference Python cannot see (a running frame's own local, with no frame object)
        is taken for the graph's; only with torch before PyObject preservation can it be the
        only reference, and then dropping the graph would not free the leaf."""
        infos, objs = self._walk_leaves, self._leaf_objects
        if not infos:
            return [], False
        mine: list[tuple[str, int, tuple[str, int]]] = []
        ambiguous: list[int] = []
        for i, info in enumerate(infos):
            if info[2] in self.seen:
                continue  # its owner (a module, a variable) was found: not the graph's
            # Held by ``objs`` and by getrefcount's own argument; no local names it.
            others = sys.getrefcount(objs[i]) - 2
            if others == 0:
                mine.append(info)
            elif others == 1:
                ambiguous.append(i)
        if not ambiguous:
            return mine, False
        if not self.judge_leaves or self.clock() > self.deadline:
            return mine, True
        wanted = {id(objs[i]) for i in ambiguous}
        args = tuple(objs[i] for i in ambiguous)
        ours = {id(objs), id(args), id(self._held), id(self.__dict__)}
        kept: set[int] = set()
        started = self.clock()
        try:
            refs = gc.get_referrers(*args)
        except Exception:
            return mine, True
        if not self._leaf_pass_done:
            # One pass over the heap (C code, about 20 ms for 400,000 objects) is not the
            # walk's: the first one leaves the later holders' walks their time.
            self._leaf_pass_done = True
            self.deadline += self.clock() - started
        try:
            for r in refs:
                if id(r) in ours or id(r) in self._walked:
                    continue  # this walk's own records, or a node of the graphs walked
                kept.update(id(c) for c in referents(r) if id(c) in wanted)
        finally:
            refs.clear()
            args = ()
        mine.extend(infos[i] for i in ambiguous if id(objs[i]) not in kept)
        return mine, False

    # -- one node ----------------------------------------------------------------------------
    def _plan(self, node: Any) -> _Plan:
        kind = type(node)
        plan = self._plans.get(kind)
        if plan is None:
            try:
                names = dir(node)
            except Exception:
                names = []
            plan = _Plan(raw_names=tuple(n for n in names if n.startswith("_raw_saved_")),
                         has_dict="__dict__" in names,
                         leaf="variable" in names and
                         not _TYPE_NAME.__get__(kind).endswith("Backward"))
            self._plans[kind] = plan
        return plan

    def _saved_by(self, node: Any, found: list[tuple[str, int, tuple[str, int]]],
                  counts: dict[str, int]) -> None:
        try:
            plan = self._plan(node)
            if plan.leaf:
                var = getattr(node, "variable", None)
                info = self.storage_of(var)
                if info is not None:
                    self._leaves.add(info[2])
                    if id(var) not in self._leaf_ids:
                        self._leaf_ids.add(id(var))
                        self._walk_leaves.append(info)
                        self._leaf_objects.append(var)
                var = None
            for name in plan.raw_names:
                raw: Any = getattr(node, name, None)
                for item in (raw if type(raw) in _SEQUENCES else (raw,)):
                    self._saved_tensor(item, found, counts)
            if plan.has_dict:
                attrs = getattr(node, "__dict__", None)
                if type(attrs) is dict:
                    for value in list(attrs.values()):
                        self._tensors(value, found)
        except Exception:
            counts["unknown"] += 1

    def _saved_tensor(self, item: Any, found: list[tuple[str, int, tuple[str, int]]],
                      counts: dict[str, int]) -> None:
        if item is None:
            return
        hook = getattr(item, "unpack_hook", _MISSING)
        data = getattr(item, "data", _MISSING)
        if hook is _MISSING or data is _MISSING:
            counts["unknown"] += 1  # unpacking could run hooks: left alone
            return
        if data is None:
            counts["released"] += 1
            return
        if self._tensors(data, found) or hook is None:
            return
        # Packed into something not a tensor (checkpointing's holder): what the pack and
        # unpack hooks keep is the graph's too. Non-reentrant checkpointing's unpack hook
        # closes over its frame, whose recomputation closes over the inputs: 34 GiB of them
        # were "not found" on the H200.
        if not self._hook_tensors((data, hook), found):
            counts["hooked"] += 1

    def _hook_tensors(self, start: Any, found: list[tuple[str, int, tuple[str, int]]]) -> bool:
        """The tensors a saved tensor's packed value and unpack hook keep, found through the
        collector's traversal (C code: no code of theirs runs), ``_HOOK_DEPTH`` objects down,
        at most ``_HOOK_OBJECTS`` objects. Classes, modules, code and a function's globals
        are not entered: they are everyone's, not the graph's."""
        any_found = False
        seen = self._hook_seen
        level = [start]
        for _ in range(_HOOK_DEPTH):
            nxt: list[Any] = []
            for obj in referents(*level):
                if id(obj) in seen:
                    # Entered by an earlier saved tensor's hooks (one checkpoint's frame
                    # serves all its saved tensors): what it keeps is counted already.
                    any_found = any_found or id(obj) in self._hook_found
                    continue
                if issubclass(type(obj), _NOT_ENTERED) or len(seen) >= _HOOK_OBJECTS:
                    continue
                seen.add(id(obj))
                if self._tensors(obj, found) or self._saved_in(obj, found):
                    any_found = True
                    continue
                if type(obj) is _FUNCTION:
                    # Its closure, defaults and attributes; never its globals (the module's).
                    nxt.extend(x for x in (obj.__closure__, obj.__defaults__,
                                           obj.__kwdefaults__, obj.__dict__) if x)
                    continue
                if type(obj) is dict and id(obj) in self._module_dicts():
                    continue
                nxt.append(obj)
            level.clear()
            level = nxt
            if not level:
                break
        level.clear()
        if any_found:
            self._hook_found.update(id(x) for x in start)
        return any_found

    def _saved_in(self, obj: Any, found: list[tuple[str, int, tuple[str, int]]]) -> bool:
        """The tensors a ``SavedTensor``, or an autograd node met on the way (checkpointing
        saves its inputs on a node of its own), saved, read as ``_saved_tensor`` reads them:
        its ``data``, never unpacked."""
        t = type(obj)
        if _class_has(t, "unpack_hook") and _class_has(t, "data"):
            data = getattr(obj, "data", None)
            return data is not None and self._tensors(data, found)
        if not _class_has(t, "next_functions"):
            return False
        any_found = False
        for name in self._plan(obj).raw_names:
            raw: Any = getattr(obj, name, None)
            for item in (raw if type(raw) in _SEQUENCES else (raw,)):
                data = getattr(item, "data", None) if item is not None else None
                if data is not None and self._tensors(data, found):
                    any_found = True
        return any_found

    def _module_dicts(self) -> set[int]:
        if self._modules_seen is None:
            self._modules_seen = {id(vars(m)) for m in list(sys.modules.values())
                                  if type(m) is _MODULE}
        return self._modules_seen

    def _tensors(self, value: Any, found: list[tuple[str, int, tuple[str, int]]]) -> bool:
        """Add the tensor ``value`` is, or the tensors a tuple or list of it holds."""
        any_found = False
        for v in (value if type(value) in _SEQUENCES else (value,)):
            info = self.storage_of(v)
            if info is None or (self.exclude is not None and self.exclude(v)):
                continue
            found.append(info)
            any_found = True
        return any_found
