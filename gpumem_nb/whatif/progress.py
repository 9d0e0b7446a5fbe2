"""A what-if's progress line in the notebook, for the long ones (a history at the
entry bound takes seconds per setting, ``--fit`` tens of seconds).

Nothing is shown for the first ``SHOW_AFTER_S`` (most what-ifs end before). Then one line,
replaced in place (a display id) at most every ``EVERY_S``: what is being replayed, how far,
and that Ctrl-C stops it. When the work ends the line is emptied; on a Ctrl-C it says where
it stopped. The replay loop asks for a look every ``TICK`` events only, so watching costs
nothing measurable, and Ctrl-C still stops the replay at once (the loop is Python's: the
interrupt lands between two events).

``display`` is IPython's (the magic passes it; this module imports no IPython): called as
``display(obj, display_id=True)`` it returns a handle whose ``update(obj)`` replaces it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["EVERY_S", "SHOW_AFTER_S", "TICK", "Progress"]

SHOW_AFTER_S = 2.0
EVERY_S = 0.5
TICK = 1 << 16  # events between two looks at the clock


class _Line:
    """Shown as its text (text/plain); empty once the work is done."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text)


class Progress:
    def __init__(self, display: Callable[..., Any] | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 after_s: float = SHOW_AFTER_S, every_s: float = EVERY_S) -> None:
        self._display = display
        self._clock = clock
        self._after_s, self._every_s = after_s, every_s
        self._t0 = clock()
        self._last = -1e9
        self._handle: Any = None
        self.stage = "reading the history"
        self.shown: list[str] = []  # every text shown, for the tests

    def begin(self, stage: str) -> None:
        """A new stage ("replaying under X (2 of 4 settings)"): shown at the next look."""
        self.stage = stage
        self.look()

    def events(self, done: int, total: int) -> None:
        """The replay's look, every ``TICK`` events."""
        pct = 100 * done // total if total else 100
        self.look(f"{pct}% of {total:,} events")

    def look(self, where: str = "") -> None:
        now = self._clock()
        if now - self._t0 < self._after_s or now - self._last < self._every_s:
            return
        self._last = now
        self._show(f"gpumem whatif: {self.stage}" + (f", {where}" if where else "") +
                   f" ({now - self._t0:.0f} s so far; Ctrl-C stops it)")

    def done(self) -> None:
        if self._handle is not None:
            self._show("")

    def interrupted(self) -> None:
        if self._handle is not None:
            self._show(f"gpumem whatif: stopped by Ctrl-C while {self.stage}, after "
                       f"{self._clock() - self._t0:.0f} s.")

    def _show(self, text: str) -> None:
        self.shown.append(text)
        if self._display is None:
            return
        if self._handle is None:
            self._handle = self._display(_Line(text), display_id=True)
        else:
            self._handle.update(_Line(text))
