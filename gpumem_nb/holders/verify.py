"""Does the advice free it? Each advised cut, checked against the retention graph.

The walk from the names says ``del cache`` for a list a variable names. Whether that frees
the list's tensors depends on everything else that reaches them, which the walk does not
enumerate: the same list in a helper module's globals, a running thread's frame, a class
attribute, objects that refer to each other and will sit in cycles once the name goes. On
the H100's held-out kinds, four such lines freed 0 of what they said (a module global, a
thread's closure, a parent-child tree, a method's cache).

So the cut is checked by construction, not by rule: the retention search (``retention.py``)
runs from the holders' tensors with the namespace as the cut leaves it (the names it deletes
gone), and whatever still reaches them is what the cut missed: a root with its own line of
code joins the cut, a root without one (a live thread) makes it no single line, and tensors
that then only cycles keep need a collection after it. One search for all checked holders,
bounded by its budget; where it is cut, the advice is said unchecked, never as checked.
A holder whose cut reference counts alone prove free (``sole.py``) skips the search.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..model import Holder
from .named import GC_COLLECT, cut_code
from .retention import (
    STATE_GARBAGE,
    STATE_NOT_SEARCHED,
    STATE_ROOTED,
    STATE_UNSEEN,
    Root,
    RootContext,
    Search,
)
from .sole import SoleProof

__all__ = ["BUDGET_S", "CutCheck", "check_cuts", "checked"]

# A `del` of bare names only: another `del` (``del gc_registry['k']``, after its import)
# stays its own statement.
_NAMES = re.compile(r"[A-Za-z_]\w*(?:, [A-Za-z_]\w*)*")
BUDGET_S = 0.3  # for every checked holder together, at an OOM (after the cell)


@dataclass(frozen=True)
class CutCheck:
    """What else keeps a holder's tensors once its cut is made."""

    others: tuple[Root, ...] = ()  # roots the cut missed
    collect: bool = False  # only reference cycles keep them then: a collection frees them
    unseen: bool = False  # something Python cannot see into keeps them
    why: str = ""  # not checked (the search's bound), or "" where it was
    # The object something unseen holds and the path down from it to the bytes it keeps
    # (``(the function ActivationTap._pack).__self__.saved[0]``); "" where none is known.
    unseen_path: str = ""
    # The bytes of its storages that stay reachable once the cut (with the roots it joins) is
    # made: from a root with no line, or from where Python cannot see. 0: the cut frees all.
    kept_bytes: int = 0
    freed_bytes: int | None = None  # what the cut frees; None: all of its storages


def check_cuts(tensors: Mapping[str, Sequence[Any]], cuts: Mapping[str, Iterable[str]],
               context: RootContext,
               storage_of: Callable[[Any], tuple[str, int, tuple[str, int]] | None], *,
               budget_s: float | None = None,
               modules: Any = None) -> dict[str, CutCheck]:
    """For each holder (by name): its tensors, and the namespace names its cut deletes.
    One search: the namespace stands without every cut name, so a tensor two checked
    holders share is judged once the names of both are gone (the walk's ``also_held_by``
    already joins such names into each cut). ``modules``: where torch is looked up for the
    proof that skips the search (``sys.modules`` unless given: a mapping of name to module)."""
    ns = context.user_ns
    if not isinstance(ns, dict) or not tensors:
        return {}
    # Read at each check, not bound at import (as the retention search's own budget).
    budget_s = BUDGET_S if budget_s is None else budget_s
    out: dict[str, CutCheck] = {}
    proof = SoleProof.of(sys.modules if modules is None else modules)
    if proof is not None:
        lists = list(tensors.values())
        for name, ts in tensors.items():
            if proof.frees(ns, cuts.get(name, ()), ts, ours=lists):
                out[name] = CutCheck()  # nothing else keeps them: what the search would say
        lists.clear()
        if len(out) == len(tensors):
            return out
    gone = {n for names in cuts.values() for n in names}
    # Keys compared and hashed only as exact strs: a str subclass's __hash__ or __eq__ is
    # the user's code (reliability A4). Other keys stand in under a key of our own.
    left: dict[Any, Any] = {}
    for i, (k, v) in enumerate(list(dict.items(ns))):
        if type(k) is str:
            if k not in gone:
                left[k] = v
        else:
            left[("key", i)] = v
    # The loop's names stay bound in this running frame, which no referrer search sees: the
    # namespace's last variable (often the one the cut deletes) looked held by something
    # unseen, and its cycles were never told to need a collection.
    k = v = None
    ctx = replace(context, user_ns=left)
    keys_of: dict[str, set[tuple[str, int]]] = {}
    targets: list[Any] = []
    for name, ts in tensors.items():
        if name in out:
            continue
        for t in ts:
            info = storage_of(t)
            if info is not None:
                keys_of.setdefault(name, set()).add(info[2])
                targets.append(t)
    try:
        # The caller's own lists of the tensors are no holder either.
        mine = {id(ns), id(tensors), *(id(ts) for ts in tensors.values())}
        outcome = Search(storage_of, ctx, budget_s=budget_s).run(
            targets, ignore=mine, explained=[ns])
    finally:
        targets.clear()
        left.clear()
    by_key = {r.key: r for r in outcome.retained}
    for name, keys in keys_of.items():
        found = [by_key[k] for k in keys if k in by_key]
        cut = next((r.why for r in found if r.state == STATE_NOT_SEARCHED), "")
        if cut or not found:
            out[name] = CutCheck(why=cut or "the search did not reach its tensors")
            continue
        others = {root for r in found if r.state == STATE_ROOTED for root in r.roots}
        # The dry run, storage by storage: what stays reachable once the cut and every root
        # it can join are gone (a root with no line of code, or something Python cannot
        # see) is kept; the rest is what the advice may say it frees.
        kept = [r for r in found if r.state == STATE_UNSEEN or (
            r.state == STATE_ROOTED and any(_stuck(root) for root in r.roots))]
        unseen = sorted(r.path for r in found if r.state == STATE_UNSEEN and r.path)
        out[name] = CutCheck(
            others=tuple(sorted(others)),
            # Cycles below roots whose lines join the cut stay until a collection too: a
            # replaced `threading.excepthook` is also kept by each thread made while it was
            # set, and each kept error's traceback keeps that thread (KINDS10 on the H100: the
            # line without a collection freed 0 of 28.50 GiB).
            collect=any(r.state == STATE_GARBAGE or (r.state == STATE_ROOTED and r.cyclic)
                        for r in found),
            unseen=any(r.state == STATE_UNSEEN for r in found),
            unseen_path=unseen[0] if unseen else "",
            kept_bytes=sum(r.nbytes for r in kept),
            freed_bytes=sum(r.nbytes for r in found if all(r is not k for k in kept)))
    return out


def _stuck(root: Root) -> bool:
    """A root no line of Python that joins the ``del`` removes (a live thread's local, a
    magic's record)."""
    return not root.code or root.code.startswith("%")


def checked(h: Holder, check: CutCheck, line: str) -> Holder:
    """The holder with its advice's line made to free what it says (``code``, and
    ``cut_checked`` True, ``cut_freed_bytes`` what it frees where that is less than all),
    or with no line where none frees anything (``code`` "", ``cut_checked`` False);
    ``cut_note`` says what else keeps the bytes. Unchanged but for the note where not
    checked."""
    if check.why:
        return replace(h, cut_note=f"not checked: {check.why}")
    # A root with no line, or whose line is a magic (it cannot join a line of Python).
    stuck = [r for r in check.others if _stuck(r)]
    kept: list[str] = []
    if stuck:
        said = ", ".join(f"{r.name} (`{r.code}`)" if r.code else r.name for r in stuck)
        kept.append(f"{said} also keeps them, which no one line with the `del` removes: "
                    "stop a thread (let its function return), or drop that reference too")
    if check.unseen:
        what = check.unseen_path or "what is left"
        kept.append(f"{what} is also held from where Python cannot see (C code: a hook or "
                    "registry inside a library such as torch's saved-tensor hooks, or a "
                    "running frame), which no `del` reaches: undo what registered it")
    also = (*h.also_held_by, *(r.name for r in stuck if r.name not in h.also_held_by))
    freed = check.freed_bytes
    if kept and not freed:
        return replace(h, code="", cut_checked=False, also_held_by=also, cut_freed_bytes=0,
                       cut_note="; ".join(kept))
    # A registry entry's line may name the entry by a variable the holder's `del` removes: it
    # runs first.
    entries = cut_code([r for r in check.others if not _stuck(r) and r.depth])
    parts = [*(entries.split("; ") if entries else ()), *([line] if line else [])]
    extra = cut_code([r for r in check.others if not _stuck(r) and not r.depth])
    for part in extra.split("; ") if extra else ():
        at = next((i for i, p in enumerate(parts)
                   if p.startswith("del ") and _NAMES.fullmatch(p[4:])), None)
        if part.startswith("del ") and _NAMES.fullmatch(part[4:]) and at is not None:
            parts[at] = f"{parts[at]}, {part[4:]}"  # one `del` for every name
        else:
            parts.append(part)
    if check.collect and GC_COLLECT not in parts:
        parts.append(GC_COLLECT)
    names = tuple(r.name for r in check.others
                  if r.name not in h.also_held_by and not _stuck(r))
    notes = []
    if names:
        notes.append(f"{', '.join(names)} also keep{'s' if len(names) == 1 else ''} them")
    if check.collect:
        notes.append("once the names go, only reference cycles keep them, until a collection")
    notes.extend(kept)
    return replace(h, code="; ".join(parts), cut_checked=True,
                   also_held_by=(*also, *names), cut_note="; ".join(notes),
                   cut_freed_bytes=freed if kept else None)
