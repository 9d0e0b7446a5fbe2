"""One referrer's edges down to the search's frontier, each named by where the child is inside
it (a dict's key, a list's index, an attribute, a closure's cell, a finished frame's local):
read through base types and C descriptors only, so that no user code runs. ``Search`` mixes
in ``EdgeReader``; what the collector's traversal cannot show is added in ``untracked.py``."""

from __future__ import annotations

import functools
import types
from collections import deque
from typing import Any

from ..referents import _MODULE_DICT, referents
from .pathtext import _key_text, _Step
from .reading import static_attribute, type_name

__all__ = ["EdgeReader"]

# An lru_cache's results (and the arguments it keys them on, `self` for a method) are freed by
# `cache_clear()`, never by deleting the function that owns the cache: the step says so, and the
# advice rests on it.
_LRU_WRAPPER: type = type(functools.lru_cache(maxsize=None)(lambda: None))
_DICT_DESC = type.__dict__["__dict__"]


def _class_dict(klass: Any) -> Any:
    """The dict behind a class's ``__dict__`` proxy: what the collector sees refer to a
    class attribute's value."""
    try:
        proxy = _DICT_DESC.__get__(klass)
        for d in referents(proxy):
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


def _finished_frame_locals(frame: Any, running: set[int]) -> Any:
    """The dict a finished frame caches its locals in (Python 3.11 and 3.12), made by the
    first read of ``f_locals``, which this search's own edges do: None for a running frame,
    never read, and where ``f_locals`` is no dict the frame keeps (3.13's proxy)."""
    if type(frame) is not types.FrameType or id(frame) in running:
        return None
    try:
        d = frame.f_locals
    except Exception:
        return None
    return d if type(d) is dict else None


class EdgeReader:
    """The edges of one referrer, for ``Search``: a running frame's locals are never read
    (``_running``, the search's ids of the frames running now)."""

    _running: set[int]

    def _edges(self, parent: Any, wanted: set[int]) -> list[tuple[Any, _Step]]:
        """(child, step) for each frontier object ``parent`` refers to, named by where it is
        inside ``parent``; read through base types only. Whatever else the collector's own
        traversal shows ``parent`` refers to is an edge too, said as a reference: a type read
        in part (a bound method's function was missed) made its child look held from where
        Python cannot see. Never for a frame: a running one's locals are not the search's."""
        out = self._typed_edges(parent, wanted)
        if type(parent) is types.FrameType:
            return out
        try:
            named = {id(v) for v, _ in out}
            own = _instance_dict(parent)
            for v in referents(parent):
                if id(v) in wanted and id(v) not in named:
                    named.add(id(v))
                    out.append((v, _Step("dict", "") if v is own else
                                _Step("text", " (a reference)")))
        except Exception:
            pass
        return out

    def _typed_edges(self, parent: Any, wanted: set[int]) -> list[tuple[Any, _Step]]:
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
                # Both: a method made with `types.MethodType(f, obj)` and kept (IPython's
                # `set_custom_exc` handler) is the only referrer of its function.
                return [(v, _Step("attr", a)) for a, v in (
                    ("__self__", parent.__self__), ("__func__", parent.__func__))
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
                return [(v, _Step("text", label)) for v in referents(parent)
                        if id(v) in wanted]
            if t is _LRU_WRAPPER:
                return [(v, _Step("text", " lru_cache results")) for v in referents(parent)
                        if id(v) in wanted]
            if issubclass(t, type):
                d = _class_dict(parent)
                return [(v, _Step("dict", "")) for v in referents(parent)
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
        for v in referents(fn):
            if id(v) in wanted and not any(v is c for c, _ in out):
                # The closure's tuple, where the search went up through it rather than
                # straight to a cell: its index then follows ("closure[0]").
                label = (" closure" if v is fn.__closure__ else
                         " defaults" if v is fn.__defaults__ else
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
        for v in referents(frame):
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
        for v in referents(obj):
            if id(v) in wanted and id(v) not in seen:
                out.append((v, _Step("text", label)))
                seen.add(id(v))
        return out
