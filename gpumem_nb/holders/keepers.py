"""Who keeps these objects: the one reverse search for any object, not only tensors.

The retention search (``retention.py``) walks up from objects to the roots a user can act on.
For tensors it is keyed by storage (``facts.py``, ``verify.py``); for anything else (a stored
exception, its tracebacks and finished frames, which cleanup is about to drop) each object is
its own key. Read-only: it only asks the garbage collector.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .retention import STATE_NOT_SEARCHED, Root, RootContext, Search

__all__ = ["Keepers", "keepers"]


@dataclass(frozen=True)
class Keepers:
    roots: tuple[Root, ...]  # every root that reaches one of the objects, sorted
    cut: str = ""  # the bound that stopped the search before some object's roots, if one did


def keepers(objects: Sequence[Any], context: RootContext, *, ignore: Iterable[int] = (),
            budget_s: float) -> Keepers:
    """The roots that keep any of ``objects`` alive. ``ignore``: ids of referrers that are
    no keeper (the records the caller is about to drop)."""
    search = Search(_each_its_own, context, budget_s=budget_s)
    outcome = search.run(objects, ignore=ignore)
    roots: set[Root] = set()
    cut = ""
    for r in outcome.retained:
        if r.state == STATE_NOT_SEARCHED and not cut:
            cut = r.why
        roots.update(r.roots)
    outcome.retained.clear()
    return Keepers(tuple(sorted(roots)), cut)


def _each_its_own(obj: Any) -> tuple[str, int, tuple[str, int]]:
    return ("", 0, ("object", id(obj)))
