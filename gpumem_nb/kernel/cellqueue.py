"""The finished cells' queue: each cell recorded into the history and judged, on the sampler
thread once its NVML "after" is read, or at once when its verdict must print in its own output.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..analysis import (
    AccumulationTracker,
    Watermark,
    build_record,
    complete_nvml,
    top_holders,
    verdict_message,
)
from ..model import CAUSE_LIVE_TENSORS, CellMark, CellRecord, Holder, Sample, Verdict
from ..records import History
from .callbacks import CellCallbacks

__all__ = ["MAX_QUEUED_CELLS", "CellQueue", "Done", "Pending"]

# Finished cells waiting for the sampler's reading: past this many (a hung NVML call, a
# stopped thread), the oldest are recorded at once with NVML's "after" unknown.
MAX_QUEUED_CELLS = 64


@dataclass
class Pending:
    before: Sample
    t_s: float
    wall_s: float
    cell_key: str
    source: str
    execution_count: int | None
    thread_id: int
    reset_peak: bool
    watermark: Watermark = field(default_factory=Watermark)
    mark: CellMark = field(default_factory=lambda: CellMark(0.0))
    device: int | None = None  # the device selection the cell started under
    selection: int = 0  # CellRecorder._selections when it started


@dataclass
class Done:
    """A finished cell, before the sampler's next reading completes it."""

    pending: Pending
    after: Sample
    count: int | None
    error: str
    context: contextvars.Context
    record: CellRecord | None = None  # set once recorded


class CellQueue:
    """The history half of ``CellRecorder``: finished cells recorded and judged in order."""

    # Set by CellRecorder.__init__.
    history: History
    tracker: AccumulationTracker
    verdicts: deque[Verdict]
    on_record: list[Callable[[CellRecord, Verdict | None], None]]
    cell_callbacks: CellCallbacks
    _scan: Callable[[], list[Holder]]
    _done: deque[Done]
    _baseline_lock: threading.Lock
    _record_lock: threading.RLock
    _cell_began_t_s: float

    def flush(self) -> None:
        """Record every finished cell now, with the NVML figures known so far (before
        anything reads the history on demand)."""
        if self._done:
            with self._record_lock:
                self._drain_done(None)

    def _allocator_grew(self, pending: Pending, after: Sample) -> bool:
        threshold = self.tracker.threshold_bytes
        for d in after.devices:
            b = pending.before.device(d.index)
            a_al, b_al = d.allocator, b.allocator if b is not None else None
            if a_al is None:
                continue
            if (a_al.allocated_bytes - (b_al.allocated_bytes if b_al else 0) > threshold
                    or a_al.reserved_bytes - (b_al.reserved_bytes if b_al else 0) > threshold):
                return True
        return False

    def _record(self, done: Done, nvml_after: Sample | None) -> CellRecord:
        p = done.pending
        before = replace(p.before, t_s=p.t_s, wall_s=p.wall_s)
        rec = build_record(
            execution_count=done.count, cell_key=p.cell_key, source=p.source,
            before=before, after=done.after, watermark=p.watermark,
            reset_at_start=p.reset_peak, error=done.error,
        )
        rec = complete_nvml(rec, nvml_after)
        self.history.append(rec)
        return rec

    def _drain_done(self, sample: Sample | None, *, keep: int = 0) -> None:
        """Record and judge finished cells in order; with ``sample`` (sampler thread) only
        those that ended before it, completing their NVML figures from it; without, all but
        the newest ``keep``.

        A reading stands for a cell's NVML "after" only if no cell began between that cell's
        end and the reading: in a fast Run All the next cell may already have allocated
        when the sampler reads, and a ``pass`` cell would be flagged with the next cell's
        memory "outside PyTorch". Such a cell's NVML "after" is unknown instead, and its
        verdict rests on the allocator alone."""
        while True:
            with self._baseline_lock:
                if len(self._done) <= keep or (
                        sample is not None and self._done[0].after.t_s > sample.t_s):
                    return
                done = self._done.popleft()
                later_cell = self._cell_began_t_s > done.after.t_s
            after = sample if sample is not None and not later_cell else None
            if done.record is None:
                rec = self._record(done, after)
                self._observe(rec, done.context if sample is not None else None)
            else:
                # Without a reading (or with one the next cell may have changed), NVML's
                # "after" is unknown, and shown so rather than the stale figure.
                self.history.replace(done.record, complete_nvml(done.record, after))

    def finish_queue(self, budget_s: float) -> None:
        """Unload: record every queued cell, judging them (each verdict printed into its own
        cell's output) while ``budget_s`` lasts; later ones are recorded unjudged."""
        deadline = time.monotonic() + budget_s
        with self._record_lock:
            while True:
                with self._baseline_lock:
                    if not self._done:
                        return
                    done = self._done.popleft()
                if done.record is not None:
                    self.history.replace(done.record, complete_nvml(done.record, None))
                elif time.monotonic() < deadline:
                    self._observe(self._record(done, None), done.context)
                else:
                    self._record(done, None)

    def _observe(self, rec: CellRecord, context: contextvars.Context | None) -> None:
        verdict = self.tracker.observe(rec)
        if verdict is not None:
            verdict = self._explain(verdict)
            self.verdicts.append(verdict)
            # Printed under the cell's own context, so a judgement made on the sampler
            # thread is still routed to that cell's output.
            if context is None:
                print(verdict.message)
            else:
                context.run(print, verdict.message)
        for fn in list(self.on_record):
            fn(rec, verdict)
        if len(self.cell_callbacks):
            # The user's: run in the cell's context, so what they print lands under it.
            if context is None:
                self.cell_callbacks.dispatch(rec)
            else:
                context.run(self.cell_callbacks.dispatch, rec)

    def _explain(self, v: Verdict) -> Verdict:
        holders: tuple[Holder, ...] = ()
        if v.cause == CAUSE_LIVE_TENSORS:
            holders = top_holders(self._scan(), v.cause)
        return replace(v, holders=holders, message=verdict_message(v, holders))
