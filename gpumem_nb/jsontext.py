"""A value as JSON spells it, cut short: only what is shown is walked or turned into text.

Refusals quote the value they refuse in a few characters. ``json.dumps`` then a cut wrote
the whole value first: ``%config GpumemNb.interval = [0.5] * 10**7`` took 11-13 s to say
the list was not a number, and a replayed ``rss_bytes`` of 5,000,000 floats 5.4 s. Here a
list of ten million costs what its first few items do.

Containers are read through the base types' own methods (``dict.items``, ``list.__iter__``,
``str.__getitem__``), as ``json``'s encoder does, so no method of a subclass runs.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["json_prefix"]

_CUT = "..."


class _Out:
    """The text so far, and whether it has passed the characters that will be shown."""

    def __init__(self, room: int) -> None:
        self.parts: list[str] = []
        self.room = room

    @property
    def full(self) -> bool:
        return self.room <= 0

    def add(self, text: str) -> None:
        self.parts.append(text)
        self.room -= len(text)


def json_prefix(value: object, limit: int = 40) -> str:
    """``json.dumps(value)`` when it is at most ``limit`` characters, else its first
    ``limit - 3`` and "...". Raises ``TypeError`` or ``ValueError`` for what JSON cannot
    spell, as ``json.dumps`` does (among the characters shown: what is cut is never read)."""
    out = _Out(limit + 1)  # one character past the limit says the text is cut
    _walk(value, out)
    text = "".join(out.parts)
    return text if len(text) <= limit else text[:limit - len(_CUT)] + _CUT


def _scalar(value: Any, room: int) -> str | None:
    """A scalar's JSON text (a string's first ``room`` characters), or None for a container."""
    kind = type(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if issubclass(kind, int):
        return int.__repr__(int.__int__(value))  # ValueError past 4,300 digits, as json's
    if issubclass(kind, float):
        x = float.__float__(value)
        return ("NaN" if x != x else "Infinity" if x == float("inf")
                else "-Infinity" if x == float("-inf") else float.__repr__(x))
    if issubclass(kind, str):
        return json.dumps(str.__getitem__(value, slice(0, max(room, 0))))
    return None


def _key(key: Any) -> str:
    if issubclass(type(key), str):
        return json.dumps(str.__getitem__(key, slice(0, 64)))
    if key is None or issubclass(type(key), (bool, int, float)):
        return json.dumps(_scalar(key, 64))
    raise TypeError("keys must be str, int, float, bool or None")


def _walk(value: Any, out: _Out) -> None:
    text = _scalar(value, out.room)
    if text is not None:
        out.add(text)
        return
    kind = type(value)
    if issubclass(kind, dict):
        out.add("{")
        for i, (k, v) in enumerate(dict.items(value)):
            if out.full:
                return
            out.add((", " if i else "") + _key(k) + ": ")
            _walk(v, out)
        out.add("}")
    elif issubclass(kind, (list, tuple)):
        out.add("[")
        items = list.__iter__(value) if issubclass(kind, list) else tuple.__iter__(value)
        for i, v in enumerate(items):
            if out.full:
                return
            if i:
                out.add(", ")
            _walk(v, out)
        out.add("]")
    else:
        raise TypeError("not JSON serializable")  # its class's name is the caller's to say
