"""What the retention search says about one storage: its state, its roots and shortest path,
and the outcome of one search."""

from __future__ import annotations

from dataclasses import dataclass

from .roots import Root

__all__ = [
    "STATE_FREED",
    "STATE_GARBAGE",
    "STATE_NOT_SEARCHED",
    "STATE_ROOTED",
    "STATE_UNSEEN",
    "Outcome",
    "Retained",
]

# Outcomes for a tensor no root reaches.
STATE_ROOTED = "rooted"
STATE_GARBAGE = "garbage"  # only reference cycles keep it: the next gc.collect() frees it
STATE_UNSEEN = "unseen"  # a reference from where Python cannot see (C code, a running frame)
STATE_NOT_SEARCHED = "not searched"
# With ``explained`` referrers (a proposed cut): nothing keeps it once they go, not even a cycle.
STATE_FREED = "freed"


@dataclass
class Retained:
    """What the search found for one storage (the tensors that share it)."""

    key: tuple[str, int]
    device: str
    nbytes: int
    state: str = STATE_NOT_SEARCHED
    roots: frozenset[Root] = frozenset()
    path: str = ""  # the shortest path from a root, in the words a user types
    root_kind: str = ""  # the kind of the root that path starts at
    classes: tuple[str, ...] = ()  # for garbage: the classes in its cycles
    why: str = ""  # for "not searched": the bound that cut it
    # The container every path from a root runs through, whose class has a public ``clear``:
    # the expression that empties it (``reg.clear()``); "" where there is none.
    clear_code: str = ""
    # Objects between its roots and it refer to each other: once the roots' references go,
    # those cycles keep it until Python's collector runs (a mock and its children, a class
    # made in a function): removing the references frees nothing before ``gc.collect()``.
    cyclic: bool = False


@dataclass
class Outcome:
    retained: list[Retained]
    elapsed_s: float = 0.0
    levels: int = 0
    objects: int = 0  # objects the search entered
    cut: str = ""  # the bound that cut it, if one did
