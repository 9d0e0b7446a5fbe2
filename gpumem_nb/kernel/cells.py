"""Measuring cells: the one path every cell's measurement goes through.

A top-level cell is measured by the shell's ``pre_run_cell``/``post_run_cell`` hooks; a
``%%gpumem`` cell by ``CellRecorder.measure``, which runs its body nested (the hooks see it
as part of the outer cell) between two exact readings. Both end the same way (``_ended``):
the OOM explainer reads the result, and the exception it raised is noted for ``who`` and
``cleanup``.

The hooks are cheap by design: no device is read before a cell (it starts from the
baseline, the sampler's latest reading between cells), and after it only the allocator's
exact figures are read; the record, the verdict and NVML's "after" are made on the sampler
thread a moment later, once the kernel has sent the reply. Hooks never raise: every body is
contained (``FailureLog``).
"""

from __future__ import annotations

import contextvars
import hashlib
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .. import safeio, userexc
from ..analysis import (
    AccumulationTracker,
    Watermark,
    build_record,
    complete_nvml,
    top_holders,
    verdict_message,
)
from ..cellnames import CellNames, counts_ahead_at_start
from ..celltext import CellText
from ..cudastart import CudaStartWatch, launcher_refusal, refusal_advice
from ..errtext import error_str, one_read_per_error
from ..holders import CellException
from ..model import CAUSE_LIVE_TENSORS, CellMark, CellRecord, CellStart, Holder, Sample, Verdict
from ..oom import OomWatch, SiteAtFailure, first_line
from ..records import History
from ..sampler import Sampler
from ..settings import PEAK_RESET, Config
from ..sources.torch import TorchSource
from .callbacks import CellCallbacks
from .contain import FailureLog
from .readings import Readings
from .traces import TraceState

__all__ = [
    "AFTER_CELL_TICK_DELAY_S",
    "MAX_QUEUED_CELLS",
    "CellRecorder",
    "Measured",
    "TraceAsk",
    "cell_key_of",
    "error_text",
]

# After a cell, the sampler ticks this much later, once the kernel has sent the reply.
AFTER_CELL_TICK_DELAY_S = 0.05
# Finished cells waiting for the sampler's reading: past this many (a hung NVML call, a
# stopped thread), the oldest are recorded at once with NVML's "after" unknown.
MAX_QUEUED_CELLS = 64


@dataclass
class _Pending:
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
class _Done:
    """A finished cell, before the sampler's next reading completes it."""

    pending: _Pending
    after: Sample
    count: int | None
    error: str
    context: contextvars.Context
    record: CellRecord | None = None  # set once recorded


@dataclass(frozen=True)
class TraceAsk:
    """``%%gpumem --trace``'s request: how many sites to list, the file to save to, and
    the cells' texts as compiled, read once the cell has run (None: none kept): the lines'
    labels of any cell are read from them."""

    top: int
    save: str | None = None
    cell_texts: Callable[[], CellText | None] | None = None


@dataclass
class Measured:
    """A ``%%gpumem`` cell, measured: the shell's result, its record (None when a reading
    failed: the cell ran unmeasured) and its trace, if one was asked for and read."""

    result: Any
    record: CellRecord | None
    traced: Any = None  # a trace.TraceResult


class CellRecorder:
    """Every cell's record, verdict and mark; the hooks and ``%%gpumem`` measure through it."""

    def __init__(self, shell: Any, *, config: Config, readings: Readings, sampler: Sampler,
                 history: History, tracker: AccumulationTracker, torch: TorchSource,
                 oom: OomWatch, cuda_start: CudaStartWatch, failures: FailureLog,
                 traces: TraceState, scan: Callable[[], list[Holder]]) -> None:
        self.shell = shell
        self.config = config
        self.readings = readings
        self.sampler = sampler
        self.history = history
        self.tracker = tracker
        self.torch = torch
        self.oom = oom
        self.cuda_start = cuda_start
        self.failures = failures
        self.traces = traces
        self._scan = scan
        self.verdicts: deque[Verdict] = deque(maxlen=100)
        self.marks: deque[CellMark] = deque(maxlen=10_000)
        self.on_record: list[Callable[[CellRecord, Verdict | None], None]] = []
        self.cell_callbacks = CellCallbacks()  # gpumem_nb.on_cell: the user's own
        # Work asked for while a top-level cell ran, to do once it ends, on the cell's own
        # thread (the chart's cleanup button, when a click reaches the kernel mid-cell).
        self.after_cell: list[Callable[[], None]] = []
        # The exception the user's latest failing cell raised, while the shell keeps it: only
        # that one is a holder or offered to cleanup (a widget handler's is not: it was
        # never the user's cell's).
        self.last_cell_exception = CellException()
        self._depth = 0
        self._pending: _Pending | None = None
        self._watermarks: list[Watermark] = []
        # The allocator's state when no cell runs: the last cell's "after", refreshed by the
        # sampler between cells. The next cell's "before" reuses it instead of reading cold.
        self._baseline: Sample | None = None
        self._baseline_lock = threading.Lock()
        # Finished cells waiting for the sampler: to be recorded and judged, or to have
        # their NVML "after" figures completed. Drained in order under _record_lock.
        self._done: deque[_Done] = deque()
        self._record_lock = threading.RLock()
        self._seen_cells: set[str] = set()  # cells run before: a re-run may need a verdict
        # When the latest top-level cell began and the latest one ended (monotonic): a
        # sampler reading stands for a cell's "after" only if no cell began since that cell
        # ended, and for a cell's "before" only if it was read after the previous one ended.
        self._cell_began_t_s = float("-inf")
        self._cell_ended_t_s = float("-inf")
        # Device-selection changes: a reading made under another selection covers other
        # devices, so it is neither a baseline nor half of a record's comparison.
        self._selections = 0
        self._selection_t_s = float("-inf")
        # The exception a launcher refusal was explained for in this top-level cell (a nested
        # cell's error can reach its outer cell's result too): advised once. By id: holding
        # the exception would hold its frames' tensors.
        self._advised_id: int | None = None

    # -- what the sampler and the settings tell it -------------------------------------------
    def select_devices(self, index: int | None) -> None:
        """Watch ``index`` (None: every GPU) from now on; the baseline is read afresh."""
        with self._baseline_lock:
            self._selections += 1
            self._selection_t_s = time.monotonic()
            if hasattr(self.readings.source, "selected"):
                self.readings.source.selected = None if index is None else [index]
            self._baseline = None  # other devices now: read them afresh
        self.sampler.request_tick()

    def forget_baseline(self) -> None:
        """The allocator changed outside any cell (cleanup): the next cell reads afresh."""
        with self._baseline_lock:
            self._baseline = None

    def on_sample(self, sample: Sample) -> None:
        # Sampler thread: extend the running cells' watermarks; between cells, refresh the
        # baseline the next cell will start from.
        for wm in list(self._watermarks):
            wm.update(sample)
        with self._baseline_lock:
            base = self._baseline
            if self._pending is None and base is not None and sample.t_s > base.t_s \
                    and sample.t_s > self._selection_t_s:
                self._baseline = sample
        if self._done:
            with self._record_lock:
                self._drain_done(sample)

    # -- exact readings around a measured stretch ---------------------------------------------
    def reset_peaks(self) -> bool:
        """Reset the allocator's peak counters: only on request, only once CUDA is up."""
        try:
            done = self.torch.reset_peaks(self.config.device)
            if done and self._pending is not None:
                # Reset from inside a cell (%%gpumem --reset-peak): nothing of the cell ran
                # before it, so the cell's own peak is exact too.
                self._pending.reset_peak = True
            return done
        except Exception as e:
            self.failures.contain("reset_peak_memory_stats", e)
            return False

    def begin(self, *, reset_peak: bool, nvml_now: bool = False,
              ) -> tuple[Sample, Watermark, bool]:
        """Start a measurement with a fresh exact reading (``%%gpumem``). ``nvml_now``: NVML
        read now as well (bounded, as on demand), not the sampler's latest reading, which a
        cell shorter than the sampling interval would otherwise see before and after it."""
        did_reset = self.reset_peaks() if reset_peak else False
        before = self.readings.read() if nvml_now else self.readings.read_hot()
        wm = Watermark(since_t_s=before.t_s)
        self._watermarks.append(wm)
        return before, wm, did_reset

    def end(self, wm: Watermark, *, nvml_now: bool = False) -> Sample:
        after = self.readings.read() if nvml_now else self.readings.read_hot()
        if wm in self._watermarks:
            self._watermarks.remove(wm)
        with self._baseline_lock:
            self._baseline = after
            self._cell_ended_t_s = after.t_s
        return after

    # -- the end of every measured cell -------------------------------------------------------
    def _ended(self, result: Any, sites: list[SiteAtFailure] | None = None) -> None:
        """A cell ended, top-level or ``%%gpumem``: one attribute check unless it raised a
        CUDA OOM, which is explained in the cell's own output (with the sites a trace saw at
        the failure)."""
        try:
            if sites is None:
                self.oom.on_cell_result(result)
            else:
                self.oom.on_cell_result(result, sites=sites)
        except BaseException as e:  # a user exception's odd code, contained
            self.failures.contain("OOM explainer", e)

    # -- the shell's hooks: top-level cells ----------------------------------------------------
    def pre_run_cell(self, info: Any) -> None:
        """Cheap by design: no device is read here. The cell starts from the baseline."""
        self._depth += 1
        if self._depth != 1:
            return  # nested (%%capture, run_cell from a cell): part of the outer cell
        self._advised_id = None
        try:  # before a cell that may start CUDA: the OOM observer queued on its start-up
            self.oom.arm()  # one attribute check once tried
        except BaseException as e:
            self.failures.contain("OOM explainer", e)
        try:  # an armed session recording: queued on CUDA's start once torch is imported
            self.traces.cell_started()
        except BaseException as e:
            self.failures.contain("session recording", e)
        try:
            t_s = time.monotonic()
            with self._baseline_lock:
                self._cell_began_t_s = t_s
            reset = self.config.peak == PEAK_RESET and self.reset_peaks()
            with self._baseline_lock:
                before = self._baseline
                if before is None or reset:
                    before = self._baseline = self.readings.read_hot()
                selection = self._selections
                ended_t_s = self._cell_ended_t_s
            if before.nvml_t_s is not None and before.nvml_t_s < ended_t_s:
                # NVML's figures here were read before the previous cell ended (the hooks
                # reuse the sampler's): what that cell did would count as this one's.
                before = replace(before, devices=tuple(
                    replace(d, nvml=None) for d in before.devices))
            count = _pre_count(self.shell, info)
            raw = getattr(info, "raw_cell", "") or ""
            CellNames.of(self.shell).note(raw, count)
            if self.cuda_start.started is None:
                self.cuda_start.cell_started(count, raw)
            wm = Watermark(since_t_s=t_s)
            self._watermarks.append(wm)
            self._pending = _Pending(
                before=before, t_s=t_s, wall_s=time.time(), cell_key=cell_key_of(info),
                source=raw,
                execution_count=count,
                thread_id=threading.get_ident(), reset_peak=reset, watermark=wm,
                mark=CellMark(t_s), device=self.config.device, selection=selection,
            )
            # Marked at its start, so a long cell shows on the chart while it runs.
            self.marks.append(self._pending.mark)
        except BaseException as e:  # as in post_run_cell
            self._pending = None
            self.failures.contain("pre_run_cell", e)

    def post_run_cell(self, result: Any) -> None:
        if getattr(result, "error_in_exec", None) is None:
            self._post_run_cell(result)
            return
        with one_read_per_error():  # a failing cell's str(exc) runs once, not once per check
            self._post_run_cell(result)

    def _post_run_cell(self, result: Any) -> None:
        # The cell's exception is the user's object, read through ``userexc``/``errtext``.
        # BaseException is contained here, not only Exception: IPython lets anything else
        # out of a callback, and a SystemExit raised by a user's __str__ would end the
        # kernel. The cell's own code is not run here: nothing of the user's is swallowed.
        if self._depth == 0:
            # A blank cell, or the cell that loaded us: no matching pre. That one may have
            # imported torch and started CUDA after the load.
            try:
                if self.cuda_start.started is None and _ran_code(result):
                    self.cuda_start.load_cell_ended(_count_of(result))
                self._watch_refusal(result)
            except BaseException as e:
                self.failures.contain("CUDA start watch", e)
            return
        self._depth -= 1
        if self._depth != 0:
            # Nested (%%capture, %%gpumem, run_cell from a cell): its error, if any, shows
            # here, in the nested cell's output, and never reaches the outer cell's result.
            try:
                self._watch_refusal(result)
            except BaseException as e:
                self.failures.contain("CUDA start watch", e)
            return
        self._ended(result)
        try:
            self._watch_cuda_start(result)
        except BaseException as e:
            self.failures.contain("CUDA start watch", e)
        pending = self._pending
        if pending is not None:
            try:
                self._finish(pending, result)
            except BaseException as e:
                self.failures.contain("post_run_cell", e)
            finally:
                self._pending = None
        while self.after_cell:
            try:
                self.after_cell.pop(0)()
            except BaseException as e:
                self.failures.contain("after the cell", e)

    def _watch_cuda_start(self, result: Any) -> None:
        """Until CUDA is up: did this cell start it? After a failing cell: was it a forking
        launcher refusing because CUDA was up, and where did CUDA start?"""
        if self.cuda_start.started is None:
            self.cuda_start.cell_ended(_count_of(result))
        self._watch_refusal(result)

    def _watch_refusal(self, result: Any) -> None:
        """A failing cell (or a nested one): was it a forking launcher refusing because CUDA
        was up? Then say where CUDA started. Each exception is advised on once, though it
        may reach both a nested cell's result and its outer cell's."""
        err = _cell_exception(result)
        if err is None or id(err) == self._advised_id:
            return
        who = launcher_refusal(err)
        if who is not None:
            self._advised_id = id(err)
            print(refusal_advice(who, self.cuda_start.started))

    def _finish(self, pending: _Pending, result: Any) -> None:
        """The one exact allocator read, then as little as possible before the reply.

        A cell whose verdict may need printing in its own output (it raised, or a re-run the
        allocator shows growing) is judged here. Every other cell, nearly all of them, is
        recorded and judged on the sampler thread a moment later, with NVML's reading after
        the cell, once the kernel has sent the reply.
        """
        after = self.end(pending.watermark)
        if pending.selection != self._selections:
            # The cell changed which GPUs are watched (%gpumem config --device): compare
            # only the devices both its readings cover.
            after = _covered(after, pending.device, self.config.device)
            pending.before = _covered(pending.before, pending.device, self.config.device)
        raised = _cell_exception(result)
        count = getattr(result, "execution_count", None) or pending.execution_count
        self.last_cell_exception.note(count, result, self.shell)
        pending.mark.execution_count = count
        done = _Done(pending, after, count, error_text(result), contextvars.copy_context())
        rerun = pending.cell_key in self._seen_cells
        self._seen_cells.add(pending.cell_key)
        if raised is not None or not self.sampler.running or (
                rerun and self._allocator_grew(pending, after)):
            with self._record_lock:
                self._drain_done(None)
                done.record = self._record(done, None)
                self._observe(done.record, None)
            with self._baseline_lock:
                self._done.append(done)  # NVML's "after" still to come
        else:
            with self._baseline_lock:
                self._done.append(done)
        if len(self._done) > MAX_QUEUED_CELLS:
            with self._record_lock:
                # The sampler is stopped or stuck: record the oldest now, NVML unknown.
                self._drain_done(None, keep=MAX_QUEUED_CELLS)
        # The sampler records, judges and redraws a moment later: that work must not compete
        # with the kernel sending this cell's reply.
        self.sampler.request_tick(delay_s=AFTER_CELL_TICK_DELAY_S)

    # -- %%gpumem: a cell measured on request ---------------------------------------------------
    def measure(self, source: str, run: Callable[[], Any], *, reset_peak: bool,
                trace: TraceAsk | None = None, quiet: bool = False) -> Measured:
        """Run a ``%%gpumem`` cell (``run`` runs it nested) between two exact readings, NVML
        read at both ends, traced when ``trace`` asks. A reading that fails is reported in
        one line and the cell still runs (unmeasured): the user's code comes first. The
        record is the caller's to show: it is not the history's (the outer cell's is)."""
        from ..trace.recorder import CellTracer

        tracer = CellTracer(session=self.traces.session_active) \
            if trace is not None else None
        why = tracer.start() if tracer is not None else ""
        if why:
            print(f"gpumem --trace: {why}")
            tracer = None
        try:
            result, before, after, wm, did_reset = self._run_between_readings(run, reset_peak)
        except BaseException:
            # Whatever failed (a KeyboardInterrupt between readings, a bug), allocation
            # history is never left recording; stop() below switches it off otherwise.
            if tracer is not None:
                tracer.disarm()
            raise
        traced = None
        if tracer is not None and trace is not None:
            try:
                traced = tracer.stop(top=trace.top, save=trace.save, cells=(
                    trace.cell_texts() if trace.cell_texts is not None else None))
            except Exception as e:
                self.failures.contain("%%gpumem --trace", e)
                print(f"gpumem --trace: the trace could not be read ({type(e).__name__}).")
        save = trace.save if trace is not None else None
        if save is not None and (traced is None or not traced.saved_to):
            # Asked for a file and got none: said even under -q (on stderr, where -q does
            # not reach), as it is among the notes otherwise.
            why = traced.save_failed if traced is not None else \
                f"Nothing was saved to {safeio.shown(save)}: the cell was not traced."
            if quiet or traced is None:
                print(f"gpumem --trace: {why}", file=sys.stderr)
        if traced is not None and traced.snapshot is not None:
            self.traces.last_trace = traced
        # The shell's hooks see only top-level cells; this one ran nested.
        with self.traces.explaining(traced if traced is not None
                                    and traced.snapshot is not None else None):
            self._ended(result, [SiteAtFailure(label, n) for label, n in (
                traced.sites_at_failure() if traced is not None else ())])
        if getattr(result, "error_in_exec", None) is not None:
            # The nested run compiled the cell under the shell's next number: the stored
            # exception is this cell's, by its own number.
            self.last_cell_exception.note(self.running_execution_count, result, self.shell)
        if before is None or after is None or wm is None:
            return Measured(result, None, traced)
        rec = build_record(
            execution_count=self.running_execution_count, cell_key="%%gpumem",
            source=source, before=before, after=after, watermark=wm,
            reset_at_start=did_reset, error=error_text(result),
        )
        return Measured(result, rec, traced)

    def _run_between_readings(self, run: Callable[[], Any], reset_peak: bool,
                              ) -> tuple[Any, Any, Any, Any, bool]:
        before = after = wm = None
        did_reset = False
        try:
            self.flush()  # earlier cells the sampler has not recorded yet
            reset = reset_peak or self.config.peak == PEAK_RESET
            # An explicit measurement reads NVML itself, before and after: the sampler's
            # latest reading can predate the cell (a stale "NVML peak" and Δ).
            before, wm, did_reset = self.begin(reset_peak=reset, nvml_now=True)
        except Exception as e:
            self.failures.contain("%%gpumem", e)
            print(f"gpumem: this cell runs unmeasured: reading memory failed "
                  f"({type(e).__name__}).")
            before = None
        result = run()
        if before is not None and wm is not None:
            try:
                after = self.end(wm, nvml_now=True)
            except Exception as e:
                self.failures.contain("%%gpumem", e)
                print(f"gpumem: this cell's end could not be read ({type(e).__name__}).")
        return result, before, after, wm, did_reset

    # -- the history ---------------------------------------------------------------------------
    def flush(self) -> None:
        """Record every finished cell now, with the NVML figures known so far (before
        anything reads the history on demand)."""
        if self._done:
            with self._record_lock:
                self._drain_done(None)

    def _allocator_grew(self, pending: _Pending, after: Sample) -> bool:
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

    def _record(self, done: _Done, nvml_after: Sample | None) -> CellRecord:
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

    # -- the running cell ------------------------------------------------------------------------
    def marks_for_picture(self, last: int) -> list[CellMark]:
        """The latest ``last`` cell marks for a static picture: the running cell's with the
        number it is getting. The cell that ends a chart (``%gpumem watch --stop``) makes
        its picture while it runs, and a "[*]" there would stay for good."""
        p = self._pending
        return [replace(m, execution_count=p.execution_count)
                if p is not None and m is p.mark and m.execution_count is None else m
                for m in list(self.marks)[-last:]]

    @property
    def running_execution_count(self) -> int | None:
        """The number of the top-level cell running now. IPython advances its own counter
        when a cell starts, so ``shell.execution_count`` reads one more during the cell."""
        pending = self._pending
        return pending.execution_count if pending is not None else None

    @property
    def cell_running(self) -> bool:
        """Between a top-level cell's pre and post hooks, on whatever thread asks."""
        return self._pending is not None

    def running_cell_number(self) -> int | None:
        """The number of the top-level cell running now, as the editor shows it; None
        between cells."""
        pending = self._pending
        return pending.execution_count if pending is not None else None

    def busy_elsewhere(self) -> bool:
        """A cell is running on another thread (a widget click during a cell)."""
        p = self._pending
        return p is not None and p.thread_id != threading.get_ident()

    def cell_start(self, device: int) -> CellStart | None:
        """The running cell's allocated bytes on ``device`` at its start, and the same cell's
        last run's peak above its own start (a run that raised is passed over): what the OOM
        explainer weighs the failing cell's own working set by."""
        p = self._pending
        if p is None:
            return None
        d = p.before.device(device)
        start = d.allocator.allocated_bytes if d is not None and d.allocator else None
        with self._baseline_lock:
            queued = [q for q in self._done if q.pending.cell_key == p.cell_key]
        # Finished runs the sampler has not recorded yet are judged as they will be recorded.
        runs = [r for r in self.history.records() if r.cell_key == p.cell_key] + [
            q.record or build_record(
                execution_count=q.count, cell_key=q.pending.cell_key, source="",
                before=q.pending.before, after=q.after, watermark=q.pending.watermark,
                reset_at_start=q.pending.reset_peak, error=q.error) for q in queued]
        for rec in reversed(runs):
            dev = next((x for x in rec.devices if x.index == device), None)
            if rec.raised or dev is None or dev.peak_allocated_bytes is None:
                continue
            return CellStart(start, dev.peak_allocated_bytes - (dev.allocated_before_bytes or 0),
                             dev.peak_exact)
        return CellStart(start)


def _pre_count(shell: Any, info: Any) -> int | None:
    """The cell's number as seen before it runs; cells that store no history get none.
    IPython >= 9.8 has already advanced ``execution_count`` by then, older ones have not."""
    count = getattr(shell, "execution_count", None)
    if not isinstance(count, int) or not getattr(info, "store_history", True):
        return None
    return count - 1 if counts_ahead_at_start() else count


def cell_key_of(info: Any) -> str:
    """The frontend's cell id when it sends one, else a hash of the source."""
    cell_id = getattr(info, "cell_id", None)
    if cell_id:
        return str(cell_id)
    raw = getattr(info, "raw_cell", "") or ""
    # surrogatepass: a cell holding a lone surrogate (pasted binary) still gets its key
    return "src:" + hashlib.sha1(raw.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _covered(sample: Sample, before: int | None, after: int | None) -> Sample:
    """``sample`` with only the devices both selections (None: every GPU) watch."""
    return replace(sample, devices=tuple(
        d for d in sample.devices
        if (before is None or d.index == before) and (after is None or d.index == after)))


def _count_of(result: Any) -> int | None:
    count = getattr(result, "execution_count", None)
    return count if isinstance(count, int) else None


def _ran_code(result: Any) -> bool:
    """A cell that held code (a blank one also ends without having begun)."""
    raw = getattr(getattr(result, "info", None), "raw_cell", None)
    return isinstance(raw, str) and bool(raw.strip())


def _cell_exception(result: Any) -> BaseException | None:
    err = getattr(result, "error_in_exec", None)
    return err if userexc.is_exception(err) else None


def error_text(result: Any) -> str:
    """A cell's error in one short line for its record; never raises, whatever the
    exception's ``__str__``, ``__bool__`` or class do, and costs the same for a 10 MB
    message."""
    if result is None:
        return ""
    err = getattr(result, "error_in_exec", None)
    if err is None:
        err = getattr(result, "error_before_exec", None)
    if not userexc.is_exception(err):
        return ""
    name = userexc.type_name(err)
    text = first_line(error_str(err), 200)
    return f"{name}: {text}"[:200] if text else name
