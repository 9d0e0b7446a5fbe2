"""Background sampling into a bounded ring buffer.

The thread's whole job is ``tick()``: read the source once, store the sample, tell listeners.
Tests call ``tick()`` directly with an injected clock and never sleep. The loop waits on an
event rather than sleeping, so ``stop()`` returns at once and ``request_tick()`` (used after
each cell) is served without waiting for the next interval. Intervals are drift-corrected:
the schedule advances by whole intervals from the start, not from when a tick finished.

Depends only on ``model``, the ``Source`` protocol and the read gate (``sources.gate``),
never on a concrete source.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from . import userexc
from .model import Sample
from .sources import Source
from .sources.gate import STUCK_S, ReadGate

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_INTERVAL_S",
    "MAX_INTERVAL_S",
    "MIN_INTERVAL_S",
    "NAP_S",
    "Listener",
    "Sampler",
    "check_interval",
]

log = logging.getLogger("gpumem_nb")

MIN_INTERVAL_S = 0.05
MAX_INTERVAL_S = 60.0
DEFAULT_INTERVAL_S = 0.5
# The thread naps at most this long, so a delayed request (after a cell) is served within a
# nap without anyone waking it.
NAP_S = 0.1
# Two hours at the default rate, about 7 MB of small frozen records.
DEFAULT_CAPACITY = 14_400

Listener = Callable[[Sample], None]


def check_interval(interval_s: float) -> float:
    if not (MIN_INTERVAL_S <= interval_s <= MAX_INTERVAL_S):
        raise ValueError(
            f"the interval must be between {MIN_INTERVAL_S} and {MAX_INTERVAL_S:g} seconds, "
            f"not {interval_s:g}"
        )
    return float(interval_s)


class Sampler:
    def __init__(
        self,
        source: Source,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        capacity: int = DEFAULT_CAPACITY,
        clock: Callable[[], float] = time.monotonic,
        gate: ReadGate | None = None,
    ) -> None:
        self.source = source
        # The process's gate for live readings (``sources.gate``): while a reading hangs,
        # ticks skip the source instead of adding a second stuck thread.
        self.gate = gate
        self._reading_since: float | None = None  # a tick inside source.read, since when
        self._interval_s = check_interval(interval_s)
        self._clock = clock
        self._buffer: deque[Sample] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._due_t: float | None = None  # a requested tick's time, if sooner than the next
        self._replan = False
        self.errors: dict[str, int] = {}
        self.last_error = ""
        self.ticks = 0
        self.cpu_s = 0.0  # CPU time the thread spent in ticks, for benchmarks and status

    # -- configuration -----------------------------------------------------------------------
    @property
    def interval_s(self) -> float:
        return self._interval_s

    @interval_s.setter
    def interval_s(self, value: float) -> None:
        self._interval_s = check_interval(value)
        self._replan = True
        self._wake.set()  # re-plan with the new interval at once

    def add_listener(self, fn: Listener) -> None:
        with self._lock:
            if fn not in self._listeners:
                self._listeners.append(fn)

    def remove_listener(self, fn: Listener) -> None:
        with self._lock:
            if fn in self._listeners:
                self._listeners.remove(fn)

    # -- data --------------------------------------------------------------------------------
    def record(self, sample: Sample) -> None:
        """Store a sample taken elsewhere (the cell hooks), so the timeline has it too."""
        with self._lock:
            self._buffer.append(sample)

    def samples(self, since_t_s: float | None = None) -> list[Sample]:
        with self._lock:
            data = list(self._buffer)
        if since_t_s is None:
            return data
        return [s for s in data if s.t_s >= since_t_s]

    def latest(self) -> Sample | None:
        with self._lock:
            return self._buffer[-1] if self._buffer else None

    def _contain(self, where: str, e: BaseException) -> None:
        # One report per kind of failure: texts that change per call must not spam cells.
        # A listener's error may be any object's: read through userexc, never str() bare.
        key = f"{where}: {userexc.type_name(e)}"
        text = userexc.text(e)
        self.last_error = f"{key}: {text}"
        first = key not in self.errors
        self.errors[key] = self.errors.get(key, 0) + 1
        if first:
            log.warning("gpumem_nb %s failed (reported once): %s", where, text)

    def tick(self) -> Sample | None:
        """Read once, store, notify. Never raises: errors are counted and logged once."""
        gate = self.gate
        if gate is not None and not gate.enter(wait_s=NAP_S):
            hung = gate.hung_s()
            if hung is not None:
                self._contain("source", TimeoutError(
                    f"a reading has not returned for {hung:.1f} s (NVML hangs); no new "
                    "reading starts until it does, and NVML's figures show as unknown"))
            return None
        self._reading_since = self._clock()
        try:
            sample = self.source.read()
        except Exception as e:
            self._contain("source", e)
            return None
        finally:
            self._reading_since = None
            if gate is not None:
                gate.leave()
        self.ticks += 1
        self.record(sample)
        with self._lock:
            listeners = list(self._listeners)
        for fn in listeners:
            try:
                fn(sample)
            except Exception as e:
                self._contain("listener", e)
        return sample

    # -- thread ------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            # Stopped while a tick hung (a stuck NVML call) and started again before it
            # returned: the same thread carries on; a second one would double every read.
            self._stop.clear()
            return
        self._stop.clear()
        self._wake.clear()
        # Run under a copy of the caller's context: ipykernel routes widget messages sent
        # from threads through context variables (7.0.0/7.0.1 raised LookupError without).
        ctx = contextvars.copy_context()
        self._thread = threading.Thread(
            target=ctx.run, args=(self._run,), name="gpumem_nb-sampler", daemon=True
        )
        self._thread.start()

    def request_tick(self, delay_s: float = 0.0) -> None:
        """Ask the thread for a tick soon (after a cell), without drawing on this thread."""
        due = self._clock() + max(delay_s, 0.0)
        self._due_t = due if self._due_t is None else min(self._due_t, due)
        if delay_s <= 0:
            self._wake.set()
        # A delayed request wakes nothing: the thread finds it at its next nap (NAP_S). A
        # wake here would have the thread take the interpreter lock just as the kernel
        # sends the cell's reply.

    def stop(self, timeout_s: float = 1.0) -> bool:
        """Stop and join; True when the thread is gone."""
        thread = self._thread
        self._stop.set()
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            # A tick inside a reading taken for hung will not return to be joined: waiting
            # for it only made every %reload_ext take a second longer.
            since = self._reading_since
            stuck_s = self.gate.stuck_s if self.gate is not None else STUCK_S
            hung = since is not None and self._clock() - since >= stuck_s
            thread.join(0 if hung else timeout_s)
        gone = thread is None or not thread.is_alive()
        if gone:
            self._thread = None
        # A thread stuck in a read keeps its reference: it exits once the read returns, and
        # start() reuses it rather than adding another.
        return gone

    def _run(self) -> None:
        next_t = self._clock() + self._interval_s
        while not self._stop.is_set():
            with self._lock:
                due = self._due_t
            target = min(next_t, self._clock() + NAP_S) if due is None else min(next_t, due)
            self._wake.wait(max(0.0, target - self._clock()))
            self._wake.clear()
            if self._stop.is_set():
                break
            now = self._clock()
            if self._replan:
                self._replan = False
                next_t = min(next_t, now + self._interval_s)
            with self._lock:
                requested = self._due_t is not None and now >= self._due_t
                if requested:
                    self._due_t = None
            if not requested and now < next_t:
                continue  # woken to re-plan (a delayed request, a new interval)
            woke = requested
            cpu0 = time.thread_time()
            self.tick()
            self.cpu_s += time.thread_time() - cpu0
            now = self._clock()
            if not woke or now >= next_t:
                next_t += self._interval_s
                if next_t <= now:  # fell behind (a long GIL hold): skip, do not burst
                    next_t = now + self._interval_s
