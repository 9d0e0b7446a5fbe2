"""The retention search's findings as holders: grouped by the references that keep them, named
by the shortest path, with the one line that frees them and what it frees.

The advice for a group is its cut set at the roots: every reference that reaches its bytes
must go (``del ds, dl``, not ``del ds``). What that frees is the bytes whose every root is in
the set: a storage also reached from a root outside it stays.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..model import UNSEEN_NAME, Holder
from .retention import (
    ROOT_CLASS,
    ROOT_CONTEXT,
    ROOT_EXCEPTION,
    ROOT_HOOK,
    ROOT_MODULE,
    ROOT_OUTPUT,
    ROOT_SHELL,
    ROOT_SIGNAL,
    ROOT_THREAD,
    ROOT_VARIABLE,
    STATE_FREED,
    STATE_GARBAGE,
    STATE_NOT_SEARCHED,
    STATE_ROOTED,
    STATE_UNSEEN,
    Retained,
    Root,
)

__all__ = [
    "GC_COLLECT",
    "KIND_CLASS_ATTRIBUTE",
    "KIND_GARBAGE",
    "KIND_HOOK",
    "KIND_MODULE_GLOBAL",
    "KIND_NOT_SEARCHED",
    "KIND_SHELL",
    "KIND_SIGNAL",
    "KIND_THREAD",
    "KIND_UNSEEN",
    "UNNAMED_KINDS",
    "cut_code",
    "holder_groups",
    "holders_from",
    "pandas_name",
]

# Holder kinds for what the search found, beside the scan's ("variable", "output cache",
# "traceback", "module", "optimizer state", "container").
KIND_MODULE_GLOBAL = "module global"
KIND_CLASS_ATTRIBUTE = "class attribute"
KIND_THREAD = "thread"
KIND_SHELL = "the shell"
KIND_SIGNAL = "signal handler"
KIND_HOOK = "interpreter hook"
KIND_GARBAGE = "garbage"
KIND_UNSEEN = "unseen"
KIND_NOT_SEARCHED = "not searched"
# What the search found that no one can act on by a name: never a holder to `del`.
UNNAMED_KINDS = frozenset((KIND_UNSEEN, KIND_NOT_SEARCHED))

_KIND_OF_ROOT = {
    ROOT_VARIABLE: "variable",
    ROOT_OUTPUT: "output cache",
    ROOT_EXCEPTION: "traceback",
    ROOT_MODULE: KIND_MODULE_GLOBAL,
    ROOT_CLASS: KIND_CLASS_ATTRIBUTE,
    ROOT_CONTEXT: "context variable",
    ROOT_THREAD: KIND_THREAD,
    ROOT_SHELL: KIND_SHELL,
    ROOT_SIGNAL: KIND_SIGNAL,
    ROOT_HOOK: KIND_HOOK,
}
GC_COLLECT = "import gc; gc.collect()"


def cut_code(roots: Iterable[Root]) -> str:
    """One line that removes every one of these references, or "" where one of them has no
    such line (a thread's local: only the thread can let go of it)."""
    names: list[str] = []
    deep: list[tuple[int, str]] = []
    for r in sorted(set(roots)):
        if not r.code:
            return ""
        if r.code.startswith("del ") and r.kind == ROOT_VARIABLE:
            names.append(r.code[4:])
        elif all(r.code != code for _, code in deep):
            deep.append((r.depth, r.code))
    # A registry's entry (a line below its root: depth > 0) goes before any `del`, since its
    # line may name the entry by the variable; and the deepest first (``reg[1].items.clear()``
    # before ``reg[0]`` goes and ``reg[1]`` names another item).
    first = [code for depth, code in sorted(deep, key=lambda dc: -dc[0]) if depth]
    rest = [code for depth, code in deep if not depth]
    parts: list[str] = []
    for code in [*first, *([f"del {', '.join(names)}"] if names else []), *rest]:
        for part in code.split("; "):
            if not (part.startswith("import ") and part in parts):
                parts.append(part)  # one `import gc` however many entries of gc need it
    if any(r.cyclic for r in roots) and GC_COLLECT not in "; ".join(parts):
        parts.append(GC_COLLECT)
    return "; ".join(parts)


_LRU_STEP = " lru_cache results"
_DOTTED = re.compile(r"[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*")


def _cache_clear(members: Sequence[Retained]) -> str:
    """``Encoder.anchors.cache_clear()`` where every storage's path runs through one
    lru_cache: deleting the function's owner frees nothing while the cache (a method's, on
    its class) keeps the arguments it keys on, `self` among them."""
    prefixes = {r.path.split(_LRU_STEP, 1)[0] if _LRU_STEP in r.path else None
                for r in members}
    if len(prefixes) != 1:
        return ""
    (prefix,) = prefixes
    if prefix is None or not _DOTTED.fullmatch(prefix):
        return ""
    return f"{prefix}.cache_clear()"


def holder_groups(found: Sequence[Retained],
                  ) -> list[tuple[Holder, list[tuple[str, int]]]]:
    """One holder per (outcome, set of roots, device), with the storages it stands for,
    largest first. The holder's bytes are filled in by whoever attributes the storages (the
    scan, which also sizes their autograd graphs)."""
    groups: dict[tuple[str, frozenset[Root], str, tuple[str, ...], str], list[Retained]] = {}
    for r in found:
        if r.state == STATE_FREED:
            continue  # only a proposed cut's references kept it: nothing holds it after
        groups.setdefault((r.state, r.roots, r.device, r.classes, r.why), []).append(r)
    out: list[tuple[Holder, list[tuple[str, int]]]] = []
    for (state, roots, device, classes, why), members in groups.items():
        nbytes = sum(r.nbytes for r in members)
        n = len(members)
        keys = [r.key for r in members]
        if state == STATE_ROOTED:
            best = min(members, key=lambda r: (r.path.count("[") + r.path.count("."), r.path))
            kind = _KIND_OF_ROOT.get(best.root_kind, best.root_kind)
            name = best.path + (f" and {n - 1} more" if n > 1 else "")
            names = sorted({x.name for x in roots})
            also = tuple(x for x in names if not best.path.startswith(x))
            clears = {r.clear_code for r in members}
            code = _cache_clear(members)
            if not code:
                code = cut_code(roots)
                if code and any(r.cyclic for r in members) and GC_COLLECT not in code \
                        and "%" not in code:
                    # The roots' references go; the cycles below them stay until a
                    # collection. (A cache's `cache_clear()` cuts below its class's cycles;
                    # a magic's line takes the rest of the line as its arguments, and
                    # `%gpumem cleanup` collects anyway.)
                    code = f"{code}; {GC_COLLECT}"
            h = Holder(name=name, kind=kind, device=device, nbytes=nbytes,
                       also_held_by=also, code=code,
                       clear_code=clears.pop() if len(clears) == 1 else "")
        elif state == STATE_GARBAGE:
            what = ", ".join(classes) if classes else "plain containers"
            h = Holder(name=f"reference cycles ({what})", kind=KIND_GARBAGE, device=device,
                       nbytes=nbytes, code=GC_COLLECT, classes=classes)
        elif state == STATE_UNSEEN:
            paths = sorted(r.path for r in members if r.path)
            name = UNSEEN_NAME
            if paths:
                more = f" and {n - 1} more" if n > 1 else ""
                name = f"{paths[0]}{more}, {name}"
            h = Holder(name=name, kind=KIND_UNSEEN, device=device, nbytes=nbytes)
        else:
            h = Holder(name="not searched", kind=KIND_NOT_SEARCHED, device=device,
                       nbytes=nbytes, why=why or STATE_NOT_SEARCHED, walk_capped=True)
        out.append((h, keys))
    return sorted(out, key=lambda hk: (-hk[0].nbytes, hk[0].name))


_PANDAS_CELL = re.compile(
    r"^(?P<root>[A-Za-z_][\w.]*)\._mgr(?: \(in a \w+\))?(?:\.blocks)?\[(?P<block>\d+)\]"
    r" \(in a \w*Block\)\[(?P<at>\d+(?:, \d+)?)\](?P<rest>.*)$")


def pandas_name(path: str, ns: Mapping[Any, Any] | None) -> str:
    """``df['emb'][1]`` for ``df._mgr[1] (in a NumpyBlock)[0, 1]``: a data frame's (or a
    series') object column said as its user indexes it, from the frame's own block
    placement and labels (pandas' own attributes, read guarded); the path as it was where
    anything does not fit."""
    m = _PANDAS_CELL.match(path)
    if m is None or ns is None:
        return path
    try:
        obj: Any = ns.get(m["root"]) if type(ns) is dict else None
        module = type(obj).__module__
        if not isinstance(module, str) or not module.startswith("pandas"):
            return path
        block = obj._mgr.blocks[int(m["block"])]
        at = [int(x) for x in m["at"].split(", ")]
        if type(obj).__name__ == "DataFrame" and len(at) == 2:
            column = obj.columns[int(block.mgr_locs.as_array[at[0]])]
            label = obj.index[at[1]]
            return f"{m['root']}[{column!r}][{label!r}]{m['rest']}"
        if type(obj).__name__ == "Series" and len(at) == 1:
            return f"{m['root']}[{obj.index[at[0]]!r}]{m['rest']}"
    except Exception:
        return path
    return path


def holders_from(found: Sequence[Retained]) -> list[Holder]:
    """The groups' holders alone (tests, and callers that need no graph sizes)."""
    return [h for h, _ in holder_groups(found)]
