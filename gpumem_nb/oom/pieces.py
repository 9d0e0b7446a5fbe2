"""What one explanation is assembled from, before classifying (``Pieces``), and the facts
read into it: the failing cell's working set, what the session's holders leave unaccounted
at the failure, the failed call's own traceback set apart, and what collections freed since."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..holders import exception_chain, last_value
from ..model import CellStart, Holder, Sample
from .causes import KIND_FAILED_CALL, held_holders
from .facts import OomFacts
from .gcwindow import Collections

__all__ = [
    "Pieces",
    "any_capped",
    "cell_facts",
    "failed_call_apart",
    "unaccounted_at_start",
    "with_collections",
]


@dataclass
class Pieces:
    """Everything read for one explanation, gathered before classifying."""

    facts: OomFacts
    holders: tuple[Holder, ...]  # as scanned (the dry run reuses them)
    source: str
    # As judged: the failing call's own traceback set apart (kind KIND_FAILED_CALL).
    judged: tuple[Holder, ...] = ()
    observer_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    sample: Sample | None = None  # a full reading made after the failure, for the dry run
    stage_s: dict[str, float] = field(default_factory=dict)


def with_collections(f: OomFacts, w: Collections) -> OomFacts:
    """The facts, with what collections freed since the failure: it was garbage then, not
    part of what the holders or the session's remainder hold."""
    if not w.freed_bytes:
        return replace(f, collected_bytes=0, collections=w.collections)
    unreachable = f.unreachable_bytes
    if unreachable is not None:
        unreachable = max(unreachable - w.freed_bytes, 0)
    return replace(f, collected_bytes=w.freed_bytes, collections=w.freeing,
                   unreachable_bytes=unreachable)


def cell_facts(cell: CellStart | None, allocated: int | None) -> dict[str, Any]:
    """The failing cell's working-set facts, from its start and PyTorch's allocated bytes at
    the failure."""
    if cell is None:
        return {}
    own = None
    if cell.allocated_bytes is not None and allocated is not None:
        own = max(allocated - cell.allocated_bytes, 0)
    return {"cell_bytes": own, "cell_start_bytes": cell.allocated_bytes,
            "cell_previous_peak_bytes": cell.previous_peak_bytes,
            "cell_previous_peak_exact": cell.previous_peak_exact}


def unaccounted_at_start(cell: CellStart | None, holders: Sequence[Holder],
                          device: int) -> int | None:
    """At the failure: what PyTorch had allocated when the failing cell started that none of
    the session's holders keeps (they are scanned at the failure, so they also hold what the
    cell stored: that can only make this smaller). Unknown when a holder's graph was not
    sized in full, which would make it larger than it is."""
    if cell is None or cell.allocated_bytes is None:
        return None
    held = held_holders(holders, device)
    if any_capped(held):
        return None
    return max(cell.allocated_bytes - sum(h.held_bytes for h in held), 0)


def any_capped(holders: Sequence[Holder]) -> bool:
    return any(h.walk_capped or h.graph_bytes_capped or h.graph_unsized
               or (h.holds_graph and h.graph_bytes is None) for h in holders)


def failed_call_apart(holders: Sequence[Holder], error: BaseException) -> tuple[Holder, ...]:
    """The holders, with the failing call's own traceback marked as such: when the stored
    exception is this error, its frames' locals are the computation's working set (under
    cudaMallocAsync the explanation comes after the exception unwound), not memory the
    session keeps."""
    stored = last_value()
    if not isinstance(stored, BaseException) or not any(
            e is error for e in exception_chain(stored)):
        return tuple(holders)
    return tuple(replace(h, kind=KIND_FAILED_CALL) if h.kind == "traceback" else h
                 for h in holders)
