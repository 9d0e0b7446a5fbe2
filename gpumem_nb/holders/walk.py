"""The bounded walk down from one object to the tensors and arrays inside it, each with its
path (``.layers[3].cache['k']``).

Modules, optimizers and builtin containers are read ``CONTAINER_DEPTH`` levels down; objects
of any other class (their ``__dict__``, ``__slots__``, a function's closure cells and defaults,
a suspended generator's locals, a user class's class attributes) ``_OBJECT_DEPTH`` objects down.
Bounded per scan in objects entered and in time; where a bound cut a holder's walk its bytes
are a lower bound, and the walk says so.

User objects can be anything (properties that raise, proxies, containers that override
iteration, cycles, millions of items), so every look at one is contained, containers are read
through their base type's own iterator, and sizes are capped.
"""

from __future__ import annotations

import collections
import itertools
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

from .. import userexc
from ..referents import referents
from .facts import TensorFacts, TensorInfo
from .peek import (
    ATOM_IDS,
    ATOM_TYPES,
    CLASS_MEMBERS,
    LRU_LINK,
    LRU_WRAPPER,
    PLAIN_IDS,
    attr_step,
    attribute_plan,
    class_reference,
    container_items,
    container_len,
    is_a,
    is_atom,
    key_step,
    user_class,
)
from .reading import MISSING, type_name
from .stored import finished_frame_locals
from .tensors import own_item

__all__ = ["CONTAINER_DEPTH", "OBJECT_CAP", "WALK_BUDGET_S", "WALK_STOP_FACTOR", "ObjectWalk"]

# A suspended generator's or coroutine's frame keeps its locals (`batch = ...; yield`).
_SUSPENDABLE = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)
_SUSPENDABLE_IDS = frozenset(map(id, _SUSPENDABLE))
# What a module's own dict holds that is not a tensor it owns: children and parameters are
# walked as the module's, hooks and plain attributes (`self.last = out`) as its contents.
_MODULE_OWN = frozenset(("_parameters", "_buffers", "_modules"))
_EMPTY_CHECK_IDS = frozenset(map(id, (dict, list, set, tuple, collections.OrderedDict)))
_DICT_IDS = frozenset(map(id, (dict, collections.OrderedDict)))
CONTAINER_DEPTH = 2
_PEEK_ITEMS = 8  # items looked at in a container past those levels, to say ≥ or not
# A container longer than this is read up to here: a tensor past a million items is missed
# rather than `who` taking minutes over a list of ten million objects.
_MAX_ITEMS = 1_000_000
# Objects of any class are entered (instance ``__dict__``, ``__slots__``, closure cells) this
# many objects deep, each one's attributes then read as a holder's own are (``CONTAINER_DEPTH``
# levels of containers): a transformers KV cache sits at
# ``model_kwargs['past_key_values'].layers[i].keys``. Bounded per scan in objects and time;
# where a bound cut the walk, the holder's bytes are marked as a lower bound.
_OBJECT_DEPTH = 5
OBJECT_CAP = 200_000
WALK_BUDGET_S = 0.05
# Past the budget no more objects are entered; past this many times it no container's items
# are read either (but a frame's locals): 300,000 objects in a list took seconds to pass over
# once nothing could be entered any more.
WALK_STOP_FACTOR = 2
_SHARED_CAP = 64  # pairs of holders checked for a second reference, per scan


class ObjectWalk:
    """One scan's walk: what it entered and who entered it first (so that a second holder
    reaching the same object is known as one more reference to it), its bounds, and the
    current holder's path classes and cut. ``_tensors_in`` yields each tensor with its path;
    the tensor's facts, read on the way, are kept in ``_last_info`` for the consumer."""

    # Read per object: bound once to the facts' own methods, no call between.
    _tensor_info: Callable[[Any], TensorInfo | None]
    _grad_of: Callable[[Any], Any]

    def __init__(self, facts: TensorFacts, *, walk_budget_s: float = WALK_BUDGET_S,
                 object_cap: int = OBJECT_CAP) -> None:
        self.facts = facts
        self._tensor_info = facts.info
        self._grad_of = facts.grad_of
        self._tensor_type: Any = facts.tensor_type
        self._module_type: Any = facts.module_type
        self._optimizer_type: Any = facts.optimizer_type
        self.walk_budget_s = walk_budget_s
        self.object_cap = object_cap
        # Modules whose tensors this holder's walk has yielded: a hook or a child that refers
        # back to its model (transformers' output recorders do) would enumerate every
        # parameter again per reference (the H200's GPT-2 scan went from 5 to 20-46 ms).
        self._modules_walked: set[int] = set()
        self._grad_ids: set[int] = set()  # this walk's gradients, to count them apart
        # The tensor the walk last handed on, with its (device, bytes, key).
        self._last_info: tuple[Any, Any] = (MISSING, None)
        self._entered: set[int] = set()
        # The roots themselves (the namespace, the output cache, the shell that keeps them):
        # never walked into from a variable, or one variable took another's tensors through
        # them (``pool._pool[0]._stderr.write`` closure 'self', the shell, its ``user_ns``).
        self._boundary: set[int] = set()
        # Who entered each object, so that another holder reaching the same object is known
        # as a second reference to it: `del ds` alone frees nothing while `dl.dataset` is `ds`.
        self._entered_by: dict[int, str] = {}
        self._shared: dict[tuple[str, str], Any] = {}
        self._walking = ""
        self._entered_n = 0
        self._walk_deadline = 0.0
        self._cut = False  # the current holder's walk was cut by a bound
        self._namespace_root = False  # the holder is a frame's locals: keys are local names
        self._path_classes: dict[tuple[str, ...], str] = {}
        # Keyed by the class's id (hashing a class may run its metaclass's code), the class
        # kept with its plan so that the id stays its own.
        self._plans: dict[int, tuple[type, tuple[Any, tuple[tuple[str, Any], ...]]]] = {}
        self._stop_at = 0.0  # past this, the scan reads no more container items
        self._stopped = False
        self.walk_capped = False  # some holder's object walk was cut this scan

    def _reset_walk(self) -> None:
        """A new scan: nothing entered yet, the bounds started afresh."""
        self._shared.clear()
        self._entered_by.clear()
        self._entered.clear()
        self._entered_n = 0
        self.walk_capped = False
        self._start_walk()

    def _begin_holder(self, name: str, namespace_root: bool) -> None:
        """The next holder's walk: its own cut, path classes, modules and gradients."""
        self._cut = False
        self._namespace_root = namespace_root
        self._path_classes = {}
        self._modules_walked = set()
        self._grad_ids = set()
        self._walking = name

    def _tensors_in(self, obj: Any, depth: int, path: tuple[str, ...] = (),
                    objdepth: int = _OBJECT_DEPTH) -> Iterator[tuple[Any, tuple[str, ...]]]:
        """Tensors inside obj, each with its path: modules, optimizers and containers
        ``depth`` levels down; objects of any other class (their ``__dict__``, ``__slots__``,
        a function's closure cells) ``objdepth`` objects down, each starting the container
        levels afresh."""
        if id(type(obj)) in PLAIN_IDS:  # the common case, and never a tensor or module
            if id(obj) in self._boundary:
                return
            if depth > 0:
                yield from self._items_in(obj, depth, path, objdepth)
            else:
                self._note_unread(obj)
            return
        if is_atom(obj):
            return
        info = self._tensor_info(obj)
        if info is not None:
            # Handed to the walk's consumer with the tensor: read once, not twice.
            self._last_info = (obj, info)
            yield obj, path
            # Only leaves have a .grad; asking a non-leaf makes torch warn.
            if is_a(obj, self._tensor_type):
                grad = self._grad_of(obj)
                if grad is not None:
                    self._grad_ids.add(id(grad))
                    yield grad, (*path, ".grad")
            return
        if is_a(obj, self._module_type):
            if id(obj) in self._modules_walked:
                return
            self._modules_walked.add(id(obj))
            yield from self._module_tensors(obj, path)
            if objdepth > 0:
                yield from self._module_contents(obj, path, objdepth)
            return
        if is_a(obj, self._optimizer_type):
            yield from self._optimizer_tensors(obj, path)
            return
        if container_items(obj) is not None:  # a subclass of a builtin container
            if depth > 0:
                yield from self._items_in(obj, depth, path, objdepth)
            else:
                self._note_unread(obj)
            return
        if self.facts.is_graph_node(obj):
            # A node kept on its own (`graph_roots.append(loss.grad_fn)`) keeps every tensor
            # its graph saved, and those have no Python object to be found by: handed on
            # as it is, for the consumer to size its graph as this holder's.
            if self._enter(obj):
                yield obj, path
            return
        if objdepth > 0:
            self._path_classes.setdefault(path, type_name(type(obj)))
            yield from self._attributes_of(obj, path, objdepth)

    def _items_in(self, obj: Any, depth: int, path: tuple[str, ...],
                  objdepth: int) -> Iterator[tuple[Any, tuple[str, ...]]]:
        # Exact-type set lookups first: containers of plain numbers and strings (the common
        # million-element case) cost one hash probe per item, and a plain container at the
        # last level holds nothing that is looked at. The item's path is made only for an
        # item that is looked into.
        atoms, plain, last = ATOM_IDS, PLAIN_IDS, depth == 1
        # Past the scan's stop a container is read up to its 1,024th item (small ones, and
        # frame locals, in full): the walk ends soon, yet a tensor kept in a short list next
        # to a namespace of millions of objects is still found.
        bounded = bool(path) or not self._namespace_root
        t = type(obj)
        if issubclass(t, dict):
            if dict.__len__(obj) > _MAX_ITEMS:
                self._cut = True
            i = -1
            for key, item in itertools.islice(dict.items(obj), _MAX_ITEMS):
                i += 1
                if bounded and i & 1023 == 1023 and self._past_stop():
                    return
                kind = id(type(item))
                if kind in atoms:
                    continue
                if last and kind in plain:
                    self._note_unread(item)
                    continue
                step = key if (not path and self._namespace_root and type(key) is str) \
                    else key_step(key)
                yield from self._tensors_in(item, depth - 1, (*path, step), objdepth)
            return
        items = container_items(obj)
        if items is None:
            return
        if container_len(obj) > _MAX_ITEMS:
            self._cut = True
        ordered = not issubclass(t, (set, frozenset))
        i = -1
        for item in itertools.islice(items, _MAX_ITEMS):
            i += 1
            if bounded and i & 1023 == 1023 and self._past_stop():
                return
            kind = id(type(item))
            if kind in atoms:
                continue
            if last and kind in plain:
                self._note_unread(item)
                continue
            yield from self._tensors_in(item, depth - 1,
                                        (*path, f"[{i}]" if ordered else "{…}"), objdepth)

    def _start_walk(self) -> None:
        now = time.perf_counter()
        self._walk_deadline = now + self.walk_budget_s
        self._stop_at = now + WALK_STOP_FACTOR * self.walk_budget_s
        self._stopped = False

    def _note_unread(self, container: Any) -> None:
        """A container past the walk's container levels is not read; if its first few items
        are not all plain numbers or strings it may hold tensors, so the holder's bytes are a
        lower bound (``[{"logits": t}]`` inside a list was missed without a word)."""
        if not self._cut and any(id(type(x)) not in ATOM_IDS
                                 for x in itertools.islice(container_items(container) or (),
                                                           _PEEK_ITEMS)):
            self._cut = True

    def _past_stop(self) -> bool:
        """Whether the scan is past its stop (then the current holder's walk is cut)."""
        if self._stopped or time.perf_counter() > self._stop_at:
            self._stopped = self._cut = True
        return self._stopped

    def _note_shared(self, obj: Any) -> None:
        """The holder being walked reaches an object another holder entered first: a second
        reference to that holder's bytes if the object leads to them, which is checked once
        the scan is done (a shared configuration object holds none)."""
        owner = self._entered_by.get(id(obj))
        if owner is not None and owner != self._walking and \
                (owner, self._walking) not in self._shared and len(self._shared) < _SHARED_CAP:
            self._shared[(owner, self._walking)] = obj

    def _enter(self, obj: Any) -> bool:
        """Whether to walk into this object: once per scan, within the scan's bounds."""
        if id(obj) in self._entered:
            self._note_shared(obj)
            return False
        if self._entered_n >= self.object_cap or (
                self._entered_n % 64 == 0 and time.perf_counter() > self._walk_deadline):
            self._cut = True
            return False
        self._entered.add(id(obj))
        self._entered_by[id(obj)] = self._walking
        self._entered_n += 1
        return True

    def _plan_of(self, t: type) -> tuple[Any, tuple[tuple[str, Any], ...]]:
        """The class's own C descriptors for an instance's ``__dict__`` and slots: reading
        them runs no code of the class (no property, no ``__getattr__`` or
        ``__getattribute__``)."""
        cached = self._plans.get(id(t))
        if cached is not None and cached[0] is t:
            return cached[1]
        plan = attribute_plan(t)
        self._plans[id(t)] = (t, plan)
        return plan

    def _attributes_of(self, obj: Any, path: tuple[str, ...],
                       objdepth: int) -> Iterator[tuple[Any, tuple[str, ...]]]:
        if (LRU_LINK is not None and type(obj) is LRU_LINK) or id(obj) in self._boundary or \
                not self._enter(obj):
            return
        if id(type(obj)) in _SUSPENDABLE_IDS:
            yield from self._suspended_locals(obj, path, objdepth)
            return
        if LRU_WRAPPER is not None and type(obj) is LRU_WRAPPER:
            results = (*path, " lru_cache results")
            # Named, so that the holder's path keeps this step down to the results (the
            # advice, `.cache_clear()`, rests on it).
            self._path_classes.setdefault(results, "functools.lru_cache")
            yield from self._referents(obj, results, objdepth)
            return
        if type(obj) is types.FunctionType:
            cells = obj.__closure__ or ()
            names = obj.__code__.co_freevars
            for name, cell in zip(names, cells, strict=False):
                try:
                    value = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                if not is_atom(value) or type(value) is types.FunctionType:
                    yield from self._tensors_in(value, CONTAINER_DEPTH,
                                                (*path, f" closure '{name}'"), objdepth - 1)
            # A default binds as a closure does: `lambda m, i, o, feats=feats:
            # feats.append(o)` is a common way to write a hook that keeps outputs.
            # A hook's `model=model` default is the module already walked: skipped here,
            # as most defaults (numbers, None) are, without a walk of their own (2,000 such
            # hooks cost 12 ms more on a 66 ms scan).
            walked = self._modules_walked
            for i, value in enumerate(obj.__defaults__ or ()):
                if id(type(value)) not in ATOM_IDS and id(value) not in walked:
                    yield from self._tensors_in(value, CONTAINER_DEPTH - 1,
                                                (*path, f" default [{i}]"), objdepth - 1)
            kwdefaults = obj.__kwdefaults__
            if kwdefaults:
                yield from self._tensors_in(kwdefaults, CONTAINER_DEPTH,
                                            (*path, " keyword defaults"), objdepth - 1)
            return
        dict_desc, slots = self._plan_of(type(obj))
        if dict_desc is not None:
            try:
                attrs = dict_desc.__get__(obj)
            except Exception:
                attrs = None
            if type(attrs) is dict:
                for name, value in list(attrs.items()):
                    if id(type(value)) in ATOM_IDS:
                        continue
                    yield from self._tensors_in(value, CONTAINER_DEPTH,
                                                (*path, attr_step(name)), objdepth - 1)
        for name, desc in slots:
            try:
                value = desc.__get__(obj)
            except Exception:  # an unset slot
                continue
            yield from self._tensors_in(value, CONTAINER_DEPTH, (*path, f".{name}"),
                                        objdepth - 1)
        if userexc.is_exception(obj):
            # An exception kept in a variable keeps its traceback's frames, and their locals
            # (`except E as e: err = e`); its cause and context chain on. Read
            # through C descriptors (userexc), never the exception's own code.
            for tb_name, frame_locals in finished_frame_locals([obj]):
                yield from self._items_in(frame_locals, CONTAINER_DEPTH,
                                          (*path, f" {tb_name}"), objdepth - 1)
        klass = type(obj)
        if user_class(klass) and self._enter(klass):
            # A class-level attribute (`class C: cache = []`) is reachable from every
            # instance through its type; entered once per scan, from the first instance.
            try:
                ns = type.__dict__["__dict__"].__get__(klass)
            except Exception:
                ns = {}
            owner = class_reference(klass)
            for name, value in list(ns.items()):
                if type(name) is not str or name.startswith("__") or \
                        type(value) in ATOM_TYPES or isinstance(value, CLASS_MEMBERS):
                    continue
                step = (*path, f" class {owner}.{name}")
                # Said with the path: `.clear()` fits a list, `= None` anything else.
                self._path_classes.setdefault(step, type_name(type(value)))
                yield from self._tensors_in(value, CONTAINER_DEPTH, step, objdepth - 1)

    def _own_dict(self, obj: Any) -> dict[Any, Any] | None:
        """An object's own ``__dict__``, by its class's C descriptor (``_plan_of``)."""
        dict_desc, _ = self._plan_of(type(obj))
        if dict_desc is None:
            return None
        try:
            attrs = dict_desc.__get__(obj)
        except Exception:
            return None
        return attrs if type(attrs) is dict else None

    def _module_tensors(self, obj: Any,
                        path: tuple[str, ...]) -> Iterator[tuple[Any, tuple[str, ...]]]:
        """A module's and its children's parameters (each with its gradient), then their
        buffers, as ``parameters()`` and ``buffers()`` yield them, read where torch keeps
        them: each module's own ``__dict__['_parameters']``, ``['_buffers']`` and
        ``['_modules']``, through the C ``__dict__`` descriptor, keys compared only as exact
        strs. Calling ``parameters()`` ran a subclass's override or property: a counting one
        ran 6 times over the looks of one session, an endless one made the OOM cell take
        21.5 s. Each module once (a cycle of children too); at most ``_MAX_ITEMS`` modules
        and items per dict, and past the scan's stop only up to the 1,024th module."""
        owned: list[tuple[Any, Any]] = []
        stack: list[Any] = [obj]
        seen: set[int] = set()
        module_type = self._module_type
        while stack:
            m = stack.pop()
            if id(m) in seen:
                continue
            if len(seen) >= _MAX_ITEMS or (len(seen) & 1023 == 1023 and self._past_stop()):
                self._cut = True
                break
            seen.add(id(m))
            attrs = self._own_dict(m)
            if attrs is None:
                continue
            params = buffers = children = None
            for key, value in list(attrs.items()):
                if type(key) is not str or key not in _MODULE_OWN or \
                        not issubclass(type(value), dict):
                    continue
                if key == "_parameters":
                    params = value
                elif key == "_buffers":
                    buffers = value
                else:
                    children = value
            owned.append((params, buffers))
            if children is not None:
                if dict.__len__(children) > _MAX_ITEMS:
                    self._cut = True
                stack.extend(reversed([c for c in itertools.islice(dict.values(children),
                                                                   _MAX_ITEMS)
                                       if is_a(c, module_type)]))
        self._modules_walked.update(seen)
        for params, _ in owned:
            for p in self._dict_values(params):
                yield p, path
                grad = self._grad_of(p)
                if grad is not None:
                    self._grad_ids.add(id(grad))
                    yield grad, path
        for _, buffers in owned:
            for b in self._dict_values(buffers):
                yield b, path

    def _dict_values(self, d: Any) -> list[Any]:
        """A dict's values that are not None, by ``dict``'s own iterator, at most
        ``_MAX_ITEMS`` (past which the holder's walk is cut); a copy, so that another thread
        that changes the dict while the walk yields cannot end it."""
        if d is None:
            return []
        if dict.__len__(d) > _MAX_ITEMS:
            self._cut = True
        return [v for v in itertools.islice(dict.values(d), _MAX_ITEMS) if v is not None]

    def _optimizer_tensors(self, obj: Any,
                           path: tuple[str, ...]) -> Iterator[tuple[Any, tuple[str, ...]]]:
        """An optimizer's state tensors, from its own ``__dict__['state']`` (torch's
        ``defaultdict`` of one dict per parameter) through the C descriptor: ``obj.state``
        ran a subclass's property, and ``.values()`` a state dict subclass's override."""
        attrs = self._own_dict(obj)
        state = own_item(attrs, "state") if attrs is not None else MISSING
        if not issubclass(type(state), dict):
            return
        for i, per_param in enumerate(self._dict_values(state)):
            if i & 1023 == 1023 and self._past_stop():
                return
            if not issubclass(type(per_param), dict):
                continue
            for v in self._dict_values(per_param):
                if self._tensor_info(v) is not None:
                    yield v, path

    def _module_contents(self, obj: Any, path: tuple[str, ...],
                         objdepth: int) -> Iterator[tuple[Any, tuple[str, ...]]]:
        """What a module and its children keep besides parameters and buffers: a tensor set as
        a plain attribute, and what hooks keep (a forward hook's closure appending every
        output to a list: 60 GiB of them went unfound on the H200). Children are found as
        torch keeps them, in each module's own ``__dict__['_modules']`` read through the
        ``__dict__`` descriptor, in
        ``named_modules()``'s order: calling ``named_modules`` ran a subclass's override or
        property, and one yielding millions of modules took seconds past every bound."""
        stack: list[tuple[str, Any]] = [("", obj)]
        while stack:
            name, m = stack.pop()
            if not self._enter(m):
                if id(m) not in self._entered:  # refused by a bound, not seen before
                    return
                continue
            # A child's parameters came with its root's (``parameters()`` recurses): another
            # reference to it inside this holder enumerates nothing again.
            self._modules_walked.add(id(m))
            dict_desc, _ = self._plan_of(type(m))
            try:
                attrs = dict_desc.__get__(m) if dict_desc is not None else None
            except Exception:
                attrs = None
            if type(attrs) is not dict:
                continue
            where = (*path, f".{name}") if name else path
            for key, value in list(attrs.items()):
                kind = id(type(value))
                # Keys compared only as exact strs: a dict lookup or a set test would run a
                # key's own ``__hash__``/``__eq__`` (``obj.__dict__[k] = ...``).
                if type(key) is str and key in _MODULE_OWN:
                    if key == "_modules" and kind in _DICT_IDS:
                        stack.extend(reversed([
                            (f"{name}.{k}" if name else k, child)
                            for k, child in itertools.islice(dict.items(value), _MAX_ITEMS)
                            if type(k) is str and is_a(child, self._module_type)]))
                    continue
                if kind in ATOM_IDS:
                    continue
                # Most of a module's dict is a dozen empty hook dicts: skipped for the price of
                # a length (exact builtin types: no user code), as the walk runs on every OOM.
                if kind in _EMPTY_CHECK_IDS and not len(value):
                    continue
                yield from self._tensors_in(value, CONTAINER_DEPTH, (*where, attr_step(key)),
                                            objdepth - 1)

    def _suspended_locals(self, gen: Any, path: tuple[str, ...],
                          objdepth: int) -> Iterator[tuple[Any, tuple[str, ...]]]:
        """A suspended generator's or coroutine's locals, read as the garbage collector
        reads them (its traversal, C code): asking for ``gi_frame`` would make a frame
        object, and reading its ``f_locals`` a snapshot that keeps the locals alive past
        the generator's end."""
        if getattr(gen, "gi_running", None) or getattr(gen, "cr_running", None) or \
                getattr(gen, "ag_running", None):
            # Running (the scan is called from inside it, as the OOM observer is from a
            # training loop written as a generator): its locals are the code's working set,
            # as a running function's are, and `del` could not free them.
            return
        code = getattr(gen, "gi_code", None) or getattr(gen, "cr_code", None) or \
            getattr(gen, "ag_code", None)
        label = f" suspended {getattr(code, 'co_name', '?')}() locals"
        yield from self._referents(gen, (*path, label), objdepth)

    def _referents(self, obj: Any, path: tuple[str, ...],
                   objdepth: int) -> Iterator[tuple[Any, tuple[str, ...]]]:
        """What a C object refers to, by its own traversal (no Python code runs), skipping
        code, names and functions (a function's globals are a whole module)."""
        try:
            refs = referents(obj)
        except Exception:
            return
        if len(refs) > _MAX_ITEMS:
            self._cut = True
        # A bounded lru_cache of a million entries is two million referents (its keys and
        # results): read within the scan's stop as a container's items are, else it took
        # seconds and missed a tensor past its bounds without a word.
        for i, value in enumerate(itertools.islice(refs, _MAX_ITEMS)):
            if i & 1023 == 1023 and self._past_stop():
                return
            # `object()`: lru_cache's keyword marker, which holds nothing and would name
            # the path's class "object".
            if id(type(value)) in ATOM_IDS or type(value) is types.FunctionType or \
                    type(value) is object:
                continue
            yield from self._tensors_in(value, CONTAINER_DEPTH, path, objdepth - 1)

    def tensors_of(self, obj: Any) -> list[tuple[Any, tuple[str, ...]]]:
        """The tensors inside one object with their paths, by the scan's own walk and
        bounds (a fresh walk: nothing an earlier scan entered is skipped)."""
        self._entered.clear()
        self._entered_n = 0
        self._start_walk()
        try:
            return list(self._tensors_in(obj, CONTAINER_DEPTH))
        except Exception:
            return []
        finally:
            self._forget()

    def _forget(self) -> None:
        """Drop the walk's memo of the last tensor handed on: a look keeps nothing alive."""
        self._last_info = (MISSING, None)

    def _forget_classes(self) -> None:
        """Drop the per-class memos (each keeps its class, and a class's descriptors keep it
        too). Before a retention search: a class made in a function, kept by the memo, was a
        referrer no root explains, and its instance's holder was said "unseen"."""
        self._plans.clear()
        self.facts.forget_classes()

    # -- whole scans -------------------------------------------------------------------------
