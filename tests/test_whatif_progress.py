"""A long what-if's progress line in the notebook (issue 37), and Ctrl-C, which stops a replay
at once, as it did."""

from __future__ import annotations

import _thread
import signal
import threading
import time
from typing import Any

import pytest

from gpumem_nb.whatif import api
from gpumem_nb.whatif.progress import TICK, Progress

from .whatif_history import History

MiB = 1 << 20


class FakeDisplay:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, obj: Any, display_id: bool = False) -> FakeDisplay:
        assert display_id
        self.lines.append(repr(obj))
        return self

    def update(self, obj: Any) -> None:
        self.lines.append(repr(obj))


class Clock:
    def __init__(self, step: float) -> None:
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def long_history(events: int) -> History:
    h = History()
    keep = [h.alloc(3 * MiB)]
    while len(h.entries) < events:
        x = h.alloc(5 * MiB + 512 * (len(h.entries) % 7))
        h.free(x)
    assert keep
    return h


def test_nothing_is_shown_in_the_first_two_seconds_then_one_line_replaced_in_place():
    shown = FakeDisplay()
    clock = Clock(0.3)
    p = Progress(shown, clock=clock)
    for i in range(0, 10 * TICK, TICK):
        p.events(i, 10 * TICK)
    assert clock.t > 2.0 and shown.lines  # shown once past 2 s
    assert all("Ctrl-C stops it" in line and "of 655,360 events" in line
               for line in shown.lines)
    n = len(shown.lines)
    assert n <= 3  # at most every 0.5 s: 3 s of looks every 0.3 s
    p.done()
    assert shown.lines[-1] == ""  # emptied at the end


def test_a_short_what_if_shows_nothing():
    shown = FakeDisplay()
    h = long_history(3000)
    api.run(api.trace_input(h.snapshot()), [api.parse_settings("")],
            progress=Progress(shown))
    assert shown.lines == []


def test_a_long_what_if_says_what_it_replays_and_how_far():
    shown = FakeDisplay()
    h = long_history(3 * TICK)
    p = Progress(shown, clock=Clock(0.6))
    api.run(api.trace_input(h.snapshot()), [api.parse_settings(""),
                                            api.parse_settings("expandable_segments:True")],
            fit=True, progress=p)
    text = "\n".join(shown.lines)
    assert "gpumem whatif: replaying under defaults (1 of 2 settings), " in text
    assert "replaying under expandable_segments:True (2 of 2 settings)" in text
    assert "finding the least memory under" in text
    assert "% of 131,073 events" in text
    assert shown.lines[-1] == ""


def test_ctrl_c_stops_a_long_replay_at_once_and_the_line_says_so():
    shown = FakeDisplay()
    h = long_history(1_500_000)
    ti = api.trace_input(h.snapshot())
    p = Progress(shown, after_s=0.0, every_s=0.0)
    fired: list[float] = []

    def interrupt() -> None:
        fired.append(time.perf_counter())
        _thread.interrupt_main()

    class Interrupting(FakeDisplay):
        """Ctrl-C from another thread once the replay has shown it is under way: a timer
        could fire after a fast replay had already ended."""

        def update(self, obj: Any) -> None:
            super().update(obj)
            if len(self.lines) == 3 and not timer.is_alive():
                timer.start()

    shown = Interrupting()
    p = Progress(shown, after_s=0.0, every_s=0.0)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a kernel
    timer = threading.Timer(0.0, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            api.run(ti, [api.parse_settings("")], fit=True, progress=p)
        stopped = time.perf_counter()
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, old)
    assert fired and stopped - fired[0] < 0.5  # at once (0.5 s: a loaded 2-core machine)
    assert shown.lines[-1].startswith("gpumem whatif: stopped by Ctrl-C while ")
