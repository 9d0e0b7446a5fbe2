"""Reading a user's exception without running the user's code by accident.

A cell's exception is the user's object: its class may define ``__str__``, ``__bool__``,
``__getattr__``, properties named ``__cause__`` or ``__context__``, or a metaclass whose
``__name__`` raises, and any of these may raise anything, ``SystemExit`` and
``GeneratorExit`` included. IPython contains only ``Exception`` from an event callback: a
``SystemExit`` raised by ``str(err)`` inside our ``post_run_cell`` left ``run_cell`` and
ended the kernel. So every look at a user's exception goes through here:

- the links Python itself keeps (cause, context, traceback, args, a group's members, the
  instance dict) are read through ``BaseException``'s own descriptors, which never run a
  subclass's property or ``__getattr__``;
- a class's name, module and MRO through ``type``'s own descriptors (a metaclass cannot
  intercept them);
- ``str()`` is the only user code called (``errtext`` memoises ``text`` in the hooks, so it
  runs once per exception and cell), with every ``BaseException`` it raises contained: the
  cell has already finished, so a ``SystemExit`` or ``KeyboardInterrupt`` from a
  ``__str__`` that our hook called is that ``__str__`` failing, not the user asking to
  stop. Its result is copied to a plain ``str``, so that a ``str`` subclass's own methods
  never run afterwards.

Nothing here imports anything beyond the standard library.
"""

from __future__ import annotations

import types
from typing import Any, TypeGuard

__all__ = [
    "cause",
    "chain",
    "class_module",
    "class_name",
    "context",
    "is_exception",
    "members",
    "mro",
    "parts",
    "text",
    "traceback_of",
    "type_name",
]

_CAUSE = BaseException.__dict__["__cause__"]
_CONTEXT = BaseException.__dict__["__context__"]
_TRACEBACK = BaseException.__dict__["__traceback__"]
_ARGS = BaseException.__dict__["args"]
_DICT = BaseException.__dict__["__dict__"]
_TYPE_NAME = type.__dict__["__name__"]
_TYPE_MODULE = type.__dict__["__module__"]
_TYPE_MRO = type.__dict__["__mro__"]
try:
    _GROUP: Any = BaseExceptionGroup  # Python >= 3.11
    _MEMBERS: Any = _GROUP.__dict__["exceptions"]
except NameError:  # pragma: no cover - Python 3.10 has no exception groups
    _GROUP, _MEMBERS = None, None

def is_exception(obj: object) -> TypeGuard[BaseException]:
    """``isinstance(obj, BaseException)`` by the object's real type (``isinstance`` may ask a
    non-exception's ``__class__``, which can raise)."""
    return issubclass(type(obj), BaseException)


def cause(exc: BaseException) -> BaseException | None:
    link = _CAUSE.__get__(exc)
    return link if is_exception(link) else None


def context(exc: BaseException) -> BaseException | None:
    link = _CONTEXT.__get__(exc)
    return link if is_exception(link) else None


def traceback_of(exc: BaseException) -> types.TracebackType | None:
    tb = _TRACEBACK.__get__(exc)
    return tb if type(tb) is types.TracebackType else None


def members(exc: BaseException) -> tuple[BaseException, ...]:
    """An exception group's members; () for any other exception (whatever its
    ``__getattr__`` would answer for ``exceptions``)."""
    if _GROUP is None or not issubclass(type(exc), _GROUP):
        return ()
    found = _MEMBERS.__get__(exc)
    return tuple(e for e in found if is_exception(e)) if type(found) is tuple else ()


def parts(exc: BaseException) -> tuple[object, ...]:
    """What the exception object itself owns: its args, its instance dict, its notes, a
    group's members tuple."""
    own = _DICT.__get__(exc)
    notes = own.get("__notes__") if type(own) is dict else None
    found: list[object] = [_ARGS.__get__(exc), own, notes]
    if _GROUP is not None and issubclass(type(exc), _GROUP):
        found.append(_MEMBERS.__get__(exc))
    return tuple(p for p in found if p is not None)


def chain(exc: BaseException | None, limit: int) -> list[BaseException]:
    """``exc`` and the exceptions it chains to (cause, then context, then a group's members),
    breadth first, each once, at most ``limit``. Truthiness is never asked (``__bool__`` may
    raise): a link is followed when it is not None."""
    out: list[BaseException] = []
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    i = 0
    while i < len(todo) and len(out) < limit:
        e = todo[i]
        i += 1
        if e is None or id(e) in seen or not is_exception(e):
            continue
        seen.add(id(e))
        out.append(e)
        todo += [cause(e), context(e), *members(e)]
    return out


def class_name(cls: type) -> str:
    """A class's real ``__name__`` (a metaclass property of that name is not run), as a
    plain ``str``: ``type.__name__`` may be set to a str subclass, whose ``__str__`` is the
    user's code; ``str.__str__`` copies it without calling any of its methods."""
    name = _TYPE_NAME.__get__(cls)
    return str.__str__(name) if isinstance(name, str) else ""


def class_module(cls: type) -> object:
    """A class's ``__module__`` as stored: any object a class body set, or None; a str
    subclass comes back as a plain ``str`` copy, so that comparing it runs none of its code."""
    try:
        module = _TYPE_MODULE.__get__(cls)
    except AttributeError:  # a builtin type without one
        return None
    return str.__str__(module) if isinstance(module, str) else module


def mro(cls: type) -> tuple[type, ...]:
    found = _TYPE_MRO.__get__(cls)
    return found if type(found) is tuple else (cls,)


def type_name(exc: BaseException) -> str:
    return class_name(type(exc))


def text(exc: BaseException) -> str:
    """``str(exc)`` as a plain ``str``; "" when its ``__str__`` raises anything at all or
    returns something that is not text."""
    try:
        found = str(exc)
    except BaseException:  # see the module's docstring
        return ""
    # str.__str__ copies a subclass into a plain str without calling any of its methods.
    return str.__str__(found) if isinstance(found, str) else ""
