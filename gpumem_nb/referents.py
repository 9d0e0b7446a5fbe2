"""``referents``: what the garbage collector says an object refers to, without ever asking it
about a module.

``gc.get_referents(module)`` runs the module's C traversal, and CPython 3.12 without the fix
for python/cpython#122695 (Ubuntu 24.04's 3.12.3, pyenv's 3.12.1) has ``_asyncio``'s visit
a free list of dead ``FutureIter`` objects. ``get_referents`` hands them out as live
references; dropping them frees each a second time, the free list turns into a loop, and the
next ``gc.collect()`` never returns (or the interpreter aborts). A Jupyter kernel fills that
list on every ``await``. The OOM explainer's heap pass asked for the referents of every
object: the ``%gpumem cleanup`` after tutorial 11's OOM then spun in ``_asyncio``'s traversal
until the cell was killed (native stacks on the H100; the same stop on the H200).

A module's namespace is what Python code reaches through it; that is what a module gives
here. Its C state (an extension's types and caches) is left unread: what only it holds is
said as held from where Python cannot see.
"""

from __future__ import annotations

import gc
import types
from typing import Any

__all__ = ["module_dict", "referents"]

# ModuleType's own descriptor for a module's namespace: no subclass's property runs.
_MODULE_DICT: Any = vars(types.ModuleType)["__dict__"]


def module_dict(module: Any) -> dict[str, Any] | None:
    """A module's namespace, read through ``ModuleType``'s own descriptor (a subclass's
    ``__getattr__`` or property never runs)."""
    try:
        d = _MODULE_DICT.__get__(module)
    except Exception:
        return None
    return d if type(d) is dict else None


def referents(*objs: Any) -> list[Any]:
    """``gc.get_referents(*objs)``, except that a module (of any ``ModuleType`` subclass)
    gives its namespace dict and its C traversal is never run."""
    if len(objs) == 1:  # the per-object loops over the heap: one class check
        o = objs[0]
        if not issubclass(type(o), types.ModuleType):
            return gc.get_referents(o)
        d = module_dict(o)
        return [d] if d is not None else []
    kinds = set(map(type, objs))
    modules = {k for k in kinds if issubclass(k, types.ModuleType)}
    if not modules:
        return gc.get_referents(*objs)
    rest = [o for o in objs if type(o) not in modules]
    out = gc.get_referents(*rest) if rest else []
    rest.clear()
    for o in objs:
        if type(o) in modules:
            d = module_dict(o)
            if d is not None:
                out.append(d)
    return out
