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

``CellRecorder`` is built in three layers, one job to a file: the finished cells' queue
(``cellqueue``), the exact readings and ``%%gpumem`` (``measure``), and here the shell's
hooks and the running cell. What a cell's ``info`` and ``result`` say is read in
``cellresult``.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..analysis import (
    AccumulationTracker,
    Watermark,
    build_record,
)
from ..cellnames import CellNames
from ..cudastart import CudaStartWatch, launcher_refusal, refusal_advice
from ..errtext import one_read_per_error
from ..holders import CellException
from ..model import CellMark, CellRecord, CellStart, Holder, Sample, Verdict
from ..oom import OomWatch
from ..records import History
from ..sampler import Sampler
from ..settings import PEAK_RESET, Config
from ..sources.torch.source import TorchSource
from .callbacks import CellCallbacks
from .cellqueue import MAX_QUEUED_CELLS, Done, Pending
from .cellresult import (
    cell_exception,
    cell_key_of,
    count_of,
    error_text,
    pre_count,
    ran_code,
)
from .contain import FailureLog
from .measure import CellMeasure
from .readings import Readings
from .traces import TraceState

__all__ = ["AFTER_CELL_TICK_DELAY_S", "CellRecorder"]

# After a cell, the sampler ticks this much later, once the kernel has sent the reply.
AFTER_CELL_TICK_DELAY_S = 0.05


class CellRecorder(CellMeasure):
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
        self._pending: Pending | None = None
        self._watermarks: list[Watermark] = []
        # The allocator's state when no cell runs: the last cell's "after", refreshed by the
        # sampler between cells. The next cell's "before" reuses it instead of reading cold.
        self._baseline: Sample | None = None
        self._baseline_lock = threading.Lock()
        # Finished cells waiting for the sampler: to be recorded and judged, or to have
        # their NVML "after" figures completed. Drained in order under _record_lock.
        self._done: deque[Done] = deque()
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

    # -- the shell's hooks: top-level cells ----------------------------------------------------
    def pre_run_cell(self, info: object) -> None:
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
            count = pre_count(self.shell, info)
            raw = getattr(info, "raw_cell", "") or ""
            CellNames.of(self.shell).note(raw, count)
            if self.cuda_start.started is None:
                self.cuda_start.cell_started(count, raw)
            wm = Watermark(since_t_s=t_s)
            self._watermarks.append(wm)
            self._pending = Pending(
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

    def post_run_cell(self, result: object) -> None:
        if getattr(result, "error_in_exec", None) is None:
            self._post_run_cell(result)
            return
        with one_read_per_error():  # a failing cell's str(exc) runs once, not once per check
            self._post_run_cell(result)

    def _post_run_cell(self, result: object) -> None:
        # The cell's exception is the user's object, read through ``userexc``/``errtext``.
        # BaseException is contained here, not only Exception: IPython lets anything else
        # out of a callback, and a SystemExit raised by a user's __str__ would end the
        # kernel. The cell's own code is not run here: nothing of the user's is swallowed.
        if self._depth == 0:
            # A blank cell, or the cell that loaded us: no matching pre. That one may have
            # imported torch and started CUDA after the load.
            try:
                if self.cuda_start.started is None and ran_code(result):
                    self.cuda_start.load_cell_ended(count_of(result))
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

    def _watch_cuda_start(self, result: object) -> None:
        """Until CUDA is up: did this cell start it? After a failing cell: was it a forking
        launcher refusing because CUDA was up, and where did CUDA start?"""
        if self.cuda_start.started is None:
            self.cuda_start.cell_ended(count_of(result))
        self._watch_refusal(result)

    def _watch_refusal(self, result: object) -> None:
        """A failing cell (or a nested one): was it a forking launcher refusing because CUDA
        was up? Then say where CUDA started. Each exception is advised on once, though it
        may reach both a nested cell's result and its outer cell's."""
        err = cell_exception(result)
        if err is None or id(err) == self._advised_id:
            return
        who = launcher_refusal(err)
        if who is not None:
            self._advised_id = id(err)
            print(refusal_advice(who, self.cuda_start.started))

    def _finish(self, pending: Pending, result: object) -> None:
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
        raised = cell_exception(result)
        count = getattr(result, "execution_count", None) or pending.execution_count
        self.last_cell_exception.note(count, result, self.shell)
        pending.mark.execution_count = count
        done = Done(pending, after, count, error_text(result), contextvars.copy_context())
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


def _covered(sample: Sample, before: int | None, after: int | None) -> Sample:
    """``sample`` with only the devices both selections (None: every GPU) watch."""
    return replace(sample, devices=tuple(
        d for d in sample.devices
        if (before is None or d.index == before) and (after is None or d.index == after)))
