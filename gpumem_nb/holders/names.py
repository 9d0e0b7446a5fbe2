"""The names a notebook's namespace holds that are not the user's variables: the shell's own
(``In``, ``Out``, ``exit``), the input history's aliases, and the output cache's ``_``, ``__``,
``___`` and ``_N``, which stay the cache's only while they hold what the cache put there."""

from __future__ import annotations

import builtins
import re
from collections.abc import Mapping
from typing import Any

from .reading import MISSING as _MISSING
from .reading import UNDERS

__all__ = [
    "INPUT_ALIAS",
    "OUTPUT_ALIAS",
    "SHELL_NAMES",
    "alias_order",
    "name_of",
    "output_cache_names",
]

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


def exact_int_keys(entries: Mapping[Any, Any] | None) -> dict[int, Any]:
    """The output cache as ``{n: value}`` with plain ``int`` keys. A key of an int subclass
    is copied by ``int``'s own conversion, so its ``__format__``, ``__repr__``, ``__hash__``
    or ``__eq__`` never runs when the entry is labelled ``Out[n]`` or looked up (A4); a key
    that is no int names no cell and is left out."""
    if not entries:
        return {}
    items = dict.items(entries) if isinstance(entries, dict) else entries.items()
    return {int.__int__(k): v for k, v in list(items)
            if isinstance(k, int) and not isinstance(k, bool)}


def name_of(key: Any) -> str | None:
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
