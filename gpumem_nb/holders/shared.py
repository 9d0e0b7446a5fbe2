"""Second references between holders: an object one holder entered first and another reached
too (``dl.dataset`` is ``ds``) makes the second one more reference that must go for the first's
bytes to be freed, when that object leads to them. A shared configuration object holds none,
so each pair is checked once the scan is done, by a fresh bounded walk of the object."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .facts import TensorInfo
from .tally import Tally

__all__ = ["check_shared"]


def check_shared(shared: Mapping[tuple[str, str], object], tally: Tally,
                 tensors_of: Callable[[object], list[tuple[object, tuple[str, ...]]]],
                 info: Callable[[object], TensorInfo | None]) -> None:
    """Each shared object that leads to its first holder's storages makes the second holder
    one more reference that must go (bounded: a fresh walk of each, within the scan's
    bounds). ``shared``: (first holder, second holder) -> the object both reach."""
    for (owner, walker), obj in shared.items():
        if walker in tally.also.get(owner, {}):
            continue
        for t, _ in tensors_of(obj):
            found = info(t)
            if (found is not None and tally.seen_by.get(found[2]) == owner) or \
                    (found is None and tally.node_owner.get(id(t)) == owner):
                # (an autograd node the first holder keeps on its own: no tensor of it
                # is anyone's, its graph's saved tensors are that holder's)
                tally.also.setdefault(owner, {})[walker] = None
                break
