"""A stretch measured between two exact readings: ``%%gpumem``'s cell, run nested, traced on
request; and the end every measured cell shares (the OOM explainer reads its result).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import safeio
from ..analysis import Watermark, build_record
from ..celltext import CellText
from ..holders import CellException
from ..model import CellRecord, Sample
from ..oom import OomWatch, SiteAtFailure
from ..settings import PEAK_RESET, Config
from ..sources.torch.source import TorchSource
from .cellqueue import CellQueue, Pending
from .cellresult import error_text
from .contain import FailureLog
from .readings import Readings
from .traces import TraceState

if TYPE_CHECKING:  # loaded on the first traced cell
    from ..trace.recorder import TraceResult

__all__ = ["CellMeasure", "Measured", "TraceAsk"]


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

    result: object  # the shell's ExecutionResult
    record: CellRecord | None
    traced: TraceResult | None = None


class CellMeasure(CellQueue):
    """The exact readings half of ``CellRecorder``, and ``%%gpumem``'s measurement."""

    # Set by CellRecorder.__init__.
    shell: Any
    config: Config
    readings: Readings
    torch: TorchSource
    oom: OomWatch
    failures: FailureLog
    traces: TraceState
    last_cell_exception: CellException
    _pending: Pending | None
    _watermarks: list[Watermark]
    _baseline: Sample | None
    _cell_ended_t_s: float

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
    def _ended(self, result: object, sites: list[SiteAtFailure] | None = None) -> None:
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

    @property
    def running_execution_count(self) -> int | None:
        """The number of the top-level cell running now. IPython advances its own counter
        when a cell starts, so ``shell.execution_count`` reads one more during the cell."""
        pending = self._pending
        return pending.execution_count if pending is not None else None

    # -- %%gpumem: a cell measured on request ---------------------------------------------------
    def measure(self, source: str, run: Callable[[], object], *, reset_peak: bool,
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

    def _run_between_readings(self, run: Callable[[], object], reset_peak: bool,
                              ) -> tuple[object, Sample | None, Sample | None,
                                         Watermark | None, bool]:
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
