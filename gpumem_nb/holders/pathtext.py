"""A retention path in the words a user types: each edge's label (``_Step``), rendered once the
whole path is known (``featcache.store['a']``, ``model.layers[3].cache``), a dict key in a few
characters, and what an object is when something unseen holds it."""

from __future__ import annotations

import functools
import re
import types
from collections.abc import Sequence
from typing import Any

from .reading import type_name

__all__ = []

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What an advice line may name: names, attributes, and int or plain str subscripts.
_EXPRESSION = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[-?\d+\]|\['[\w .-]*'\])*")
_MODULES_ITEM = re.compile(r"\._modules\['([^']*)'\]")
_PARAMS_ITEM = re.compile(r"\._(?:parameters|buffers)\['([A-Za-z_][A-Za-z0-9_]*)'\]")


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


def _render(name: str, steps: Sequence[_Step]) -> str:
    """A root's ``name`` and the steps below it: an object's ``__dict__`` makes its keys
    attributes; torch's module dicts are said as attributes and indexes."""
    out = [name]
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


def _describe(obj: Any) -> str:
    """What an object is, in a few words, read through C attributes only: ``a
    functools.partial of save``, ``the function make.<locals>.hook``, ``a Frame``."""
    t = type(obj)
    try:
        if t is types.FunctionType or t is types.MethodType:
            name = obj.__qualname__ if t is types.FunctionType else obj.__func__.__qualname__
            what = "function" if t is types.FunctionType else "method"
            return f"the {what} {name}" if type(name) is str else f"a {what}"
        if t is functools.partial:
            inner = _describe(obj.func).removeprefix("the function ")
            return f"a functools.partial of {inner.removeprefix('the method ')}"
    except Exception:
        pass
    return f"a {type_name(t)}"


def _unquote(text: str, d: Any, child: Any) -> Any:
    """The dict key whose value is ``child`` (the rendered text is for display only)."""
    for k, v in dict.items(d):
        if v is child:
            return k
    return text
