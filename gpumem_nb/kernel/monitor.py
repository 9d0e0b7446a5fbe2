"""One loaded extension's engine: ``Monitor`` builds its parts and answers for them.

Deliberately free of IPython imports: the shell is used only through the attributes every
IPython shell has (``user_ns``, ``displayhook``, ``execution_count``), so this is testable with
a real shell or a stand-in. Event callbacks are bound methods of ``Monitor`` so unload can
unregister those exact objects.

The parts, one job to a file: ``readings`` (the sources' start and bounded reads), ``cells``
(every cell's measurement: the hooks and ``%%gpumem``), ``feeds`` (what the chart draws, and
the chart), ``settings`` (the settings' one writer), ``traces`` (the session recording and
the latest traced cell), and the failure log (``contain``). Callers use the queries below,
not the parts.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from .. import cleanup
from .._version import __version__
from ..analysis import AccumulationTracker
from ..cellnames import CellNames
from ..cudastart import CudaStartWatch
from ..holders import CellException, Scanner, last_exception_objects, output_cache_names
from ..holders.retention import Outcome, RootContext
from ..model import (
    STATUS_NO_NVML,
    CellMark,
    CellRecord,
    CellStart,
    Holder,
    Sample,
    SourceStatus,
    Verdict,
)
from ..oom import OomExplanation, OomWatch
from ..records import History
from ..sampler import Sampler
from ..settings import Config, DeviceChoice
from ..sources import Source, gate
from ..sources.torch.source import TorchSource
from ..units import format_bytes, shown_name
from .callbacks import CellCallbacks
from .cells import CellRecorder
from .configure import UNCHANGED, LiveSettings, SettingsListener, _Keep
from .contain import FailureLog
from .feeds import ChartFeeds, Replay
from .measure import Measured, TraceAsk
from .readings import ON_DEMAND_READ_TIMEOUT_S, Readings
from .traces import TraceState

if TYPE_CHECKING:
    from ..cluster import Collector
    from ..cluster.feed import ClusterFeed
    from ..session import SessionRecorder
    from ..trace.recorder import TraceResult

__all__ = [
    "REPLAY_ENV",
    "SHELL_ATTR",
    "UNCHANGED",
    "Monitor",
    "current_monitor",
    "make_source",
    "replay_request",
]

REPLAY_ENV = "GPUMEM_NB_REPLAY"
# Unload judges the cells still queued (verdicts included) for at most this long; any left
# after it are recorded unjudged. Nothing queued is dropped.
UNLOAD_JUDGE_S = 0.5
MAX_LOAD_FRAMES = 100  # the stack searched, at load, for the cell running %load_ext
# The shell attribute holding its loaded monitor: %reload_ext (which reloads only the
# package's top module, then calls unload and load) finds exactly what the last load set up.
SHELL_ATTR = "_gpumem_nb_monitor"


def make_source() -> Source:
    from ..sources.live import LiveSource

    return LiveSource()


def replay_request() -> str | None:
    """What ``GPUMEM_NB_REPLAY`` asks the chart to replay: None, "bundled" or a path."""
    value = os.environ.get(REPLAY_ENV, "").strip()
    if not value or value in ("0", "off"):
        return None
    return "bundled" if value in ("1", "bundled") else value


def current_monitor(shell: object = None) -> Monitor | None:
    """The monitor loaded in ``shell`` (by default the running IPython shell), if any."""
    if shell is None:
        # IPython's own registry of the running shell; with IPython not imported there is
        # no shell, and nothing loaded.
        ipython = sys.modules.get("IPython")
        get_ipython = getattr(ipython, "get_ipython", None)
        shell = get_ipython() if callable(get_ipython) else None
    return getattr(shell, SHELL_ATTR, None) if shell is not None else None


class Monitor:
    """Everything one loaded extension owns, built from its parts."""

    def __init__(self, shell: Any, source: Source | None = None,
                 history: History | None = None, config: Config | None = None,
                 session_keys: set[str] | None = None,
                 starting_devices: Sequence[DeviceChoice] = ()) -> None:
        self.shell = shell
        self.failures = FailureLog()
        config = config if config is not None else Config()
        self.settings = LiveSettings(config, self.failures, gpu_count=self.gpu_count,
                                     apply=self._apply_settings, session_keys=session_keys,
                                     starting_devices=starting_devices)
        self.config = self.settings.config
        self.source: Source = source if source is not None else make_source()
        # The one allocator handle: cleanup, peak resets and summaries all go through it.
        self.torch: TorchSource = getattr(self.source, "torch", None) or TorchSource()
        self.read_gate = gate.LIVE
        self.sampler = Sampler(self.source, interval_s=self.config.interval_s,
                               gate=self.read_gate)
        self.readings = Readings(self.source, self.sampler, self.read_gate, self.failures)
        self.feeds = ChartFeeds(self.sampler, lambda: self.config.interval_s, self.failures)
        self.traces = TraceState()
        self.tracker = AccumulationTracker(self.config.threshold_bytes)
        self.started_t_s = time.monotonic()
        self.last_scan_graph = (0.0, 0)  # the last scan's time in autograd graphs, nodes walked
        self.last_search: Outcome | None = None  # the last retention search, if one ran
        self.oom = OomWatch(self)  # explains a CUDA OOM in the cell that hit it
        # The what-if line a recorded session or a traced cell adds to an explanation.
        self.oom.extra_lines = self.traces.oom_lines
        self.cuda_start = CudaStartWatch(self.torch, shell)  # the cell that started CUDA
        self.cells = CellRecorder(
            shell, config=self.config, readings=self.readings, sampler=self.sampler,
            history=history if history is not None else History(), tracker=self.tracker,
            torch=self.torch, oom=self.oom, cuda_start=self.cuda_start,
            failures=self.failures, traces=self.traces, scan=self.scan)
        self.cells.select_devices(self.config.device)  # checked against the GPU count later
        self.traces.cell_number = self.cells.running_cell_number  # when a recording began

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> str:
        start_note = self.readings.start_source()
        try:
            self.cuda_start.on_load(in_cell=self._loaded_in_cell())
            self.cuda_start.arm()
        except Exception as e:
            self.contain("CUDA start watch", e)
        try:  # torch imported already: the OOM observer waits on CUDA's start-up
            self.oom.arm()
        except Exception as e:
            self.contain("OOM explainer", e)
        if not start_note:  # the GPU count is not known before NVML answers
            index = self.settings.check_starting_device()
            if not isinstance(index, _Keep):
                self.cells.select_devices(index)
        self.sampler.add_listener(self.cells.on_sample)
        self.sampler.start()
        request = replay_request()
        replay_note = ""
        if request is not None:
            try:
                self.start_replay(request)
                replay_note = (f" The chart replays {self.replay.label if self.replay else ''}"
                               " (GPUMEM_NB_REPLAY); your cells are measured live.")
            except (OSError, ValueError) as e:
                replay_note = f" {REPLAY_ENV}={request} ignored: {e}."
        if start_note:
            return f"gpumem_nb {__version__}: {start_note} %gpumem? for help." + replay_note
        return self.status_line() + replay_note

    def _loaded_in_cell(self) -> bool:
        """Whether a cell is running this load (``%load_ext``), not the kernel's start-up:
        a frame of some cell's code is on the stack."""
        names = CellNames.of(self.shell)
        frame: FrameType | None = sys._getframe(1)
        for _ in range(MAX_LOAD_FRAMES):
            if frame is None:
                return False
            if names.is_cell_file(frame.f_code.co_filename):
                return True
            frame = frame.f_back
        return False

    @property
    def cell_callbacks(self) -> CellCallbacks:
        """The user's per-cell callbacks (``gpumem_nb.on_cell``)."""
        return self.cells.cell_callbacks

    def shutdown(self) -> None:
        self.cells.cell_callbacks.clear()  # the user's callbacks go with this load
        # The noted cell exception keeps the failed call's frames (and their tensors): an
        # unloaded monitor that something still references (a widget, a user's variable, a
        # cycle the collector has not reached) must not keep them past the shell's own record.
        self.last_cell_exception.release()
        self.readings.cancel_start()
        self.feeds.close()
        self.oom.close()
        self.cuda_start.close()
        self.traces.close()
        self.sampler.remove_listener(self.cells.on_sample)
        self.sampler.stop()
        # Cells the sampler has not judged yet (the one run just before %reload_ext, a Run
        # All's last few) are recorded and judged now: the next load keeps the history.
        try:
            self.cells.finish_queue(UNLOAD_JUDGE_S)
        except Exception as e:
            self.contain("unload", e)
        self.feeds.drop_chart()
        try:
            self.source.close()
        except Exception as e:
            self.contain("close", e)

    def status_line(self) -> str:
        st = self.source.status()
        head = f"gpumem_nb {__version__}"
        if not st.has_gpu:
            return f"{head}: no GPU visible: {st.nvml}; tracking host RAM. %gpumem? for help."
        latest = self.sampler.latest() or self.read()
        names = ", ".join(
            f"{d.index}: {shown_name(d.nvml.name or 'GPU')} {format_bytes(d.nvml.total_bytes)}"
            for d in latest.devices if d.nvml is not None and d.nvml.status != STATUS_NO_NVML
        )
        if not names and latest.devices and all(
                d.nvml is not None and d.nvml.status == STATUS_NO_NVML for d in latest.devices):
            gpus = f"{st.gpu_count} GPU" + ("s" if st.gpu_count != 1 else "")
            return (f"{head}: watching {gpus} through PyTorch's allocator; NVML is "
                    f"unavailable ({st.nvml}), so its columns are unknown. %gpumem? for help.")
        if not names:  # NVML hangs or failed: say so rather than name no GPU
            gpus = f"{st.gpu_count} GPU" + ("s" if st.gpu_count != 1 else "")
            why = self.read_problem or "NVML gave no reading; its columns show as unknown."
            return f"{head}: watching {gpus}; {why} %gpumem? for help."
        return f"{head}: watching GPU {names}. %gpumem? for help."

    def contain(self, where: str, e: BaseException) -> None:
        """Log a failure of ``where`` once per kind, never raising (the failure log)."""
        self.failures.contain(where, e)

    # -- the shell's hooks (bound methods: unload unregisters these very objects) -------------
    def pre_run_cell(self, info: object) -> None:
        self.cells.pre_run_cell(info)

    def post_run_cell(self, result: object) -> None:
        self.cells.post_run_cell(result)

    # -- queries -------------------------------------------------------------------------------
    @property
    def history(self) -> History:
        """Every finished cell's record: reading it records any cell still queued."""
        self.flush()
        return self.cells.history

    def flush(self) -> None:
        """Record every finished cell now (before anything reads the history on demand)."""
        self.cells.flush()

    @property
    def verdicts(self) -> deque[Verdict]:
        return self.cells.verdicts

    @property
    def marks(self) -> deque[CellMark]:
        return self.cells.marks

    @property
    def on_record(self) -> list[Callable[[CellRecord, Verdict | None], None]]:
        return self.cells.on_record

    @property
    def after_cell(self) -> list[Callable[[], None]]:
        return self.cells.after_cell

    @property
    def last_cell_exception(self) -> CellException:
        return self.cells.last_cell_exception

    def marks_for_picture(self, last: int) -> list[CellMark]:
        return self.cells.marks_for_picture(last)

    @property
    def running_execution_count(self) -> int | None:
        return self.cells.running_execution_count

    @property
    def cell_running(self) -> bool:
        return self.cells.cell_running

    def busy_elsewhere(self) -> bool:
        return self.cells.busy_elsewhere()

    def cell_start(self, device: int) -> CellStart | None:
        return self.cells.cell_start(device)

    @property
    def session(self) -> SessionRecorder | None:
        """The session recording (``%gpumem record``), once made; kept across
        ``%reload_ext`` by the extension."""
        return self.traces.session

    @session.setter
    def session(self, recorder: SessionRecorder | None) -> None:
        self.traces.session = recorder

    @property
    def last_trace(self) -> TraceResult | None:
        """The latest ``%%gpumem --trace`` result with a snapshot, for ``%gpumem whatif``."""
        return self.traces.last_trace

    @last_trace.setter
    def last_trace(self, traced: TraceResult | None) -> None:
        self.traces.last_trace = traced

    def session_recorder(self) -> SessionRecorder:
        """The session recording, made on first use (``%gpumem record``)."""
        return self.traces.recorder()

    def measure(self, source: str, run: Callable[[], object], *, reset_peak: bool,
                trace: TraceAsk | None = None, quiet: bool = False) -> Measured:
        """Measure a ``%%gpumem`` cell (``CellRecorder.measure``)."""
        return self.cells.measure(source, run, reset_peak=reset_peak, trace=trace,
                                  quiet=quiet)

    def show_explanations_with(self, show: Callable[[object], object]) -> None:
        """How the OOM explainer shows an explanation (IPython's display, in a notebook)."""
        self.oom.show = show

    def start_sampling(self) -> float:
        """Start the background sampler (idempotent); the interval it samples at."""
        self.sampler.start()
        return self.sampler.interval_s

    def stop_sampling(self, timeout_s: float = 1.0) -> None:
        """Stop the background sampler (cells are still recorded)."""
        self.sampler.stop(timeout_s=timeout_s)

    @property
    def sampling(self) -> bool:
        return self.sampler.running

    def last_oom(self) -> OomExplanation | None:
        """The last CUDA OOM explained in this session, if any."""
        return self.oom.last

    def no_oom_line(self) -> str:
        """The sentence for "no OOM yet", with the explainer's state."""
        return self.oom.no_oom_line()

    def observer_line(self, has_gpu: bool) -> str:
        """Whether PyTorch's OOM observer, which makes an explanation exact, is attached
        (``has_gpu``: from the status the caller already read)."""
        return self.oom.observer_line(has_gpu)

    def sampler_errors(self) -> tuple[int, str]:
        """How many errors the sampler hit (logged once when they happened), and the last."""
        return sum(self.sampler.errors.values()), self.sampler.last_error

    def cuda_start_line(self) -> str:
        """Where CUDA started, in one line ("" until known)."""
        return self.cuda_start.line()

    def ledger_pools(self, holders: Sequence[Holder]) -> dict[int, tuple[tuple[str, int], ...]]:
        """The memory pools ``holders`` own (the OOM explainer's reading), for the ledgers
        of who and cleanup."""
        return self.oom.ledger_pools(holders)

    def oom_counts(self) -> dict[int, int]:
        """OOMs per device that PyTorch's own counters do not count (cudaMallocAsync's)."""
        return self.oom.counts

    def memory_summary(self, device: int) -> str:
        """``torch.cuda.memory_summary`` for ``device``."""
        return self.torch.memory_summary(device)

    # -- readings ------------------------------------------------------------------------------
    def read(self, timeout_s: float = ON_DEMAND_READ_TIMEOUT_S, *,
             contain: bool = True) -> Sample:
        """A full reading, bounded in time (``Readings.read``)."""
        return self.readings.read(timeout_s, contain=contain)

    @property
    def read_problem(self) -> str:
        """Why the last on-demand reading is partial, in one line; "" when it was whole."""
        return self.readings.problem

    def read_hot(self) -> Sample:
        return self.readings.read_hot()

    def nvml_latest(self) -> Sample | None:
        return self.readings.nvml_latest()

    def status(self) -> SourceStatus:
        return self.readings.status()

    def gpu_count(self) -> int:
        return self.status().gpu_count

    def learn_child_roles(self) -> None:
        self.readings.learn_child_roles()

    # -- settings ------------------------------------------------------------------------------
    def check_device(self, index: object) -> int | None:
        return self.settings.check_device(index)

    def configure(self, *, interval_s: float | None = None,
                  threshold_bytes: int | None = None,
                  device: int | _Keep | None = UNCHANGED, peak: str | None = None,
                  auto_show: bool | None = None, save: bool = False) -> Config:
        """Change settings through their one writer (``LiveSettings.configure``)."""
        return self.settings.configure(interval_s=interval_s, threshold_bytes=threshold_bytes,
                                       device=device, peak=peak, auto_show=auto_show,
                                       save=save)

    @property
    def settings_listeners(self) -> list[SettingsListener]:
        return self.settings.listeners

    @property
    def session_keys(self) -> set[str]:
        return self.settings.session_keys

    @property
    def saved_keys(self) -> tuple[str, ...]:
        return self.settings.saved_keys

    @property
    def save_note(self) -> str:
        return self.settings.save_note

    def _apply_settings(self, new: Config, old: Config) -> None:
        if new.interval_s != old.interval_s:
            self.sampler.interval_s = new.interval_s  # wakes the thread: re-planned at once
            if self.replay is not None:
                self.replay.sampler.interval_s = new.interval_s
        self.tracker.threshold_bytes = new.threshold_bytes
        if new.device != old.device:
            self.cells.select_devices(new.device)

    # -- the chart's feeds ---------------------------------------------------------------------
    @property
    def feed(self) -> Sampler:
        """What the chart draws: the live sampler, or a replay's own sampler."""
        return self.feeds.feed

    @property
    def replay(self) -> Replay | None:
        return self.feeds.replay

    @property
    def widget(self) -> Any:
        """The chart shown, if any."""
        return self.feeds.widget

    @widget.setter
    def widget(self, chart: Any) -> None:
        self.feeds.widget = chart

    @property
    def compact(self) -> Any:
        """The compact reading shown, if any (``%gpumem watch --compact``)."""
        return self.feeds.compact

    @compact.setter
    def compact(self, reading: Any) -> None:
        self.feeds.compact = reading

    @property
    def cluster_feed(self) -> ClusterFeed | None:
        return self.feeds.cluster_feed

    def start_replay(self, name: str) -> Replay:
        return self.feeds.start_replay(name)

    def stop_replay(self) -> None:
        self.feeds.stop_replay()

    def end_chart(self) -> bool:
        return self.feeds.end_chart()

    def on_shell_exit(self, change: Mapping[str, object]) -> None:
        """The shell is exiting (a kernel shutdown or restart, or ``exit``): end the chart
        while the kernel can still reach the browser, so its outputs become its picture."""
        if change.get("new"):
            self.feeds.drop_chart(kernel_exiting=True)
            self.feeds.drop_compact(kernel_exiting=True)

    def cluster_collector(self, client: object, factory: Callable[[object], Collector]
                          ) -> Collector:
        return self.feeds.cluster_collector(client, factory)

    def start_cluster_feed(self, collector: Collector) -> ClusterFeed:
        return self.feeds.start_cluster_feed(collector)

    def stop_cluster_feed(self) -> bool:
        return self.feeds.stop_cluster_feed()

    # -- on-demand work (main thread) --------------------------------------------------------
    def out_entries(self) -> dict[int, Any]:
        oh = self.shell.user_ns.get("_oh")
        return dict(oh) if isinstance(oh, dict) else {}

    def scan(self, include_gc: bool = False,
             graph_budget_s: float | None = None,
             rest_min_bytes: int | None = None,
             allocated_bytes: int | None = None) -> list[Holder]:
        """The session's holders: the fast walk from the names; with ``include_gc`` the
        retention search for every GPU tensor it did not reach, with ``rest_min_bytes`` only
        when those come to that much (the OOM explainer's 2%)."""
        scanner = Scanner() if graph_budget_s is None else Scanner(graph_budget_s=graph_budget_s)
        ns = self.shell.user_ns
        stored = last_exception_objects(self.shell, self.last_cell_exception)
        hidden = getattr(self.shell, "user_ns_hidden", None)
        roots = self._root_context(stored) if include_gc or rest_min_bytes is not None \
            else None
        holders = scanner.scan(ns, output_cache=self.out_entries(), last_exception=stored,
                               include_gc=include_gc, hidden=hidden,
                               rest_min_bytes=rest_min_bytes, roots=roots,
                               allocated_bytes=allocated_bytes)
        self.last_scan_graph = (scanner.graph_s, scanner.graph_nodes)
        self.last_search = scanner.search
        return holders

    def check_cuts(self, holders: Sequence[Holder], lines: Mapping[str, str],
                   budget_s: float | None = None) -> list[Holder]:
        """The holders, each advised ``del`` line in ``lines`` checked against the retention
        graph (``holders/verify.py``): what else keeps the bytes joins the line."""
        stored = last_exception_objects(self.shell, self.last_cell_exception)
        return Scanner().check_cuts(holders, lines, self._root_context(stored), budget_s)

    def _root_context(self, stored: Sequence[object]) -> RootContext:
        """Where the retention search's roots are in this shell: the namespace, ``Out`` and
        its names, the shell, the stored exceptions."""
        ns = self.shell.user_ns
        hidden = getattr(self.shell, "user_ns_hidden", None)
        oh = ns.get("_oh")
        out = oh if isinstance(oh, dict) else {}
        return RootContext(
            user_ns=ns, out=out, shell=self.shell,
            output_names=frozenset(output_cache_names(ns, dict(out), hidden)),
            stored_exceptions=[e for e in stored if isinstance(e, BaseException)])

    def cleanup(self, request: cleanup.CleanupRequest, on_interrupt: Callable[
            [cleanup.CleanupReport], None] | None = None) -> cleanup.CleanupReport:
        """``cleanup.run``; a Ctrl-C that stops it hands ``on_interrupt`` the report of
        what was done until then, and goes on."""
        if self.busy_elsewhere():
            raise RuntimeError("a cell is running; cleanup waits until it finishes")
        try:
            return cleanup.run(request, shell=self.shell,
                               measure=lambda: self.read(contain=False),
                               cell_exception=self.last_cell_exception,
                               on_interrupt=on_interrupt)
        finally:
            self.cells.forget_baseline()  # cleanup changed the allocator: read afresh
