"""One loaded extension's state: sources, sampler, history, cell hooks, cleanup.

Deliberately free of IPython imports: the shell is used only through the attributes every
IPython shell has (``user_ns``, ``displayhook``, ``execution_count``), so this is testable with
a real shell or a stand-in. Event callbacks are bound methods of ``Monitor`` so unload can
unregister those exact objects.

Hooks never raise: IPython prints a traceback for every cell whose callback fails, so each hook
body is contained and its error logged once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from . import __version__, cleanup
from .analysis import (
    AccumulationTracker,
    Watermark,
    build_record,
    top_holders,
    verdict_message,
)
from .holders import CellException, Scanner, last_exception_objects
from .model import CAUSE_LIVE_TENSORS, CellMark, CellRecord, Holder, Sample, Verdict
from .records import History
from .sampler import Sampler
from .settings import PEAK_RESET, Config
from .sources import Source
from .sources.torch import TorchSource
from .units import format_bytes

log = logging.getLogger("gpumem_nb")

REPLAY_ENV = "GPUMEM_NB_REPLAY"


@dataclass
class _Pending:
    before: Sample
    cell_key: str
    source: str
    execution_count: int | None
    thread_id: int
    reset_peak: bool
    watermark: Watermark = field(default_factory=Watermark)
    mark: CellMark = field(default_factory=lambda: CellMark(0.0))


def _pre_count(shell: Any, info: Any) -> int | None:
    """The cell's number as seen before it runs. IPython has already advanced
    ``execution_count`` when the cell stores history; cells that do not get no number."""
    count = getattr(shell, "execution_count", None)
    if not isinstance(count, int) or not getattr(info, "store_history", True):
        return None
    return count - 1


def cell_key_of(info: Any) -> str:
    """The frontend's cell id when it sends one, else a hash of the source."""
    cell_id = getattr(info, "cell_id", None)
    if cell_id:
        return str(cell_id)
    raw = getattr(info, "raw_cell", "") or ""
    return "src:" + hashlib.sha1(raw.encode()).hexdigest()[:12]


def make_source() -> Source:
    replay = os.environ.get(REPLAY_ENV)
    if replay:
        from .sources.replay import ReplaySource

        return ReplaySource.from_file(None if replay in ("1", "bundled") else replay)
    from .sources.live import LiveSource

    return LiveSource()


class Monitor:
    """Everything one loaded extension owns."""

    def __init__(self, shell: Any, source: Source | None = None,
                 history: History | None = None, config: Config | None = None) -> None:
        self.shell = shell
        self.config = config if config is not None else Config()
        self.source: Source = source if source is not None else make_source()
        self.sampler = Sampler(self.source, interval_s=self.config.interval_s)
        self.history = history if history is not None else History()
        self.tracker = AccumulationTracker(self.config.threshold_bytes)
        if self.config.device is not None:
            self.select_device(self.config.device)
        self.verdicts: deque[Verdict] = deque(maxlen=100)
        self.marks: deque[CellMark] = deque(maxlen=10_000)
        self._depth = 0
        self._pending: _Pending | None = None
        self._watermarks: list[Watermark] = []
        self._errors: set[str] = set()
        # The exception the user's latest failing cell raised, while the shell keeps it: only
        # that one is a holder or offered to cleanup (a widget handler's is not, issue 7).
        self.last_cell_exception = CellException()
        self.widget: Any = None
        self.started_t_s = time.monotonic()
        self.on_record: list[Callable[[CellRecord, Verdict | None], None]] = []

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> str:
        try:
            self.source.start()
        except Exception as e:
            self._contain("start", e)
        self.sampler.add_listener(self._on_sample)
        self.sampler.start()
        return self.status_line()

    def shutdown(self) -> None:
        self.sampler.remove_listener(self._on_sample)
        self.sampler.stop()
        if self.widget is not None:
            try:
                self.widget.close()
            except Exception as e:
                self._contain("widget close", e)
            self.widget = None
        try:
            self.source.close()
        except Exception as e:
            self._contain("close", e)

    def status_line(self) -> str:
        st = self.source.status()
        head = f"gpumem_nb {__version__}"
        if not st.has_gpu:
            return f"{head}: no GPU visible ({st.nvml}); tracking host RAM. %gpumem? for help."
        latest = self.read()
        names = ", ".join(
            f"{d.index}: {d.nvml.name or 'GPU'} {format_bytes(d.nvml.total_bytes)}"
            for d in latest.devices if d.nvml is not None
        )
        return f"{head}: watching GPU {names}. %gpumem? for help."

    def _contain(self, where: str, e: BaseException) -> None:
        key = f"{where}: {type(e).__name__}: {e}"
        if key not in self._errors:
            self._errors.add(key)
            log.warning("gpumem_nb %s failed (reported once): %s", where, e)

    # -- readings ----------------------------------------------------------------------------
    def read(self) -> Sample:
        """A full reading, for on-demand work (status, cleanup)."""
        return self.source.read(processes=True)

    def read_fast(self) -> Sample:
        """The cell hooks' reading: no NVML process listing (see NvmlSource.read)."""
        return self.source.read(processes=False)

    def _on_sample(self, sample: Sample) -> None:
        # Sampler thread: only extend the running cells' watermarks.
        for wm in list(self._watermarks):
            wm.update(sample)

    def gpu_count(self) -> int:
        return self.source.status().gpu_count

    def select_device(self, index: int | None) -> None:
        self.config.device = index
        if hasattr(self.source, "selected"):
            self.source.selected = None if index is None else [index]

    def _reset_peaks(self) -> bool:
        """Reset the allocator's peak counters: only on request, only once CUDA is up."""
        try:
            return TorchSource().reset_peaks(self.config.device)
        except Exception as e:
            self._contain("reset_peak_memory_stats", e)
            return False

    def begin(self, *, reset_peak: bool) -> tuple[Sample, Watermark, bool]:
        did_reset = self._reset_peaks() if reset_peak else False
        before = self.read_fast()
        wm = Watermark()
        self._watermarks.append(wm)
        return before, wm, did_reset

    def end(self, wm: Watermark) -> Sample:
        after = self.read_fast()
        if wm in self._watermarks:
            self._watermarks.remove(wm)
        return after

    # -- cell hooks --------------------------------------------------------------------------
    def pre_run_cell(self, info: Any) -> None:
        self._depth += 1
        if self._depth != 1:
            return  # nested (%%capture, run_cell from a cell): part of the outer cell
        try:
            before, wm, did_reset = self.begin(reset_peak=self.config.peak == PEAK_RESET)
            self._pending = _Pending(
                before=before, cell_key=cell_key_of(info),
                source=getattr(info, "raw_cell", "") or "",
                execution_count=_pre_count(self.shell, info),
                thread_id=threading.get_ident(), reset_peak=did_reset, watermark=wm,
                mark=CellMark(before.t_s),
            )
            self.sampler.record(before)
            # Marked at its start, so a long cell shows on the chart while it runs.
            self.marks.append(self._pending.mark)
        except Exception as e:
            self._pending = None
            self._contain("pre_run_cell", e)

    def post_run_cell(self, result: Any) -> None:
        if self._depth == 0:
            return  # a blank cell, or the cell that loaded us: no matching pre
        self._depth -= 1
        if self._depth != 0:
            return
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            self._finish(pending, result)
        except Exception as e:
            self._contain("post_run_cell", e)

    def _finish(self, pending: _Pending, result: Any) -> None:
        after = self.end(pending.watermark)
        self.sampler.record(after)
        count = getattr(result, "execution_count", None) or pending.execution_count
        self.last_cell_exception.note(count, result, self.shell)
        rec = build_record(
            execution_count=count, cell_key=pending.cell_key, source=pending.source,
            before=pending.before, after=after, watermark=pending.watermark,
            reset_at_start=pending.reset_peak, error=error_text(result),
        )
        self.history.append(rec)
        pending.mark.execution_count = count
        verdict = self.tracker.observe(rec)
        if verdict is not None:
            verdict = self._explain(verdict)
            self.verdicts.append(verdict)
            print(verdict.message)
        for fn in list(self.on_record):
            fn(rec, verdict)
        self.sampler.request_tick()  # the widget redraws from the sampler thread

    def _explain(self, v: Verdict) -> Verdict:
        holders: tuple[Holder, ...] = ()
        if v.cause == CAUSE_LIVE_TENSORS:
            holders = top_holders(self.scan(), v.cause)
        return replace(v, holders=holders, message=verdict_message(v, holders))

    @property
    def cell_running(self) -> bool:
        """Between a top-level cell's pre and post hooks, on whatever thread asks."""
        return self._pending is not None

    def use_source(self, source: Source) -> None:
        """Switch what the sampler and hooks read (``%gpumem watch --replay``)."""
        source.start()
        self.sampler.stop()
        old, self.source = self.source, source
        self.sampler.source = source
        self.sampler.start()
        try:
            old.close()
        except Exception as e:
            self._contain("close", e)

    def busy_elsewhere(self) -> bool:
        """A cell is running on another thread (a widget click during a cell)."""
        p = self._pending
        return p is not None and p.thread_id != threading.get_ident()

    # -- on-demand work (main thread) --------------------------------------------------------
    def out_entries(self) -> dict[int, Any]:
        oh = self.shell.user_ns.get("_oh")
        return dict(oh) if isinstance(oh, dict) else {}

    def scan(self, include_gc: bool = False) -> list[Holder]:
        return Scanner().scan(self.shell.user_ns, output_cache=self.out_entries(),
                              last_exception=last_exception_objects(
                                  self.shell, self.last_cell_exception),
                              include_gc=include_gc,
                              hidden=getattr(self.shell, "user_ns_hidden", None))

    def cleanup(self, request: cleanup.CleanupRequest) -> cleanup.CleanupReport:
        if self.busy_elsewhere():
            raise RuntimeError("a cell is running; cleanup waits until it finishes")
        return cleanup.run(request, shell=self.shell, measure=self.read,
                           cell_exception=self.last_cell_exception)


def error_text(result: Any) -> str:
    if result is None:
        return ""
    err = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
    return f"{type(err).__name__}: {err}"[:200] if err is not None else ""
