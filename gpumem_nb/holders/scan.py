"""Who holds memory: tensors reachable from the user's namespace, the output cache and the
stored exception of a failed cell, each attributed once, largest first.

Runs only on demand and on the main thread (it walks user objects, which may change under a
background thread). torch is looked up in ``sys.modules`` and never imported: without torch
there are no tensors, and numpy-like arrays are still reported as host memory.

Attribution order decides whose name a shared tensor gets: a user variable first (deleting it
is what frees the memory), then the output cache, then the stored traceback, then anything
found only through the garbage collector.

Looking must never break or change anything. User objects can be anything (properties that
raise, proxies, containers that override iteration, cycles, millions of items), so every look
at one is contained, containers are read through their base type's own iterator, and sizes are
capped. Live frames (running, or a suspended generator's) are never read: in Python <= 3.12
reading ``f_locals`` stores a snapshot on the frame that keeps its locals alive.
"""

from __future__ import annotations

import builtins
import collections
import contextlib
import functools
import gc
import inspect
import itertools
import re
import sys
import time
import types
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from itertools import compress
from typing import Any

from .. import userexc
from ..cellnames import CellNames, is_cell_top
from ..graph import GraphWalker
from ..model import Holder
from . import retention
from .named import KIND_NOT_SEARCHED, holder_groups, pandas_name
from .reading import MISSING as _MISSING
from .reading import UNDERS, running_frame_ids, static_attribute, type_name
from .retention import RootContext, Search
from .tensors import TensorReader, own_item, sizes
from .threads import thread_locals
from .verify import check_cuts, checked

# Names the shell itself keeps and reads; what each is, for messages.
SHELL_NAMES = {
    "In": "input history", "_ih": "input history", "Out": "output cache",
    "_oh": "output cache", "_dh": "directory history", "get_ipython": "shell accessor",
    "exit": "exit command", "quit": "exit command", "__builtin__": "builtins module",
    "__builtins__": "builtins module", "__name__": "module name", "__doc__": "module doc",
    "__loader__": "module loader", "__spec__": "module spec", "__package__": "module package",
}
OUTPUT_ALIAS = re.compile(r"^(_|__|___|_\d+)$")
INPUT_ALIAS = re.compile(r"^_i\d*$|^_ii+$")
_ATOMS = (int, float, complex, str, bytes, bool, type(None), types.ModuleType, type,
          types.BuiltinFunctionType, types.CodeType, types.FrameType, types.TracebackType,
          range,
          types.MethodWrapperType, types.WrapperDescriptorType, types.MemberDescriptorType,
          types.GetSetDescriptorType, property, staticmethod, classmethod, memoryview,
          bytearray)
_ATOM_TYPES = frozenset(_ATOMS)
# A suspended generator's or coroutine's frame keeps its locals (`batch = ...; yield`).
_SUSPENDABLE = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)
_SUSPENDABLE_IDS = frozenset(map(id, _SUSPENDABLE))
# functools' C cache of results, which no attribute exposes.
_LRU_WRAPPER: type | None = type(functools.lru_cache(maxsize=None)(lambda: None))


def _lru_link_type() -> type | None:
    """The C type of a bounded lru_cache's entries (its cache dict's values), which hold
    nothing readable: the wrapper's own traversal reaches their keys and results."""
    probe = functools.lru_cache(maxsize=1)(lambda: None)
    probe()
    for ref in gc.get_referents(probe):
        if type(ref) is dict:
            for value in ref.values():
                return type(value) if type_name(type(value)) == "_lru_list_elem" else None
    return None


# What a module's own dict holds that is not a tensor it owns: children and parameters are
# walked as the module's, hooks and plain attributes (`self.last = out`) as its contents.
_MODULE_OWN = frozenset(("_parameters", "_buffers", "_modules"))
_EMPTY_CHECK_IDS = frozenset(map(id, (dict, list, set, tuple, collections.OrderedDict)))
_DICT_IDS = frozenset(map(id, (dict, collections.OrderedDict)))
_PLAIN_CONTAINERS = frozenset((dict, list, tuple, set, frozenset))
# The same, by identity: testing a type's membership in a set hashes it, and comparing it in
# a tuple may call ``__eq__``: a metaclass's own code, which may raise or do anything.
_ATOM_IDS = frozenset(map(id, _ATOMS))
_PLAIN_IDS = frozenset(map(id, _PLAIN_CONTAINERS))
_KEY_IDS = frozenset(map(id, (str, int, float, bool, bytes)))
# A class's own lookups through ``type``'s C descriptors: a metaclass's ``__getattribute__``
# or ``__getattr__`` never runs.
_TYPE_MRO = type.__dict__["__mro__"]
_TYPE_DICT = type.__dict__["__dict__"]
_TYPE_NAME = type.__dict__["__name__"]
# Attributes read on an array-like only through these descriptor types, written in C (numpy's,
# CuPy's): a Python property there is the class's own code.
_C_DESCRIPTORS = (types.GetSetDescriptorType, types.MemberDescriptorType)
# A class attribute that is C code when called (a slot wrapper, a C method).
_C_CALLABLES = (types.WrapperDescriptorType, types.MethodDescriptorType,
                types.BuiltinFunctionType)
_CONTAINER_DEPTH = 2
_PEEK_ITEMS = 8  # items looked at in a container past those levels, to say ≥ or not
# A container longer than this is read up to here: a tensor past a million items is missed
# rather than `who` taking minutes over a list of ten million objects.
_MAX_ITEMS = 1_000_000
# Autograd graphs are walked after every holder has taken its own tensors, in this time per
# scan (the OOM explainer has 50 ms in all, `who` 100 ms on the H200): a GPT-2 step's graph
# of about 600 nodes takes a few milliseconds.
GRAPH_BUDGET_S = 0.03
# Objects of any class are entered (instance ``__dict__``, ``__slots__``, closure cells) this
# many objects deep, each one's attributes then read as a holder's own are (``_CONTAINER_DEPTH``
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
# A holder's path goes down to the object inside it that keeps this share of its bytes.
_PATH_SHARE = 0.9
_CHAIN_CAP = 100  # chained exceptions followed
_SHARED_CAP = 64  # pairs of holders checked for a second reference, per scan
_LINK_CAP = 10_000  # traceback links followed per exception
_GENERATOR_FLAGS = (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
                    | inspect.CO_ITERABLE_COROUTINE)


# The heap pass of the search for what the walk did not reach reads the collector's objects
# this many at a time, checking its time between chunks.
HEAP_CHUNK = 1 << 16
HEAP_CUT_NAME = "the rest of the heap"


# A million-entry bounded cache's entries, each entered, took the whole scan's object budget.
_LRU_LINK: type | None = _lru_link_type()


@dataclass
class _Found:
    name: str
    kind: str
    device: str
    nbytes: int = 0
    tensors: int = 0
    first: str = ""
    graph: str = ""  # the first tensor with grad_fn, described
    graph_nodes: int | None = None
    graph_capped: bool = False
    graph_bytes: int | None = None
    graph_unsized: int = 0
    roots: list[Any] = field(default_factory=list)  # the grad_fns of its tensors
    root_ids: set[int] = field(default_factory=set)
    details: list[str] = field(default_factory=list)
    # bytes under each path prefix (a tuple of steps), to name where inside the bytes are
    paths: dict[tuple[str, ...], int] = field(default_factory=dict)
    classes: dict[tuple[str, ...], str] = field(default_factory=dict)
    walk_capped: bool = False
    arrays: bool = False
    torch_tensors: bool = False
    storages: list[tuple[int, int]] = field(default_factory=list)  # (address, bytes) on GPUs
    grad_bytes: int = 0  # of nbytes, parameters' gradients (zero_grad frees them)
    view_bytes: int | None = None  # a lone tensor's own elements, where it views a larger storage
    array_module: str = ""  # the top-level module of its arrays' class


def _is_atom(obj: Any) -> bool:
    t = type(obj)
    if id(t) in _ATOM_IDS:
        return True
    try:
        return issubclass(t, _ATOMS)
    except Exception:
        return False


# What a class's namespace holds that is no state of its own: methods and descriptors.
_CLASS_MEMBERS = (types.FunctionType, staticmethod, classmethod, property,
                  types.MemberDescriptorType, types.GetSetDescriptorType)


def _user_class(klass: type) -> bool:
    """A class the user defined (in a notebook cell or a script: ``__main__``), whose own
    namespace may keep state; a library's classes are not entered (their class attributes
    are configuration, and a scan would walk every library's namespaces)."""
    try:
        ns = type.__dict__["__dict__"].__get__(klass)
        return ns.get("__module__") == "__main__"
    except Exception:
        return False


def _is_a(obj: Any, cls: Any) -> bool:
    """``isinstance`` by the object's real type: ``isinstance`` also asks ``obj.__class__``,
    which a proxy may answer by raising."""
    if cls is None:
        return False
    try:
        return issubclass(type(obj), cls)
    except Exception:
        return False


def _container_len(obj: Any) -> int:
    """A builtin container's length by its base type's own ``__len__``."""
    t = type(obj)
    for base in (dict, list, tuple, set, frozenset):
        if issubclass(t, base):
            return int(base.__len__(obj))
    return 0


def _container_items(obj: Any) -> Iterable[Any] | None:
    """A builtin container's items through the base type's own iterator, so a subclass that
    overrides ``__iter__``, ``values`` or ``__len__`` cannot lie, loop forever or raise."""
    t = type(obj)
    if issubclass(t, dict):
        return dict.values(obj)
    for base in (list, tuple, set, frozenset):
        if issubclass(t, base):
            return base.__iter__(obj)
    return None


def output_cache_names(
    user_ns: Mapping[Any, Any],
    out_entries: Mapping[int, Any],
    hidden: Mapping[str, Any] | None = None,
    hook: Any = None,
) -> set[str]:
    """The ``_``, ``__``, ``___`` and ``_N`` names that still hold what the output cache put
    there, by IPython's own rule (``DisplayHook.update_user_ns``): a name is the cache's while
    its value is the very object the shell recorded for it; once the user rebinds it, it is
    theirs, and IPython itself stops writing it."""
    names: set[str] = set()
    unders_pushed = "_" not in builtins.__dict__  # else IPython never writes the unders
    for name, value in list(user_ns.items()):
        # Exact strs only: IPython writes its names as such, and a str subclass's own
        # `__hash__`/`__eq__`/`__getitem__` would run in the tests below (A4).
        if type(name) is not str or not OUTPUT_ALIAS.match(name):
            continue
        recorded = hidden.get(name, _MISSING) if hidden is not None else _MISSING
        if name in UNDERS:
            if not unders_pushed:
                continue
            if recorded is not _MISSING:
                owned = recorded is value
            elif hook is not None:
                owned = getattr(hook, name, _MISSING) is value
            else:
                owned = any(value is v for v in out_entries.values())
        else:
            n = int(name[1:])
            owned = out_entries.get(n, _MISSING) is value or recorded is value
        if owned:
            names.add(name)
    return names


def _name_of(key: Any) -> str | None:
    """A namespace key as the name it is: an exact ``str`` as it is, a ``str`` subclass's text
    by ``str``'s own ``__str__`` (an exact copy: its class's ``__hash__``, ``__eq__``,
    ``startswith`` or ``__format__`` never runs, A4), anything else None."""
    if type(key) is str:
        return key
    try:
        return str.__str__(key) if issubclass(type(key), str) else None
    except Exception:
        return None


def alias_order(name: str) -> tuple[int, int]:
    """``_``, ``__``, ``___``, then ``_N`` by N."""
    return (0, len(name)) if name in UNDERS else (1, int(name[1:]))


class Scanner:
    def __init__(self, modules: Mapping[str, Any] | None = None, *,
                 graph_budget_s: float = GRAPH_BUDGET_S, walk_budget_s: float = WALK_BUDGET_S,
                 object_cap: int = OBJECT_CAP) -> None:
        mods = sys.modules if modules is None else modules
        torch = mods.get("torch")
        # A tensor's facts through torch.Tensor's own descriptors, never a subclass's code.
        self.reader = TensorReader.of(mods)
        self._tensor_type: Any = self.reader.base if self.reader is not None else None
        nn = getattr(torch, "nn", None) if torch else None
        optim = getattr(torch, "optim", None) if torch else None
        self._module_type: Any = getattr(nn, "Module", None) if nn else None
        self._param_type: Any = getattr(nn, "Parameter", None) if nn else None
        self._optimizer_type: Any = getattr(optim, "Optimizer", None) if optim else None
        self._seen: set[tuple[str, int]] = set()
        # Modules whose tensors this holder's walk has yielded: a hook or a child that refers
        # back to its model (transformers' output recorders do) would enumerate every
        # parameter again per reference (the H200's GPT-2 scan went from 5 to 20-46 ms).
        self._modules_walked: set[int] = set()
        self._grad_ids: set[int] = set()  # this walk's gradients, to count them apart
        self._by_name: dict[str, list[_Found]] = {}  # this scan's holders, by name
        # The tensor the walk last handed on, with its (device, bytes, key).
        self._last_info: tuple[Any, Any] = (_MISSING, None)
        self.graph_budget_s = graph_budget_s
        self.walk_budget_s = walk_budget_s
        self.object_cap = object_cap
        self._entered: set[int] = set()
        # Who entered each object and who first counted each storage, so that another holder
        # reaching the same object is known as a second reference to it: `del ds` alone frees
        # nothing while `dl.dataset` is `ds`.
        self._entered_by: dict[int, str] = {}
        self._seen_by: dict[tuple[str, int], str] = {}
        self._also: dict[str, dict[str, None]] = {}
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
        self._arrays: dict[int, tuple[type, tuple[Any, Any, bool] | None]] = {}
        self._stop_at = 0.0  # past this, the scan reads no more container items
        self._stopped = False
        self.walk_capped = False  # some holder's object walk was cut this scan
        self.skipped = 0  # objects that raised while being looked at
        self._extras: dict[str, dict[str, Any]] = {}  # the retention search's holders' fields
        self.unreached_bytes = 0  # GPU bytes the walk did not reach, in the last scan
        self.search: retention.Outcome | None = None  # the last retention search, if one ran
        self.heap_cut = ""  # where the last heap pass stopped at its time, what it did not read
        self._say_cut = False
        self.graph_s = 0.0  # the last scan's time in graph walks
        self.graph_nodes = 0  # and the nodes they walked

    # -- single objects ----------------------------------------------------------------------
    def _tensor_info(self, t: Any) -> tuple[str, int, tuple[str, int]] | None:
        """(device, bytes, storage key) of a tensor or numpy/cupy-like array; never raises."""
        try:
            return self._tensor_info_of(t)
        except Exception:
            return None

    def _tensor_info_of(self, t: Any) -> tuple[str, int, tuple[str, int]] | None:
        if self.reader is not None and _is_a(t, self._tensor_type):
            # torch.Tensor's own descriptors, with __torch_function__ off: a subclass's
            # override of `device` or `untyped_storage` never runs (tensors.py).
            return self.reader.info(t)
        plan = self._array_plan(type(t))
        if plan is None:
            return None
        nbytes_desc, base_desc, on_device = plan
        n = int(nbytes_desc.__get__(t, type(t)))
        if n < 0:
            return None
        device = "cuda" if on_device else "cpu"
        base = base_desc.__get__(t, type(t)) if base_desc is not None else None
        return device, n, (device, id(base if base is not None else t))

    def _array_plan(self, t: type) -> tuple[Any, Any, bool] | None:
        """How to read an array of this class (numpy's, CuPy's): its ``nbytes`` and ``base``
        descriptors and whether it lives on a GPU, or None for a class that is not one. Only
        C descriptors count: a Python ``nbytes``/``shape``/``dtype`` property (a lazy
        dataset) would be the user's code, run by looking."""
        cached = self._arrays.get(id(t))
        if cached is not None and cached[0] is t:
            return cached[1]
        plan: tuple[Any, Any, bool] | None = None
        found = [static_attribute(t, n) for n in ("nbytes", "shape", "dtype")]
        if all(type(d) in _C_DESCRIPTORS for d in found):
            base = static_attribute(t, "base")
            plan = (found[0], base if type(base) in _C_DESCRIPTORS else None,
                    static_attribute(t, "__cuda_array_interface__") is not _MISSING)
        self._arrays[id(t)] = (t, plan)
        return plan

    def _grad_fn(self, t: Any) -> Any:
        if self.reader is None or not _is_a(t, self._tensor_type):
            return None
        try:
            return self.reader.grad_fn(t)
        except Exception:
            return None

    def shape_of(self, t: Any) -> tuple[Any, ...] | None:
        """A tensor's or array's sizes, read as ``_tensor_info`` reads it (no user code)."""
        try:
            if self.reader is not None and _is_a(t, self._tensor_type):
                return self.reader.shape(t)
            plan = self._array_plan(type(t))
            if plan is None:
                return None
            return sizes(static_attribute(type(t), "shape").__get__(t, type(t)))
        except Exception:
            return None

    def own_bytes(self, t: Any) -> int | None:
        """The bytes of a tensor's or array's own elements (not a larger storage it views)."""
        try:
            if self.reader is not None and _is_a(t, self._tensor_type):
                return self.reader.elements_bytes(t)
            plan = self._array_plan(type(t))
            return int(plan[0].__get__(t, type(t))) if plan is not None else None
        except Exception:
            return None

    def _tensors_in(self, obj: Any, depth: int, path: tuple[str, ...] = (),
                    objdepth: int = _OBJECT_DEPTH) -> Iterator[tuple[Any, tuple[str, ...]]]:
        """Tensors inside obj, each with its path: modules, optimizers and containers
        ``depth`` levels down; objects of any other class (their ``__dict__``, ``__slots__``,
        a function's closure cells) ``objdepth`` objects down, each starting the container
        levels afresh."""
        if id(type(obj)) in _PLAIN_IDS:  # the common case, and never a tensor or module
            if depth > 0:
                yield from self._items_in(obj, depth, path, objdepth)
            else:
                self._note_unread(obj)
            return
        if _is_atom(obj):
            return
        info = self._tensor_info(obj)
        if info is not None:
            # Handed to the walk's consumer with the tensor: read once, not twice.
            self._last_info = (obj, info)
            yield obj, path
            # Only leaves have a .grad; asking a non-leaf makes torch warn.
            if _is_a(obj, self._tensor_type):
                grad = self._grad_of(obj)
                if grad is not None:
                    self._grad_ids.add(id(grad))
                    yield grad, (*path, ".grad")
            return
        if _is_a(obj, self._module_type):
            if id(obj) in self._modules_walked:
                return
            self._modules_walked.add(id(obj))
            yield from self._module_tensors(obj, path)
            if objdepth > 0:
                yield from self._module_contents(obj, path, objdepth)
            return
        if _is_a(obj, self._optimizer_type):
            yield from self._optimizer_tensors(obj, path)
            return
        if _container_items(obj) is not None:  # a subclass of a builtin container
            if depth > 0:
                yield from self._items_in(obj, depth, path, objdepth)
            else:
                self._note_unread(obj)
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
        atoms, plain, last = _ATOM_IDS, _PLAIN_IDS, depth == 1
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
                    else _key_step(key)
                yield from self._tensors_in(item, depth - 1, (*path, step), objdepth)
            return
        items = _container_items(obj)
        if items is None:
            return
        if _container_len(obj) > _MAX_ITEMS:
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
        if not self._cut and any(id(type(x)) not in _ATOM_IDS
                                 for x in itertools.islice(_container_items(container) or (),
                                                           _PEEK_ITEMS)):
            self._cut = True

    def _past_stop(self) -> bool:
        """Whether the scan is past its stop (then the current holder's walk is cut)."""
        if self._stopped or time.perf_counter() > self._stop_at:
            self._stopped = self._cut = True
        return self._stopped

    def _note_also(self, owner: str | None) -> None:
        """The holder being walked also reaches what ``owner`` holds."""
        if owner is not None and owner != self._walking:
            self._also.setdefault(owner, {})[self._walking] = None

    def _note_shared(self, obj: Any) -> None:
        """The holder being walked reaches an object another holder entered first: a second
        reference to that holder's bytes if the object leads to them, which is checked once
        the scan is done (a shared configuration object holds none)."""
        owner = self._entered_by.get(id(obj))
        if owner is not None and owner != self._walking and \
                (owner, self._walking) not in self._shared and len(self._shared) < _SHARED_CAP:
            self._shared[(owner, self._walking)] = obj

    def _check_shared(self) -> None:
        """Each shared object that leads to its first holder's storages makes the second
        holder one more reference that must go (bounded: a fresh walk of each, within the
        scan's bounds)."""
        shared, self._shared = self._shared, {}
        try:
            for (owner, walker), obj in shared.items():
                if walker in self._also.get(owner, {}):
                    continue
                for t, _ in self.tensors_of(obj):
                    info = self._tensor_info(t)
                    if info is not None and self._seen_by.get(info[2]) == owner:
                        self._also.setdefault(owner, {})[walker] = None
                        break
        finally:
            shared.clear()

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
        dict_desc: Any = None
        slots: list[tuple[str, Any]] = []
        seen: set[str] = set()
        for klass in _TYPE_MRO.__get__(t):
            try:
                ns = _TYPE_DICT.__get__(klass)
            except Exception:
                continue
            for name, desc in list(ns.items()):
                if type(name) is not str or name in seen:
                    continue
                seen.add(name)
                if name == "__dict__" and type(desc) in _C_DESCRIPTORS:
                    # A member for C types that keep their dict in a struct field
                    # (SimpleNamespace): its items are the attributes all the same.
                    dict_desc = dict_desc or desc
                elif type(desc) is types.MemberDescriptorType and name != "__weakref__":
                    slots.append((name, desc))
        plan = (dict_desc, tuple(slots))
        self._plans[id(t)] = (t, plan)
        return plan

    def _attributes_of(self, obj: Any, path: tuple[str, ...],
                       objdepth: int) -> Iterator[tuple[Any, tuple[str, ...]]]:
        if (_LRU_LINK is not None and type(obj) is _LRU_LINK) or not self._enter(obj):
            return
        if id(type(obj)) in _SUSPENDABLE_IDS:
            yield from self._suspended_locals(obj, path, objdepth)
            return
        if _LRU_WRAPPER is not None and type(obj) is _LRU_WRAPPER:
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
                if not _is_atom(value) or type(value) is types.FunctionType:
                    yield from self._tensors_in(value, _CONTAINER_DEPTH,
                                                (*path, f" closure '{name}'"), objdepth - 1)
            # A default binds as a closure does: `lambda m, i, o, feats=feats:
            # feats.append(o)` is a common way to write a hook that keeps outputs.
            # A hook's `model=model` default is the module already walked: skipped here,
            # as most defaults (numbers, None) are, without a walk of their own (2,000 such
            # hooks cost 12 ms more on a 66 ms scan).
            walked = self._modules_walked
            for i, value in enumerate(obj.__defaults__ or ()):
                if id(type(value)) not in _ATOM_IDS and id(value) not in walked:
                    yield from self._tensors_in(value, _CONTAINER_DEPTH - 1,
                                                (*path, f" default [{i}]"), objdepth - 1)
            kwdefaults = obj.__kwdefaults__
            if kwdefaults:
                yield from self._tensors_in(kwdefaults, _CONTAINER_DEPTH,
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
                    if id(type(value)) in _ATOM_IDS:
                        continue
                    yield from self._tensors_in(value, _CONTAINER_DEPTH,
                                                (*path, _attr_step(name)), objdepth - 1)
        for name, desc in slots:
            try:
                value = desc.__get__(obj)
            except Exception:  # an unset slot
                continue
            yield from self._tensors_in(value, _CONTAINER_DEPTH, (*path, f".{name}"),
                                        objdepth - 1)
        if userexc.is_exception(obj):
            # An exception kept in a variable keeps its traceback's frames, and their locals
            # (issue 24: `except E as e: err = e`); its cause and context chain on. Read
            # through C descriptors (userexc), never the exception's own code.
            for tb_name, frame_locals in _frames([obj]):
                yield from self._items_in(frame_locals, _CONTAINER_DEPTH,
                                          (*path, f" {tb_name}"), objdepth - 1)
        klass = type(obj)
        if _user_class(klass) and self._enter(klass):
            # A class-level attribute (`class C: cache = []`) is reachable from every
            # instance through its type; entered once per scan, from the first instance.
            try:
                ns = type.__dict__["__dict__"].__get__(klass)
            except Exception:
                ns = {}
            owner = _class_reference(klass)
            for name, value in list(ns.items()):
                if type(name) is not str or name.startswith("__") or \
                        type(value) in _ATOM_TYPES or isinstance(value, _CLASS_MEMBERS):
                    continue
                step = (*path, f" class {owner}.{name}")
                # Said with the path: `.clear()` fits a list, `= None` anything else.
                self._path_classes.setdefault(step, type_name(type(value)))
                yield from self._tensors_in(value, _CONTAINER_DEPTH, step, objdepth - 1)

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
                                       if _is_a(c, module_type)]))
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
        state = own_item(attrs, "state") if attrs is not None else _MISSING
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
        output to a list: issue 24's forward_hook_keeps_outputs, 60 GiB not found on the
        H200). Children are found as torch keeps them, in each module's own
        ``__dict__['_modules']`` read through the ``__dict__`` descriptor, in
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
                            if type(k) is str and _is_a(child, self._module_type)]))
                    continue
                if kind in _ATOM_IDS:
                    continue
                # Most of a module's dict is a dozen empty hook dicts: skipped for the price of
                # a length (exact builtin types: no user code), as the walk runs on every OOM.
                if kind in _EMPTY_CHECK_IDS and not len(value):
                    continue
                yield from self._tensors_in(value, _CONTAINER_DEPTH, (*where, _attr_step(key)),
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
            refs = gc.get_referents(obj)
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
            if id(type(value)) in _ATOM_IDS or type(value) is types.FunctionType or \
                    type(value) is object:
                continue
            yield from self._tensors_in(value, _CONTAINER_DEPTH, path, objdepth - 1)

    def _grad_of(self, t: Any) -> Any:
        """A leaf tensor's gradient (only leaves have one; asking a non-leaf makes torch
        warn), read by torch.Tensor's own descriptors."""
        if self.reader is None or not _is_a(t, self._tensor_type):
            return None
        try:
            grad = self.reader.leaf_grad(t)
        except Exception:
            return None
        return grad if grad is not None and self._tensor_info(grad) is not None else None

    def _kind_of(self, obj: Any) -> str:
        if _is_a(obj, self._module_type):
            return "module"
        if _is_a(obj, self._optimizer_type):
            return "optimizer state"
        if _is_a(obj, (dict, list, tuple, set, frozenset)):
            return "container"
        return "variable"

    def _attribute(self, name: str, kind: str, obj: Any, out: dict[str, _Found]) -> None:
        try:
            self._attribute_each(name, kind, obj, out)
        except Exception:
            self.skipped += 1  # a hostile object: what was found before it still counts

    def _attribute_each(self, name: str, kind: str, obj: Any, out: dict[str, _Found]) -> None:
        self._cut = False
        self._namespace_root = kind == "traceback"
        self._path_classes = {}
        self._modules_walked = set()
        self._grad_ids = set()
        self._walking = name
        try:
            self._attribute_walk(name, kind, obj, out)
        finally:
            self._forget()  # no tensor outlives the walk here
            # This name's holders only: a pass over every holder per holder made a
            # namespace of 1,000 tensors spend a third of its scan here.
            for f in self._by_name.get(name, ()):
                if f.name == name:
                    f.classes.update(self._path_classes)
                    if self._cut:
                        f.walk_capped = True
            if self._cut:
                self.walk_capped = True

    def _attribute_walk(self, name: str, kind: str, obj: Any, out: dict[str, _Found]) -> None:
        for t, path in self._tensors_in(obj, _CONTAINER_DEPTH):
            last = self._last_info
            info = last[1] if last[0] is t else self._tensor_info(t)
            if info is None:
                continue
            device, nbytes, key = info
            if key in self._seen:
                self._note_also(self._seen_by.get(key))
                continue
            self._seen.add(key)
            self._seen_by[key] = name
            slot = f"{name}\0{device}"
            f = out.get(slot)
            if f is None:
                f = out[slot] = _Found(name=name, kind=kind, device=device)
                self._by_name.setdefault(name, []).append(f)
            f.nbytes += nbytes
            f.tensors += 1
            if id(t) in self._grad_ids:
                f.grad_bytes += nbytes
            if f.tensors == 1 and not path:
                own = self.own_bytes(t)
                f.view_bytes = own if own is not None and own < nbytes else None
            else:
                f.view_bytes = None
            if _is_a(t, self._tensor_type):
                f.torch_tensors = True
                if device.startswith("cuda"):
                    f.storages.append((key[1], nbytes))
            else:
                f.arrays = True
                if not f.array_module:
                    f.array_module = _top_module(type(t))
            for k in range(1, len(path) + 1):
                prefix = path[:k]
                f.paths[prefix] = f.paths.get(prefix, 0) + nbytes
            grad_fn = self._grad_fn(t)
            if f.tensors == 1:
                f.first = self._describe(t, grad_fn)
            if grad_fn is not None:
                if not f.graph:
                    f.graph = f.first if f.tensors == 1 else self._describe(t, grad_fn)
                if id(grad_fn) not in f.root_ids:
                    f.root_ids.add(id(grad_fn))
                    f.roots.append(grad_fn)

    def _describe(self, t: Any, grad_fn: Any = _MISSING) -> str:
        """"float32[1024, 1024], grad_fn=MulBackward0", read as ``_tensor_info`` reads (no
        subclass's property, override or ``__torch_function__`` runs); ``grad_fn`` where the
        caller has read it already."""
        if self.reader is not None and _is_a(t, self._tensor_type):
            return self.reader.describe(t, grad_fn)
        shape = self.shape_of(t)
        dims = list(shape) if shape is not None else ["?"]
        try:  # an array's dtype by the class's C descriptor (``_array_plan`` checked it)
            dtype = static_attribute(type(t), "dtype").__get__(t, type(t))
            # Said only where the dtype's own str and repr are C code (numpy's, CuPy's).
            text = str(dtype) if all(
                type(static_attribute(type(dtype), n)) in _C_CALLABLES
                for n in ("__str__", "__repr__")) else "?"
        except Exception:
            text = "?"
        return f"{text}{dims}"

    def _unreached(self, budget_s: float) -> list[Any]:
        """Every GPU tensor the garbage collector tracks that the walk did not reach, read in
        chunks of the heap until ``budget_s`` runs out (reliability 2026-12-05 A3: 5,000,000
        objects took 2-12 s with no bound); ``heap_cut`` then says how much was not read.
        The heap is filtered by type with C-level maps: each distinct class is judged once
        (no Python call per object: 2.2 µs an object made 5,000,000 objects take seconds),
        and classes are compared by identity (hashing one may run its metaclass's code)."""
        self.heap_cut = ""
        t0 = time.perf_counter()
        objs = gc.get_objects()
        total, read = len(objs), 0
        out: list[Any] = []
        wanted: set[int] = set()
        judged: set[int] = set()
        keep: list[type] = []  # the judged classes, so that no other class takes their ids
        tensor_type, plan = self._tensor_type, self._array_plan
        try:
            for start in range(0, total, HEAP_CHUNK):
                if start and time.perf_counter() - t0 > budget_s:
                    break
                chunk = objs[start:start + HEAP_CHUNK]
                kinds = list(map(id, map(type, chunk)))
                for tid in set(kinds).difference(judged):
                    t = type(chunk[kinds.index(tid)])
                    keep.append(t)
                    judged.add(tid)
                    try:
                        if (tensor_type is not None and issubclass(t, tensor_type)) or \
                                plan(t) is not None:
                            wanted.add(tid)
                    except Exception:
                        continue
                if wanted:
                    for obj in compress(chunk, map(wanted.__contains__, kinds)):
                        info = self._tensor_info(obj)
                        if info is not None and info[2] not in self._seen and \
                                info[0].startswith("cuda"):
                            out.append(obj)
                read += len(chunk)
                chunk.clear()
                kinds.clear()
        finally:
            objs.clear()
            keep.clear()
        if read < total:
            self.heap_cut = (
                f"the heap pass's {budget_s:g} s ran out after {read:,} of the {total:,} "
                f"objects the garbage collector tracks; GPU tensors held only among the other "
                f"{total - read:,} were not looked for")
        return out

    def _search_rest(self, found: dict[str, _Found], ctx: RootContext, min_bytes: int,
                     budget_s: float | None) -> None:
        """The retention search for what the walk did not reach, each group of storages
        attributed under its path from a root (or as garbage, unseen, not searched)."""
        t0 = time.perf_counter()
        budget = retention.BUDGET_S if budget_s is None else budget_s
        tensors = self._unreached(budget)
        # One bound for both passes: the search gets what the heap pass left of it, and at
        # least half of it, so that a heap pass cut at its bound still leaves a search.
        budget_s = max(budget - (time.perf_counter() - t0), budget / 2)
        try:
            sizes: dict[tuple[str, int], int] = {}
            for t in tensors:
                info = self._tensor_info(t)
                if info is not None:
                    sizes[info[2]] = info[1]
            self.unreached_bytes = sum(sizes.values())
            if not tensors or self.unreached_bytes < min_bytes:
                return
            if not ctx.thread_locals:
                ctx.thread_locals = thread_locals()
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
                self._attribute(template.name, template.kind, group, found)
                group.clear()
            by_key.clear()
        finally:
            tensors.clear()

    def _size_graphs(self, found: dict[str, _Found]) -> None:
        """Every holder's graphs, in attribution order, once all holders have taken their own
        tensors: a saved tensor a variable or a module also holds is theirs, not the graph's."""
        walker = GraphWalker(self._tensor_info, self._seen,
                             exclude=lambda t: _is_a(t, self._param_type),
                             budget_s=self.graph_budget_s)
        walked_by: dict[int, str] = {}  # a walk's number -> the holder it sized
        try:
            for f in list(found.values()):
                if not f.roots:
                    continue
                size = walker.size(f.roots)
                walked_by[size.walk] = f.name
                for w in size.shared_walks:
                    # This graph reaches nodes an earlier holder's graph counted (two outputs
                    # of one forward): that holder's `del` alone frees none of them.
                    owner = walked_by.get(w)
                    if owner is not None and owner != f.name:
                        self._also.setdefault(owner, {})[f.name] = None
                if size.capped and not size.nodes:
                    continue  # the time for graphs ran out before this one: not walked
                f.graph_nodes = size.nodes
                f.graph_capped = size.capped
                f.graph_unsized = size.hooked + size.unknown
                f.graph_bytes = size.bytes_by_device.get(f.device, 0)
                for key in size.shared:
                    # `del x` frees nothing while this graph saves x: f is one more
                    # reference to x's bytes.
                    owner = self._seen_by.get(key)
                    if owner is not None and owner != f.name:
                        self._also.setdefault(owner, {})[f.name] = None
                for device, nbytes in size.bytes_by_device.items():
                    if device == f.device:
                        continue
                    # A graph can save tensors on another device (a CPU copy): those bytes
                    # are the same holder's there.
                    other = found.setdefault(f"{f.name}\0{device}",
                                             _Found(name=f.name, kind=f.kind, device=device))
                    other.graph_bytes = (other.graph_bytes or 0) + nbytes
                    other.graph_capped = other.graph_capped or size.capped
                f.roots.clear()
        finally:
            self.graph_s, self.graph_nodes = walker.elapsed_s, walker.nodes
            for f in found.values():
                f.roots.clear()  # no graph outlives the scan

    def tensors_of(self, obj: Any) -> list[tuple[Any, tuple[str, ...]]]:
        """The tensors inside one object with their paths, by the scan's own walk and
        bounds (a fresh walk: nothing an earlier scan entered is skipped)."""
        self._entered.clear()
        self._entered_n = 0
        self._start_walk()
        try:
            return list(self._tensors_in(obj, _CONTAINER_DEPTH))
        except Exception:
            return []
        finally:
            self._forget()

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

    def _forget(self) -> None:
        """Drop the walk's memo of the last tensor handed on: a look keeps nothing alive."""
        self._last_info = (_MISSING, None)

    # -- whole scans -------------------------------------------------------------------------
    def scan(self, *args: Any, **kwargs: Any) -> list[Holder]:
        """See ``_scan``. Looking at user objects must never print: library warnings that
        mere inspection can trigger are silenced for the duration. It never raises either: a
        failure past every per-object guard returns what was found."""
        found: dict[str, _Found] = {}
        # The walk allocates only short-lived iterators, freed as it goes; letting them
        # trigger collections over a large heap doubled its time on a million containers.
        collecting = gc.isenabled()
        gc.disable()
        try:
            with warnings.catch_warnings(), \
                    self.reader.held() if self.reader is not None else contextlib.nullcontext():
                warnings.simplefilter("ignore")
                self._scan(found, *args, **kwargs)
        except Exception:
            self.skipped += 1
        finally:
            self._forget()
            if collecting:
                gc.enable()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            holders = [_holder(f) for f in found.values()]
            holders = [replace(h, **self._extras[h.name]) if h.name in self._extras else h
                       for h in holders]
            holders = [replace(h, also_held_by=tuple(self._also[h.name]))
                       if self._also.get(h.name) and not h.also_held_by else h
                       for h in holders]
            holders.sort(key=lambda h: (-h.held_bytes, h.name))
            if self.heap_cut and self._say_cut:  # first: said before any -n cut
                holders.insert(0, Holder(
                    name=HEAP_CUT_NAME, kind=KIND_NOT_SEARCHED, device="cuda", nbytes=0,
                    detail=self.heap_cut, why=self.heap_cut, walk_capped=True))
            return holders

    def _scan(
        self,
        found: dict[str, _Found],
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
        self._by_name = {}
        self._seen.clear()
        self._seen_by.clear()
        self._also.clear()
        self._shared.clear()
        self._entered_by.clear()
        self._entered.clear()
        self._entered_n = 0
        self.walk_capped = False
        self._start_walk()
        self.graph_s, self.graph_nodes = 0.0, 0
        out = dict(output_cache or {})
        cached = output_cache_names(user_ns, out, hidden)
        aliases: dict[int, list[str]] = {}
        for key, obj in list(user_ns.items()):
            name = _name_of(key)
            if name is None:
                continue  # globals()[7] = ...: not a variable anyone can name
            if name in cached:
                aliases.setdefault(id(obj), []).append(name)
                continue
            if _is_atom(obj) or name in SHELL_NAMES or name.startswith("__"):
                continue
            self._attribute(name, self._kind_of(obj), obj, found)
        for n, obj in sorted(out.items()):
            label = f"Out[{n}]"
            also = [a for a in aliases.pop(id(obj), []) if a != f"_{n}"]
            if also:
                label += f" (also {', '.join(sorted(also, key=alias_order))})"
            self._attribute(label, "output cache", obj, found)
        for names in aliases.values():  # `_` and friends the cache set, no longer in Out
            obj = user_ns.get(names[0])
            self._attribute(" / ".join(sorted(names, key=alias_order)), "output cache", obj,
                            found)
        for tb_name, frame_locals in _frames(last_exception):
            self._attribute(tb_name, "traceback", frame_locals, found)
        self._size_graphs(found)
        if include_gc or (rest_min_bytes is not None and (
                allocated_bytes is None
                or allocated_bytes - _gpu_bytes(found.values()) > rest_min_bytes)):
            ctx = roots if roots is not None else RootContext(
                user_ns=user_ns, out=output_cache,
                stored_exceptions=[e for e in last_exception if userexc.is_exception(e)])
            self._search_rest(found, ctx, 0 if include_gc else rest_min_bytes or 0,
                              search_budget_s)
            self._size_graphs(found)  # the graphs of what the search found
        self._check_shared()


def _gpu_bytes(found: Iterable[_Found]) -> int:
    """What the walk found on GPUs in PyTorch's allocator: tensors and their graphs."""
    return sum(f.nbytes + (f.graph_bytes or 0) for f in found
               if f.device.startswith("cuda") and not f.arrays)


def _attr_step(name: Any) -> str:
    """``.name`` for an attribute in an object's own dict; a key that is no plain ``str``
    (``obj.__dict__[k] = ...``) is said as ``_key_step`` says it: formatting it would run its
    class's ``__format__``."""
    return f".{name}" if type(name) is str else _key_step(name)


def _key_step(key: Any) -> str:
    """``['past_key_values']``, ``[3]``; ``[…]`` for a key whose repr could run code."""
    if id(type(key)) in _KEY_IDS or key is None:
        text = repr(key)
        return f"[{text}]" if len(text) <= 40 else f"[{text[:37]}…]"
    return "[…]"


def path_of(f: _Found) -> str:
    """Down from the holder's name while one step keeps nearly all of its bytes, to the
    object that holds them, with that object's class."""
    if not f.paths or not f.nbytes:
        return ""
    here: tuple[str, ...] = ()
    while True:
        best = max((p for p in f.paths if len(p) == len(here) + 1 and p[:len(here)] == here),
                   key=lambda p: f.paths[p], default=None)
        if best is None or f.paths[best] < _PATH_SHARE * f.nbytes:
            break
        here = best
    if not here:
        return ""
    # The deepest object along the way whose class is known names what holds the bytes.
    text = "".join(here).lstrip(".")
    for k in range(len(here), 0, -1):
        cls = f.classes.get(here[:k])
        if cls is not None:
            text = "".join(here[:k]).lstrip(".") + f" ({cls})"
            break
    return text


def _class_reference(klass: type) -> str:
    """How the notebook reaches a class it defined (the walk enters only those): its
    qualified name, ``Outer.Inner`` for a nested one; read by type's own descriptor, no
    metaclass code. A class made inside a function has no such name: its ``__name__``."""
    try:
        qual = type.__dict__["__qualname__"].__get__(klass)
    except Exception:
        return type_name(klass)
    return qual if type(qual) is str and "<" not in qual else type_name(klass)


def _top_module(klass: type) -> str:
    """``cupy`` for ``cupy.ndarray``: read by type's own descriptor, no metaclass code."""
    try:
        mod = type.__dict__["__module__"].__get__(klass)
    except Exception:
        return ""
    return mod.split(".", 1)[0] if type(mod) is str else ""


def _holder(f: _Found) -> Holder:
    """The scan's record of one holder. What its graph keeps is in the ``graph_*`` fields
    (``analysis.held_text`` says it), not in ``detail``."""
    what = "arrays" if f.arrays and not f.torch_tensors else "tensors"
    if f.tensors == 1:
        detail = f.first
    elif f.tensors:
        detail = f"{f.tensors} {what}" + (f"; one has {f.graph.split(', ', 1)[-1]}"
                                          if f.graph else "")
    else:
        detail = "tensors its autograd graph saved on this device"
    return Holder(name=f.name, kind=f.kind, device=f.device, nbytes=f.nbytes, detail=detail,
                  holds_graph=bool(f.graph) or f.graph_bytes is not None,
                  graph_nodes=f.graph_nodes, graph_nodes_capped=f.graph_capped,
                  graph_bytes=f.graph_bytes, graph_bytes_capped=f.graph_capped,
                  graph_unsized=f.graph_unsized, path=path_of(f), walk_capped=f.walk_capped,
                  arrays=f.arrays and not f.torch_tensors, storages=tuple(f.storages),
                  grad_bytes=f.grad_bytes, view_bytes=f.view_bytes,
                  array_module=f.array_module,
                  contents_bytes=(sum(n for p, n in f.paths.items() if len(p) == 1)
                                  if f.kind == "module" else 0))


# -- stored exceptions ---------------------------------------------------------------------------
def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception it chains to (cause, context, a group's members), read
    without running the exceptions' own code (``userexc``)."""
    return userexc.chain(exc, _CHAIN_CAP)


def traceback_links(excs: Iterable[BaseException | types.TracebackType | None],
                    ) -> list[types.TracebackType]:
    """Every traceback link of these exceptions (or tracebacks), each once."""
    out: list[types.TracebackType] = []
    seen: set[int] = set()
    for obj in excs:
        tb = userexc.traceback_of(obj) if userexc.is_exception(obj) else obj
        n = 0
        while isinstance(tb, types.TracebackType) and id(tb) not in seen and n < _LINK_CAP:
            seen.add(id(tb))
            out.append(tb)
            tb = tb.tb_next
            n += 1
    return out


def frame_is_live(frame: types.FrameType, running: set[int],
                  links: Iterable[types.TracebackType] | None = None) -> bool:
    """Running, or a suspended generator's or coroutine's: its locals are in use.

    Given the traceback ``links`` through the frame, it answers without searching the heap
    (the OOM explainer's in-cell estimate has tens of milliseconds): a generator's frame that
    the exception unwound stopped where a link says, and is finished; one that caught it and
    ran on may be suspended now, and counts as live. Every cell's traceback starts in IPython's
    ``run_code``, a coroutine that caught it, so the exact answer would cost a heap search on
    every look. Without ``links`` the owning generator is searched for.
    """
    if id(frame) in running:
        return True
    if not frame.f_code.co_flags & _GENERATOR_FLAGS:
        return False
    if links is not None:
        return all(frame.f_lasti != tb.tb_lasti for tb in links)
    for r in gc.get_referrers(frame):
        owner = (getattr(r, "gi_frame", None) if isinstance(r, types.GeneratorType) else
                 getattr(r, "cr_frame", None) if isinstance(r, types.CoroutineType) else
                 getattr(r, "ag_frame", None) if isinstance(r, types.AsyncGeneratorType) else
                 None)
        if owner is frame:
            return True
    return False


def frames_of(links: Iterable[types.TracebackType],
              ) -> dict[int, tuple[types.FrameType, list[types.TracebackType]]]:
    """Each frame of these traceback links once, with the links through it, in order."""
    out: dict[int, tuple[types.FrameType, list[types.TracebackType]]] = {}
    for tb in links:
        out.setdefault(id(tb.tb_frame), (tb.tb_frame, []))[1].append(tb)
    return out


def is_function_frame(frame: types.FrameType) -> bool:
    """A function's frame: a cell's (module-level) frame has the user namespace as its
    locals, and those are attributed to the variables themselves."""
    return bool(frame.f_code.co_flags & inspect.CO_OPTIMIZED)


def _frames(
    objs: Iterable[BaseException | types.TracebackType | None],
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each finished frame's locals kept alive by a stored exception, labelled for the user."""
    objs = list(objs)
    excs: list[BaseException | types.TracebackType | None] = []
    for obj in objs:
        excs += exception_chain(obj) if userexc.is_exception(obj) else [obj]
    running = running_frame_ids()
    for frame, links in frames_of(traceback_links(excs)).values():
        if is_function_frame(frame) and not frame_is_live(frame, running, links):
            yield f"traceback: {frame.f_code.co_name}() locals", dict(frame.f_locals)


def last_value() -> Any:
    """The interpreter's last uncaught exception (``sys.last_exc`` from 3.12)."""
    exc = getattr(sys, "last_exc", None)
    return exc if exc is not None else getattr(sys, "last_value", None)


def is_stored(exc: BaseException, shell: Any) -> bool:
    """Whether the interpreter or the shell still keeps ``exc`` (or one of its tracebacks)."""
    links = {id(tb) for tb in traceback_links(exception_chain(exc))}
    result = getattr(shell, "last_execution_result", None)
    itb = getattr(shell, "InteractiveTB", None)
    return (getattr(sys, "last_value", None) is exc or getattr(sys, "last_exc", None) is exc
            or id(getattr(sys, "last_traceback", None)) in links
            or getattr(result, "error_in_exec", None) is exc
            or id(getattr(itb, "tb", None)) in links)


def cell_number(exc: BaseException, shell: Any) -> int | None:
    """The cell whose top-level code ``exc`` propagated through, by the file name IPython's
    compiler gave that cell; None for an exception no cell raised (a widget's message
    handler, run by the kernel between cells)."""
    names = CellNames.of(shell)
    for tb in traceback_links([exc]):
        code = tb.tb_frame.f_code
        if is_cell_top(code.co_name):
            number = names.number(code.co_filename)
            if number is not None:
                return number
    return None


class CellException:
    """The exception the user's latest failing cell raised, while the shell still keeps it.

    The monitor notes each top-level cell's ``error_in_exec``. A later cell that raised nothing
    keeps the note only while the shell still stores that exception, so the note never keeps
    an exception alive more than one cell longer than IPython would.
    """

    def __init__(self) -> None:
        self.execution_count: int | None = None
        self.error: BaseException | None = None

    def note(self, execution_count: int | None, result: Any, shell: Any) -> None:
        err = getattr(result, "error_in_exec", None)
        if isinstance(err, BaseException):
            self.execution_count, self.error = execution_count, err
        elif self.error is not None and not is_stored(self.error, shell):
            self.release()

    def release(self) -> None:
        self.execution_count, self.error = None, None


@dataclass(frozen=True)
class StoredException:
    error: BaseException
    execution_count: int | None


def stored_cell_exception(shell: Any, noted: CellException | None = None,
                          ) -> StoredException | None:
    """The exception a user's cell raised that the shell still stores, if any.

    ``sys.last_value`` is the interpreter's last uncaught exception, whoever raised it: a
    widget's message handler stores its own there between cells (plotly's trace-delta
    handler did, issue 7). Only an exception the monitor saw a cell raise, or one whose
    traceback runs through a cell's top-level code, is the user's.
    """
    last = last_value()
    if isinstance(last, BaseException):
        if noted is not None and last is noted.error:
            return StoredException(last, noted.execution_count)
        number = cell_number(last, shell)
        if number is not None:
            return StoredException(last, number)
    if noted is not None and noted.error is not None and is_stored(noted.error, shell):
        return StoredException(noted.error, noted.execution_count)
    return None


def last_exception_objects(shell: Any = None, noted: CellException | None = None) -> list[Any]:
    """The user's stored cell exception as the scan takes it: a list of none or one."""
    stored = stored_cell_exception(shell, noted)
    return [stored.error] if stored is not None else []


def cuda_bytes(holders: Iterable[Holder]) -> int:
    """What these holders keep on GPUs, their autograd graphs' saved tensors included."""
    return sum(h.held_bytes for h in holders if h.device.startswith("cuda"))
