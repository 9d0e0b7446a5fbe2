"""What an object is, read by its real type and ``type``'s own C descriptors, never by asking
the object: atoms that hold no tensor, builtin containers and their items, the classes a
notebook defined. A proxy's ``__class__``, a subclass's ``__iter__`` or a metaclass's
``__eq__`` never runs."""

from __future__ import annotations

import functools
import types
from collections.abc import Iterable
from typing import Any

from ..referents import referents
from .reading import type_name

__all__ = [
    "ATOMS",
    "ATOM_IDS",
    "ATOM_TYPES",
    "CLASS_MEMBERS",
    "C_DESCRIPTORS",
    "KEY_IDS",
    "LRU_LINK",
    "LRU_WRAPPER",
    "PLAIN_IDS",
    "attr_step",
    "attribute_plan",
    "class_reference",
    "container_items",
    "container_len",
    "is_a",
    "is_atom",
    "key_step",
    "top_module",
    "user_class",
]

# A class's own lookups through ``type``'s C descriptors: a metaclass's ``__getattribute__``
# or ``__getattr__`` never runs.
_TYPE_MRO = type.__dict__["__mro__"]
_TYPE_DICT = type.__dict__["__dict__"]
# What a class's namespace holds that is no state of its own: methods and descriptors.
CLASS_MEMBERS = (types.FunctionType, staticmethod, classmethod, property,
                 types.MemberDescriptorType, types.GetSetDescriptorType)
# Keys whose repr is the builtin's own, said in a path.
KEY_IDS = frozenset(map(id, (str, int, float, bool, bytes)))
# functools' C cache of results, which no attribute exposes.
LRU_WRAPPER: type | None = type(functools.lru_cache(maxsize=None)(lambda: None))


def _lru_link_type() -> type | None:
    """The C type of a bounded lru_cache's entries (its cache dict's values), which hold
    nothing readable: the wrapper's own traversal reaches their keys and results."""
    probe = functools.lru_cache(maxsize=1)(lambda: None)
    probe()
    for ref in referents(probe):
        if type(ref) is dict:
            for value in ref.values():
                return type(value) if type_name(type(value)) == "_lru_list_elem" else None
    return None


# A million-entry bounded cache's entries, each entered, took the whole scan's object budget.
LRU_LINK: type | None = _lru_link_type()
# Classes whose instances hold no tensor and are never entered: numbers, text, code, frames,
# descriptors, buffers.
ATOMS = (int, float, complex, str, bytes, bool, type(None), types.ModuleType, type,
         types.BuiltinFunctionType, types.CodeType, types.FrameType, types.TracebackType,
         range,
         types.MethodWrapperType, types.WrapperDescriptorType, types.MemberDescriptorType,
         types.GetSetDescriptorType, property, staticmethod, classmethod, memoryview,
         bytearray)
ATOM_TYPES = frozenset(ATOMS)
# The same, by identity: testing a type's membership in a set hashes it, and comparing it in
# a tuple may call ``__eq__``: a metaclass's own code, which may raise or do anything.
ATOM_IDS = frozenset(map(id, ATOMS))
_PLAIN_CONTAINERS = (dict, list, tuple, set, frozenset)
PLAIN_IDS = frozenset(map(id, _PLAIN_CONTAINERS))
# Attributes read on an array-like only through these descriptor types, written in C (numpy's,
# CuPy's): a Python property there is the class's own code.
C_DESCRIPTORS = (types.GetSetDescriptorType, types.MemberDescriptorType)


def is_atom(obj: Any) -> bool:
    t = type(obj)
    if id(t) in ATOM_IDS:
        return True
    try:
        return issubclass(t, ATOMS)
    except Exception:
        return False


def is_a(obj: Any, cls: Any) -> bool:
    """``isinstance`` by the object's real type: ``isinstance`` also asks ``obj.__class__``,
    which a proxy may answer by raising."""
    if cls is None:
        return False
    try:
        return issubclass(type(obj), cls)
    except Exception:
        return False


def container_len(obj: Any) -> int:
    """A builtin container's length by its base type's own ``__len__``."""
    t = type(obj)
    for base in _PLAIN_CONTAINERS:
        if issubclass(t, base):
            return int(base.__len__(obj))
    return 0


def container_items(obj: Any) -> Iterable[Any] | None:
    """A builtin container's items through the base type's own iterator, so a subclass that
    overrides ``__iter__``, ``values`` or ``__len__`` cannot lie, loop forever or raise."""
    t = type(obj)
    if issubclass(t, dict):
        return dict.values(obj)
    for base in (list, tuple, set, frozenset):
        if issubclass(t, base):
            return base.__iter__(obj)
    return None


def user_class(klass: type) -> bool:
    """A class the user defined (in a notebook cell or a script: ``__main__``), whose own
    namespace may keep state; a library's classes are not entered (their class attributes
    are configuration, and a scan would walk every library's namespaces)."""
    try:
        ns = _TYPE_DICT.__get__(klass)
        return ns.get("__module__") == "__main__"
    except Exception:
        return False


def class_reference(klass: type) -> str:
    """How the notebook reaches a class it defined (the walk enters only those): its
    qualified name, ``Outer.Inner`` for a nested one; read by type's own descriptor, no
    metaclass code. A class made inside a function has no such name: its ``__name__``."""
    try:
        qual = type.__dict__["__qualname__"].__get__(klass)
    except Exception:
        return type_name(klass)
    return qual if type(qual) is str and "<" not in qual else type_name(klass)


def top_module(klass: type) -> str:
    """``cupy`` for ``cupy.ndarray``: read by type's own descriptor, no metaclass code."""
    try:
        mod = type.__dict__["__module__"].__get__(klass)
    except Exception:
        return ""
    return mod.split(".", 1)[0] if type(mod) is str else ""


def attribute_plan(t: type) -> tuple[Any, tuple[tuple[str, Any], ...]]:
    """The class's own C descriptors for an instance's ``__dict__`` and slots: reading
    them runs no code of the class (no property, no ``__getattr__`` or
    ``__getattribute__``)."""
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
            if name == "__dict__" and type(desc) in C_DESCRIPTORS:
                # A member for C types that keep their dict in a struct field
                # (SimpleNamespace): its items are the attributes all the same.
                dict_desc = dict_desc or desc
            elif type(desc) is types.MemberDescriptorType and name != "__weakref__":
                slots.append((name, desc))
    return dict_desc, tuple(slots)


def attr_step(name: Any) -> str:
    """``.name`` for an attribute in an object's own dict; a key that is no plain ``str``
    (``obj.__dict__[k] = ...``) is said as ``key_step`` says it: formatting it would run its
    class's ``__format__``."""
    return f".{name}" if type(name) is str else key_step(name)


def key_step(key: Any) -> str:
    """``['past_key_values']``, ``[3]``; ``[…]`` for a key whose repr could run code."""
    if id(type(key)) in KEY_IDS or key is None:
        text = repr(key)
        return f"[{text}]" if len(text) <= 40 else f"[{text[:37]}…]"
    return "[…]"
