"""The allocation histories a kernel keeps: the session recording (``%gpumem record``) and
the latest traced cell (``%%gpumem --trace``), and the OOM explainer's what-if line they give.

The explainer asks ``oom_lines`` for its extra lines (registered once, at load): while a
session is recorded, the whole session replayed with expandable segments; while a traced
cell's result is explained, that cell's own history.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..celltext import CellTexts

if TYPE_CHECKING:  # both load when first used: a kernel that never traces imports neither
    from ..oom.facts import OomFacts
    from ..session import SessionRecorder
    from ..trace.recorder import TraceResult

__all__ = ["TraceState"]


class TraceState:
    """The session recording and the latest traced cell of one loaded extension."""

    def __init__(self, session: SessionRecorder | None = None) -> None:
        # Made on first use by %gpumem record; unloading the extension ends it.
        self.session: SessionRecorder | None = session
        # The latest %%gpumem --trace result with a snapshot, for %gpumem whatif.
        self.last_trace: TraceResult | None = None
        self._explaining: dict[str, Any] | None = None  # the traced cell being explained
        self.cell_number: Callable[[], int | None] = lambda: None  # the cell running now
        # The recent cells' texts as compiled (an input transformer fills it while loaded):
        # a traced cell's sites in any cell are labelled from them.
        self.cell_texts = CellTexts()

    def recorder(self) -> SessionRecorder:
        """The session recorder, made on first use."""
        if self.session is None:
            from ..session import SessionRecorder

            self.session = SessionRecorder(cell_number=self.cell_number)
        return self.session

    def cell_started(self) -> None:
        """At each cell's start: an armed recording queues its start once torch is imported
        (a dict lookup otherwise)."""
        if self.session is not None and self.session.armed:
            self.session.poll()

    def close(self) -> None:
        """Unloaded: an armed recording stops waiting (nothing left on ``sys.meta_path``)."""
        if self.session is not None and self.session.armed:
            self.session.disarm()

    @property
    def session_active(self) -> bool:
        return self.session is not None and self.session.active

    @contextmanager
    def explaining(self, traced: TraceResult | None) -> Iterator[None]:
        """While a traced cell's result is explained, its history gives the what-if line
        (the session's first, when one is recorded)."""
        self._explaining = traced.snapshot if traced is not None else None
        try:
            yield
        finally:
            self._explaining = None

    def oom_lines(self, facts: OomFacts) -> list[str]:
        """The OOM explainer's what-if line: the failure replayed with expandable segments, at
        the memory PyTorch could use when the request failed."""
        rec = self.session
        cap = None
        if facts.free_bytes is not None and facts.reserved_bytes is not None:
            cap = facts.free_bytes + facts.reserved_bytes
        snapshot: dict[str, Any] | None = None
        if rec is not None and rec.on:
            if facts.backend != "native" or facts.expandable_segments or facts.larger_than_gpu:
                return []
            if cap is None and facts.allowed_bytes is None:
                return []
            # Counted before any snapshot: torch's snapshot alone costs about 0.7 s per
            # 100,000 entries, past the explainer's 100 ms long before the replay would.
            from ..whatif.api import SESSION_OOM_LINE_MAX_ENTRIES, left_out_oom_line

            n = rec.entries_estimate(facts.device)
            if n is not None and n > SESSION_OOM_LINE_MAX_ENTRIES:
                room = min(x for x in (cap, facts.allowed_bytes) if x is not None)
                return [left_out_oom_line(n, SESSION_OOM_LINE_MAX_ENTRIES, room,
                                          session=True)]
            got = rec.snapshot()
            if got is None:
                return []
            snapshot = got.snapshot
        else:
            snapshot = self._explaining
            if snapshot is None:
                return []
            if facts.backend != "native" or facts.expandable_segments or facts.larger_than_gpu:
                return []
        from ..whatif.api import expandable_oom_line

        return [expandable_oom_line(snapshot, device=facts.device, capacity_bytes=cap,
                                    allowed_bytes=facts.allowed_bytes)]
