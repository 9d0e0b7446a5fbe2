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
import contextvars
import functools
import gc
import operator
import re
import sys
import time
import types
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress, islice, repeat
from typing import Any

from .reading import UNDERS, running_frame_ids, static_attribute, type_name

# An lru_cache's results (and the arguments it keys them on, `self` for a method) are freed by
# `cache_clear()`, never by deleting the function that owns the cache: the step says so, and the
# advice rests on it.
_LRU_WRAPPER: type = type(functools.lru_cache(maxsize=None)(lambda: None))

# What a root is: how the user reaches the reference, and so what removes it.
ROOT_VARIABLE = "variable"
ROOT_OUTPUT = "output cache"
ROOT_EXCEPTION = "stored exception"
ROOT_MODULE = "module global"
ROOT_CLASS = "class attribute"
ROOT_THREAD = "thread"
ROOT_CONTEXT = "context variable"  # the running context's variables (contextvars)
ROOT_SHELL = "the shell"
# A reference the interpreter keeps in C, read through its own API: a signal handler, the
# trace and profile functions. No referrer search reaches them.
ROOT_SIGNAL = "signal handler"
ROOT_HOOK = "interpreter hook"
# Outcomes for a tensor no root reaches.
STATE_ROOTED = "rooted"
STATE_GARBAGE = "garbage"  # only reference cycles keep it: the next gc.collect() frees it
STATE_UNSEEN = "unseen"  # a reference from where Python cannot see (C code, a running frame)
STATE_NOT_SEARCHED = "not searched"
# With ``explained`` referrers (a proposed cut): nothing keeps it once they go, not even a cycle.
STATE_FREED = "freed"

# Levels at which objects with no tracked referrer are looked for in untracked containers
# (an object array inside an untracked dict inside a namespace is three).
_UNTRACKED_LEVELS = 4
# The heap is looked through for untracked containers this many objects at a time, the search's
# clock read between them: one pass over 5,000,000 objects in one call took 2.6 s of a
# cleanup's 0.5 s search (and 4.2 s of its 4.2 s) on the 2-core machine.
UNTRACKED_CHUNK = 1 << 16
# Up to this many frontier objects are looked up by the C call (one heap pass that compares
# each reference with each of them: 0.3 ns a comparison); more by one Python pass over the
# heap with a set of ids (about 0.6 s for a million objects on the development machine).
_SMALL_FRONTIER = 256
MAX_LEVELS = 40
OBJECT_CAP = 500_000
BUDGET_S = 1.0

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What an advice line may name: names, attributes, and int or plain str subscripts.
_EXPRESSION = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[-?\d+\]|\['[\w .-]*'\])*")
_MODULES_ITEM = re.compile(r"\._modules\['([^']*)'\]")
_PARAMS_ITEM = re.compile(r"\._(?:parameters|buffers)\['([A-Za-z_][A-Za-z0-9_]*)'\]")
_DICT_DESC = type.__dict__["__dict__"]
_MODULE_DICT: Any = vars(types.ModuleType)["__dict__"]


@dataclass(frozen=True, order=True)
class Root:
    """One reference a user can remove, and how."""

    kind: str
    name: str  # as typed: "featcache.store", "dl", "Out[3]", "Trainer.cache"
    code: str = ""  # what removes it ("del dl"); "" where no line of code does
    # The object the reference points at is a builtin container: emptying it is a fix that
    # keeps the name (``featcache.store.clear()``).
    container: bool = False
    # It points at a class: a class lives in reference cycles of its own (its ``__mro__``
    # holds it), so removing the name frees nothing until a collection.
    cyclic: bool = False


@dataclass
class Retained:
    """What the search found for one storage (the tensors that share it)."""

    key: tuple[str, int]
    device: str
    nbytes: int
    state: str = STATE_NOT_SEARCHED
    roots: frozenset[Root] = frozenset()
    path: str = ""  # the shortest path from a root, in the words a user types
    root_kind: str = ""  # the kind of the root that path starts at
    classes: tuple[str, ...] = ()  # for garbage: the classes in its cycles
    why: str = ""  # for "not searched": the bound that cut it
    # The container every path from a root runs through, whose class has a public ``clear``:
    # the expression that empties it (``reg.clear()``); "" where there is none.
    clear_code: str = ""
    # Objects between its roots and it refer to each other: once the roots' references go,
    # those cycles keep it until Python's collector runs (a mock and its children, a class
    # made in a function): removing the references frees nothing before ``gc.collect()``.
    cyclic: bool = False


@dataclass
class RootContext:
    """Where the roots are, for one search. Built by the caller (the monitor knows the shell);
    everything is optional, so the search also runs on a bare interpreter."""

    user_ns: Mapping[Any, Any] | None = None
    out: Mapping[Any, Any] | None = None  # the output cache's dict (``Out``)
    output_names: frozenset[str] = frozenset()  # ``_``, ``_3``: the cache's own names
    shell: Any = None
    stored_exceptions: Sequence[BaseException] = ()
    modules: Mapping[str, Any] | None = None  # sys.modules
    # Live threads' frame locals: id(value) -> the root that names it (threads.py).
    thread_locals: Mapping[int, Root] = field(default_factory=dict)


@dataclass
class Outcome:
    retained: list[Retained]
    elapsed_s: float = 0.0
    levels: int = 0
    objects: int = 0  # objects the search entered
    cut: str = ""  # the bound that cut it, if one did


class _Step:
    """An edge's label, rendered once the whole path is known."""

    __slots__ = ("kind", "text")

    def __init__(self, kind: str, text: str) -> None:
        self.kind = kind  # "key", "index", "attr", "dict", "text"
        self.text = text


def _key_text(key: Any) -> str:
    if type(key) in (str, int, float, bool, bytes) or key is None:
        text = repr(key)
        return text if len(text) <= 40 else text[:37] + "…"
    return "…"


def _render(root: Root, steps: Sequence[_Step]) -> str:
    """``root.name`` and the steps below it: an object's ``__dict__`` makes its keys
    attributes; torch's module dicts are said as attributes and indexes."""
    out = [root.name]
    attr_next = False
    for s in steps:
        if s.kind == "dict":
            attr_next = True
            continue
        if s.kind == "key":
            if attr_next and _IDENT.match(s.text.strip("'")) and s.text.startswith("'"):
                out.append("." + s.text.strip("'"))
            else:
                out.append(f"[{s.text}]")
        elif s.kind == "attr":
            out.append("." + s.text)
        elif s.kind == "index":
            out.append(f"[{s.text}]")
        else:
            out.append(s.text)
        attr_next = False
    text = "".join(out)
    text = _MODULES_ITEM.sub(lambda m: f"[{m[1]}]" if m[1].isdigit() else f".{m[1]}", text)
    return _PARAMS_ITEM.sub(lambda m: f".{m[1]}", text)


def _library_module(name: str, module: Any) -> bool:
    """The standard library's or an installed package's module, not one the user wrote."""
    if name.partition(".")[0] in sys.stdlib_module_names:
        return True
    try:
        path = _MODULE_DICT.__get__(module).get("__file__")
    except Exception:
        return False
    return type(path) is str and ("site-packages" in path or "dist-packages" in path)


def _class_dict(klass: Any) -> Any:
    """The dict behind a class's ``__dict__`` proxy: what the collector sees refer to a
    class attribute's value."""
    try:
        proxy = _DICT_DESC.__get__(klass)
        for d in gc.get_referents(proxy):
            if type(d) is dict:
                return d
    except Exception:
        pass
    return None


def _instance_dict(obj: Any) -> Any:
    """An object's own ``__dict__``, through the C descriptor its class has (no
    ``__getattr__`` or property runs); None where it has none."""
    desc = static_attribute(type(obj), "__dict__")
    if type(desc) is not types.GetSetDescriptorType:
        return None
    try:
        d = desc.__get__(obj)
    except Exception:
        return None
    return d if type(d) is dict else None


class Search:
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

    # -- roots -------------------------------------------------------------------------------
    def _index_roots(self) -> None:
        ctx = self.ctx
        mods = ctx.modules if ctx.modules is not None else sys.modules
        ns = ctx.user_ns
        user_names: dict[int, str] = {}
        if isinstance(ns, dict):
            self._named[id(ns)] = (ROOT_VARIABLE, "", ns)
            for name, value in list(dict.items(ns)):
                if type(name) is str and type(value) is types.ModuleType:
                    user_names.setdefault(id(value), name)
        self._module_alias = user_names
        if isinstance(ctx.out, dict):
            self._named[id(ctx.out)] = (ROOT_OUTPUT, "Out", ctx.out)
        for name, module in list(mods.items()):
            if type(module) is not types.ModuleType or type(name) is not str:
                continue
            try:
                d = _MODULE_DICT.__get__(module)
            except Exception:
                continue
            if type(d) is not dict or id(d) in self._named:
                continue
            self._named[id(d)] = (ROOT_MODULE, name, module)
            self._index_classes(name, module, d)
        self._index_context(ns)
        self._index_interpreter_hooks()
        if ctx.shell is not None:
            self._root_objects[id(ctx.shell)] = Root(ROOT_SHELL, "get_ipython()")
        for exc in ctx.stored_exceptions:
            self._root_objects[id(exc)] = Root(ROOT_EXCEPTION, "the stored exception",
                                               "%gpumem cleanup")

    def _index_interpreter_hooks(self) -> None:
        """What the interpreter holds in C and says through its own API: each signal's
        handler (``signal.signal(SIGTERM, partial(save, snapshot=...))`` kept 21 GiB that no
        referrer search reached), the trace and profile functions."""
        signal = sys.modules.get("signal")
        if signal is not None:
            try:
                signals = list(signal.valid_signals())
            except Exception:
                signals = []
            plain = {id(signal.SIG_DFL), id(signal.SIG_IGN), id(signal.default_int_handler)}
            for sig in signals:
                try:
                    handler = signal.getsignal(sig)
                    name = signal.Signals(sig).name
                except Exception:
                    continue
                if handler is None or id(handler) in plain or type(handler) is int or \
                        id(handler) in self._root_objects:
                    continue
                back = "signal.default_int_handler" if name == "SIGINT" else "signal.SIG_DFL"
                self._root_objects[id(handler)] = Root(
                    ROOT_SIGNAL, f"the {name} handler (signal.getsignal(signal.{name}))",
                    f"import signal; signal.signal(signal.{name}, {back})")
            handler = None
        for fn, name in ((sys.gettrace(), "sys.gettrace()"),
                         (sys.getprofile(), "sys.getprofile()")):
            if fn is not None and id(fn) not in self._root_objects:
                # A debugger's or profiler's: named, never switched off by a line of ours.
                self._root_objects[id(fn)] = Root(ROOT_HOOK, f"the function {name} returns")
        fn = None

    def _index_classes(self, name: str, module: Any, d: dict[Any, Any]) -> None:
        """Each class a module defines at its top level: its own dict is a root, so that a
        class attribute is named ``module.Class.attr`` and fixed there."""
        for cname, klass in list(d.items()):
            if type(cname) is not str or not isinstance(klass, type):
                continue
            if static_attribute(klass, "__module__") != name:
                continue  # imported from elsewhere: indexed under its own module
            cd = _class_dict(klass)
            if cd is not None and id(cd) not in self._named:
                self._named[id(cd)] = (ROOT_CLASS, f"{name}\0{cname}", module)

    def _class_root(self, prefix: str, module: Any, key: Any, value: Any) -> Root:
        modname, _, cname = prefix.partition("\0")
        if modname == "__main__":
            base = cname
        else:
            alias = self._module_alias.get(id(module))
            base = f"{alias or modname}.{cname}"
        label = f"{base}.{key}" if type(key) is str else f"{base}[{_key_text(key)}]"
        container = type(value) in (list, dict, set, deque)
        code = "" if type(key) is not str or not _IDENT.match(key) else (
            f"{label}.clear()" if container else f"{label} = None")
        if code and modname != "__main__" and not self._module_alias.get(id(module)):
            code = f"import {modname}; {code}"
        if code and _library_module(modname, module):
            # A library class's own state (logging.Logger.manager): setting it to None breaks
            # the library; the advice names it and leaves the line out.
            code = ""
        return Root(ROOT_CLASS, label, code, container)

    def _module_root(self, name: str, module: Any, key: Any, value: Any) -> Root:
        if name == "threading" and key in ("_active", "_limbo"):
            # threading's registry of running threads: what a live thread object keeps goes
            # when the thread ends, never by editing the registry.
            return Root(ROOT_THREAD, "a live thread (threading's registry of running threads)")
        if name == "sys" and key in ("last_value", "last_exc", "last_traceback", "last_type"):
            return Root(ROOT_EXCEPTION, f"the stored exception (sys.{key})", "%gpumem cleanup")
        if name == "builtins" and key in UNDERS:
            return Root(ROOT_OUTPUT, str(key), "%gpumem cleanup --out")
        if name == "__main__":
            prefix = ""
        else:
            alias = self._module_alias.get(id(module))
            prefix = f"{alias}." if alias else f"{name}."
        label = f"{prefix}{key}" if type(key) is str else f"{prefix.rstrip('.')}[{_key_text(key)}]"
        container = type(value) in (list, dict, set, deque)
        if type(key) is not str or not _IDENT.match(key):
            code = ""
        elif container:
            code = f"{label}.clear()"
        else:
            code = f"{label} = None"
        if code and prefix and not self._module_alias.get(id(module)):
            code = f"import {name}; {code}"
        if code and _library_module(name, module):
            # A library's own state (logging's handlers, weakref.finalize's registry, a
            # package's caches): editing it breaks the library, or is undone by it; the advice
            # names it and leaves the line out.
            code = ""
        return Root(ROOT_MODULE, label, code, container)

    def _index_context(self, ns: Any) -> None:
        try:
            items = list(contextvars.copy_context().items())
        except Exception:
            return
        names = {id(v): k for k, v in dict.items(ns) if type(k) is str} \
            if isinstance(ns, dict) else {}
        for var, value in items:
            key = f"{var.name}" if type(var.name) is str else "?"
            if key in self._context or value is None:
                continue
            self._context[key] = value
            user = names.get(id(var))
            self._context_code[key] = f"{user}.set(None)" if user and _IDENT.match(user) else ""
        if self._context:
            self._named[id(self._context)] = (ROOT_CONTEXT, "", self._context_code)

    def _named_root(self, kind: str, prefix: str, owner: Any, key: Any, value: Any) -> Root:
        if kind == ROOT_CONTEXT:
            return Root(ROOT_CONTEXT, f"the context variable {key!r}", owner.get(key, ""))
        if kind == ROOT_MODULE:
            return self._module_root(prefix, owner, key, value)
        if kind == ROOT_CLASS:
            return self._class_root(prefix, owner, key, value)
        if kind == ROOT_OUTPUT:
            return Root(ROOT_OUTPUT, f"Out[{_key_text(key)}]", "%gpumem cleanup --out")
        # The notebook's namespace.
        if type(key) is not str:
            return Root(ROOT_VARIABLE, f"globals()[{_key_text(key)}]")
        if key in self.ctx.output_names:
            return Root(ROOT_OUTPUT, key, "%gpumem cleanup --out")
        if key in (*UNDERS, "Out", "_oh"):
            return Root(ROOT_OUTPUT, key, "%gpumem cleanup --out")
        return Root(ROOT_VARIABLE, key, f"del {key}" if _IDENT.match(key) else "",
                    type(value) in (list, dict, set, deque), issubclass(type(value), type))

    # -- one level: who refers to the frontier -----------------------------------------------
    def _referrers(self, frontier: list[Any], heap: list[Any] | None) -> list[Any]:
        if len(frontier) <= _SMALL_FRONTIER or heap is None:
            found = gc.get_referrers(*frontier)  # C: one pass, each reference against each
        else:
            ids = {id(o) for o in frontier}
            self._scaffold.add(id(ids))
            found = []
            referents = gc.get_referents
            for x in heap:
                if not ids.isdisjoint(map(id, referents(x))):
                    found.append(x)
        self._scaffold.add(id(found))
        return found

    def _edges(self, parent: Any, wanted: set[int]) -> list[tuple[Any, _Step]]:
        """(child, step) for each frontier object ``parent`` refers to, named by where it is
        inside ``parent``; read through base types only."""
        out: list[tuple[Any, _Step]] = []
        t = type(parent)
        try:
            if issubclass(t, dict):
                for k, v in dict.items(parent):
                    if id(v) in wanted:
                        out.append((v, _Step("key", _key_text(k))))
                    if id(k) in wanted:
                        out.append((k, _Step("text", " (a key)")))
                return out if t is dict else self._more_edges(parent, wanted, out)
            if issubclass(t, (list, tuple)):
                base = list if issubclass(t, list) else tuple
                for i, v in enumerate(base.__iter__(parent)):
                    if id(v) in wanted:
                        out.append((v, _Step("index", str(i))))
                return out if t in (list, tuple) else self._more_edges(parent, wanted, out)
            if t is deque:
                for i, v in enumerate(deque.__iter__(parent)):
                    if id(v) in wanted:
                        out.append((v, _Step("index", str(i))))
                return out
            if issubclass(t, (set, frozenset)):
                members = set.__iter__(parent) if issubclass(t, set) else \
                    frozenset.__iter__(parent)
                for v in members:
                    if id(v) in wanted:
                        out.append((v, _Step("text", "{…}")))
                return out
            if t is types.CellType:
                v = parent.cell_contents
                return [(v, _Step("text", ""))] if id(v) in wanted else []
            if t is types.FunctionType:
                return self._function_edges(parent, wanted)
            if t is types.MethodType:
                return [(v, _Step("attr", "__self__")) for v in (parent.__self__,)
                        if id(v) in wanted]
            if t is functools.partial:
                return [(v, _Step("attr", a)) for a, v in (
                    ("func", parent.func), ("args", parent.args),
                    ("keywords", parent.keywords)) if id(v) in wanted]
            if t is types.FrameType:
                return self._frame_edges(parent, wanted)
            if t is types.TracebackType:
                return [(v, _Step("text", "")) for v in (parent.tb_frame, parent.tb_next)
                        if id(v) in wanted]
            if t in (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType):
                code = getattr(parent, "gi_code", None) or getattr(parent, "cr_code", None) \
                    or getattr(parent, "ag_code", None)
                label = f" (suspended {getattr(code, 'co_name', '?')}() locals)"
                return [(v, _Step("text", label)) for v in gc.get_referents(parent)
                        if id(v) in wanted]
            if t is _LRU_WRAPPER:
                return [(v, _Step("text", " lru_cache results")) for v in gc.get_referents(parent)
                        if id(v) in wanted]
            if issubclass(t, type):
                d = _class_dict(parent)
                return [(v, _Step("dict", "")) for v in gc.get_referents(parent)
                        if id(v) in wanted and v is not d] + (
                    [(d, _Step("dict", ""))] if id(d) in wanted else [])
        except Exception:
            pass
        return self._object_edges(parent, wanted)

    def _more_edges(self, parent: Any, wanted: set[int],
                    out: list[tuple[Any, _Step]]) -> list[tuple[Any, _Step]]:
        """A container subclass's items, and what else it refers to: its attributes, and a
        C slot the collector traverses (a defaultdict's ``default_factory``)."""
        seen = {id(v) for v, _ in out}
        return out + [(v, step) for v, step in self._object_edges(parent, wanted)
                      if id(v) not in seen]

    def _function_edges(self, fn: Any, wanted: set[int]) -> list[tuple[Any, _Step]]:
        out: list[tuple[Any, _Step]] = []
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False):
            if id(cell) in wanted:
                out.append((cell, _Step("text", f" closure '{name}'")))
        for v in gc.get_referents(fn):
            if id(v) in wanted and not any(v is c for c, _ in out):
                label = (" defaults" if v is fn.__defaults__ else
                         " keyword defaults" if v is fn.__kwdefaults__ else
                         ".__dict__" if v is getattr(fn, "__dict__", None) else " (a reference)")
                out.append((v, _Step("text", label)))
        return out

    def _frame_edges(self, frame: Any, wanted: set[int]) -> list[tuple[Any, _Step]]:
        """A finished frame (a traceback's, a generator's): its locals by name. Reading
        ``f_locals`` of a finished frame keeps nothing its frame does not keep already."""
        out: list[tuple[Any, _Step]] = []
        name = frame.f_code.co_name
        if id(frame) not in self._running:
            try:
                for k, v in dict(frame.f_locals).items():
                    if id(v) in wanted:
                        out.append((v, _Step("text", f" ({name}() local {k})")))
            except Exception:
                pass
        seen = {id(v) for v, _ in out}
        for v in gc.get_referents(frame):
            if id(v) in wanted and id(v) not in seen:
                out.append((v, _Step("text", f" ({name}() frame)")))
        return out

    def _object_edges(self, obj: Any, wanted: set[int]) -> list[tuple[Any, _Step]]:
        out: list[tuple[Any, _Step]] = []
        d = _MODULE_DICT.__get__(obj) if type(obj) is types.ModuleType else _instance_dict(obj)
        if d is not None:
            if id(d) in wanted:
                out.append((d, _Step("dict", "")))
            for k, v in dict.items(d):
                if id(v) in wanted:
                    out.append((v, _Step("attr", k) if type(k) is str else
                                _Step("key", _key_text(k))))
        try:
            for klass in type.__dict__["__mro__"].__get__(type(obj)):
                for name, desc in list(_DICT_DESC.__get__(klass).items()):
                    if type(desc) is types.MemberDescriptorType and type(name) is str:
                        try:
                            v = desc.__get__(obj)
                        except Exception:
                            continue
                        if id(v) in wanted:
                            out.append((v, _Step("attr", name)))
        except Exception:
            pass
        seen = {id(v) for v, _ in out}
        label = f" (in a {type_name(type(obj))})"
        for v in gc.get_referents(obj):
            if id(v) in wanted and id(v) not in seen:
                out.append((v, _Step("text", label)))
                seen.add(id(v))
        return out

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
            self._resolve(retained, members, alive, parents, roots_of, unresolved, cut)
        finally:
            frontier.clear()
            alive.clear()
            self._hidden_dicts.clear()
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
        refs = self._referrers(frontier, heap)
        wanted = {id(o) for o in frontier}
        nxt: list[Any] = []
        self._scaffold.update((id(wanted), id(nxt)))
        got: set[int] = set()
        for r in refs:
            rid = id(r)
            if rid in explained_ids:
                self._cut_children.update(id(child) for child, _ in self._edges(r, wanted))
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
            if any(r is d for r in gc.get_referents(t)):
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

    def _thread_roots(self, frontier: list[Any],
                      roots_of: dict[int, list[tuple[Root, _Step | None]]]) -> None:
        locals_ = self.ctx.thread_locals
        if not locals_:
            return
        for o in frontier:
            root = locals_.get(id(o))
            if root is not None:
                roots_of.setdefault(id(o), []).append((root, None))

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
                refs = gc.get_referents(*chunk)
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
            for tid in members[key]:
                # Breadth first up the parents: the first root met is the nearest.
                q: deque[tuple[int, list[_Step], list[int]]] = deque([(tid, [], [tid])])
                seen = {tid}
                nearest: tuple[Root, _Step | None, list[_Step], list[int]] | None = None
                while q:
                    oid, steps, chain = q.popleft()
                    ancestors.add(oid)
                    for root, step in roots_of.get(oid, ()):
                        roots.add(root)
                        path = [step, *steps] if step is not None else steps
                        text = _render(root, path)
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
                    r.path = _render(what, top[1])
            else:
                r.state = STATE_GARBAGE
                r.classes = self._cycle_classes(ancestors, alive, set(members[key]))
                if r.classes is None:  # a reference from outside the cycle, unseen
                    r.state, r.classes = STATE_UNSEEN, ()
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
            expr = _render(root, path[:k + offset])
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
                       targets: set[int]) -> Any:
        """The classes of the objects in a closed set of referrers, if nothing outside it
        refers to them (each one's reference count is what the set's own edges explain);
        None where something unseen does."""
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
                return None
            t = type(alive[oid])
            if t not in (dict, list, tuple, set, types.CellType, types.FunctionType):
                classes.add(type_name(t))
            owner = self._hidden_dicts.get(oid)
            if owner is not None:
                # The cycle runs through the tensor's own attributes: its class is in it.
                classes.add(type_name(type(owner)))
        owner = None
        return tuple(sorted(classes))


def _describe(obj: Any) -> str:
    """What an object is, in a few words, read through C attributes only: ``a
    functools.partial of save``, ``the function make.<locals>.hook``, ``a Frame``."""
    t = type(obj)
    try:
        if t is types.FunctionType or t is types.MethodType:
            name = obj.__qualname__ if t is types.FunctionType else obj.__func__.__qualname__
            return f"the function {name}" if type(name) is str else "a function"
        if t is functools.partial:
            return f"a functools.partial of {_describe(obj.func).removeprefix('the function ')}"
    except Exception:
        pass
    return f"a {type_name(t)}"


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


def _unquote(text: str, d: Any, child: Any) -> Any:
    """The dict key whose value is ``child`` (the rendered text is for display only)."""
    for k, v in dict.items(d):
        if v is child:
            return k
    return text


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
                yield gc.get_referents(*small)
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
                yield gc.get_referents(c)
    if small:
        yield gc.get_referents(*small)


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
