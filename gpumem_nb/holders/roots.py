"""The retention search's roots: what a root is (``Root``, its ``ROOT_*`` kinds), where they
are (``RootContext``), and their indexing before each search: the notebook's namespace, the
output cache, every module's globals and its top-level classes' attributes, the running
context's variables, signal handlers and the interpreter's hooks, the shell and the stored
exception, live threads' locals; each named in the words a user types, with the line that
removes it. ``Search`` mixes in ``RootIndex``."""

from __future__ import annotations

import contextvars
import os
import sys
import types
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .edges import _MODULE_DICT, _class_dict
from .pathtext import _IDENT, _key_text, _Step
from .reading import UNDERS, static_attribute

__all__ = [
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
    "Root",
    "RootContext",
    "RootIndex",
]

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
    # The module a line that reaches in through ``name`` must import first ("" where the
    # notebook has it under that name): a line made below the root (``resolve.py``'s entry
    # removal) needs it as ``code`` does.
    module: str = ""
    # How deep below its root a line made below the root reaches (``resolve.py``'s entry
    # removal): the deeper lines run first, before a line above them changes what they index.
    depth: int = 0


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


def _library_module(name: str, module: Any) -> bool:
    """The standard library's or an installed package's module, not one the user wrote."""
    if name.partition(".")[0] in sys.stdlib_module_names:
        return True
    try:
        path = _MODULE_DICT.__get__(module).get("__file__")
    except Exception:
        return False
    if type(path) is not str:
        return False
    if "site-packages" in path or "dist-packages" in path:
        return True
    # A folder packages are installed into by other means (`pip install --target`, a
    # PYTHONPATH of wheels): on the H100, comm and ipywidgets installed so were taken for the
    # user's modules, and the advice set `comm._comm_manager = None`.
    for entry in sys.path:
        if type(entry) is str and entry and path.startswith(entry.rstrip(os.sep) + os.sep):
            return _install_folder(entry)
    return False


_INSTALL_FOLDERS: dict[str, bool] = {}


def _install_folder(folder: str) -> bool:
    """Whether an import path holds installed distributions (a ``*.dist-info`` or
    ``*.egg-info`` beside the packages), read once per folder."""
    known = _INSTALL_FOLDERS.get(folder)
    if known is None:
        try:
            known = any(n.endswith((".dist-info", ".egg-info")) for n in os.listdir(folder))
        except OSError:
            known = False
        _INSTALL_FOLDERS[folder] = known
    return known


def _restore_line(label: str, prefix: str, key: Any, value: Any, module: Any,
                  imports: str) -> str:
    """``threading.excepthook = threading.__excepthook__``: where a library module keeps the
    original of a global the user replaced under its dunder name (read from the module's
    dict: no ``__getattr__`` runs), the line that puts it back; else ""."""
    if type(key) is not str or not _IDENT.match(key) or key.startswith("_"):
        return ""
    try:
        d = _MODULE_DICT.__get__(module)
        original = d.get(f"__{key}__")
        name = d.get("__name__")
    except Exception:
        return ""
    if name not in ("sys", "threading"):
        return ""  # only the interpreter's own hooks (a PEP 562 `__getattr__` is no original)
    if original is None or original is value or not callable(original):
        return ""
    line = f"{label} = {prefix}__{key}__"
    return f"import {imports}; {line}" if imports else line


class RootIndex:
    """The roots of one search, for ``Search``: indexed by ``_index_roots`` at its start."""

    ctx: RootContext
    # id(a dict whose keys name what it holds) -> (root kind, prefix, owner)
    _named: dict[int, tuple[str, str, Any]]
    _root_objects: dict[int, Root]  # id(an object that is a root itself) -> that root
    _module_alias: dict[int, str]  # id(module) -> the name the notebook imported it as
    _context: dict[str, Any]
    _context_code: dict[str, str]

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
            # type(), never isinstance(): isinstance falls back to the object's own
            # __class__, which runs its code (torch.distributed.reduce_op warned in every
            # cleanup on the H200; a lazy proxy would import or connect).
            if type(cname) is not str or not issubclass(type(klass), type):
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
        imports = modname if modname != "__main__" and not self._module_alias.get(id(module)) \
            else ""
        if code and imports:
            code = f"import {imports}; {code}"
        if code and _library_module(modname, module):
            # A library class's own state (logging.Logger.manager): setting it to None breaks
            # the library; the advice names it and leaves the line out.
            code = ""
        return Root(ROOT_CLASS, label, code, container, module=imports)

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
        imports = name if prefix and not self._module_alias.get(id(module)) else ""
        if code and imports:
            code = f"import {imports}; {code}"
        if code and _library_module(name, module):
            # A library's own state (logging's handlers, weakref.finalize's registry, a
            # package's caches): editing it breaks the library, or is undone by it; the advice
            # names it and leaves the line out. Where the library keeps what it had before
            # under ``__name__`` (``sys.__excepthook__``, ``threading.__excepthook__``: the
            # interpreter's own convention for a hook a user may replace), putting that back
            # is the library's own way to undo the replacement.
            code = _restore_line(label, prefix, key, value, module, imports)
        return Root(ROOT_MODULE, label, code, container, module=imports)

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

    def _thread_roots(self, frontier: list[Any],
                      roots_of: dict[int, list[tuple[Root, _Step | None]]]) -> None:
        locals_ = self.ctx.thread_locals
        if not locals_:
            return
        for o in frontier:
            root = locals_.get(id(o))
            if root is not None:
                roots_of.setdefault(id(o), []).append((root, None))
