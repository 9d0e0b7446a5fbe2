"""One loaded extension's state: sources, sampler, history, cell hooks, cleanup.

Deliberately free of IPython imports: the shell is used only through the attributes every
IPython shell has (``user_ns``, ``displayhook``, ``execution_count``), so this is testable with
a real shell or a stand-in. Event callbacks are bound methods of ``Monitor`` so unload can
unregister those exact objects.

Hooks never raise: IPython prints a traceback for every cell whose callback fails, so each hook
body is contained and its error logged once.
"""

from __future__ import annotations

import contextvars
import enum
import hashlib
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import FrameType
from typing import Any

from . import __version__, cleanup, userexc
from .analysis import (
    AccumulationTracker,
    Watermark,
    build_record,
    complete_nvml,
    top_holders,
    verdict_message,
)
from .cudastart import CudaStartWatch, launcher_refusal, refusal_advice
from .errtext import error_str, one_read_per_error
from .holders import CellException, Scanner, last_exception_objects, output_cache_names
from .holders.retention import Outcome, RootContext
from .model import (
    CAUSE_LIVE_TENSORS,
    CellMark,
    CellRecord,
    CellStart,
    Holder,
    Sample,
    SourceStatus,
    Verdict,
)
from .oom import OomWatch, first_line
from .records import History
from .sampler import Sampler
from .settings import (
    CHECKS,
    PEAK_RESET,
    Config,
    DeviceChoice,
    SettingsError,
    bad_setting_line,
    check_auto_show,
    check_device,
    check_interval_s,
    check_peak,
    check_threshold_bytes,
    instead_words,
    save_config,
    show_value,
)
from .sources import Source, gate
from .sources.processes import roles_to_learn
from .sources.torch import TorchSource
from .units import format_bytes, shown_name

log = logging.getLogger("gpumem_nb")

REPLAY_ENV = "GPUMEM_NB_REPLAY"
# After a cell, the sampler ticks this much later, once the kernel has sent the reply.
AFTER_CELL_TICK_DELAY_S = 0.05
ON_DEMAND_READ_TIMEOUT_S = 1.0
# Finished cells waiting for the sampler's reading: past this many (a hung NVML call, a
# stopped thread), the oldest are recorded at once with NVML's "after" unknown.
MAX_QUEUED_CELLS = 64
# Unload judges the cells still queued (verdicts included) for at most this long; any left
# after it are recorded unjudged. Nothing queued is dropped.
UNLOAD_JUDGE_S = 0.5
# How long %load_ext waits for the sources to start. NVML's start (nvmlInit, then counting
# the devices) takes milliseconds, or, with a wedged driver, forever: it runs on a helper
# thread, and the load answers after this long at most, NVML's figures unknown until then.
START_WAIT_S = 1.5
MAX_LOAD_FRAMES = 100  # the stack searched, at load, for the cell running %load_ext


class _Keep(enum.Enum):
    UNCHANGED = "unchanged"


# ``configure(device=...)``'s default: None already means "every GPU".
UNCHANGED = _Keep.UNCHANGED

SettingsListener = Callable[[Config], None]


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
    selection: int = 0  # Monitor._selections when it started


@dataclass
class _Done:
    """A finished cell, before the sampler's next reading completes it."""

    pending: _Pending
    after: Sample
    count: int | None
    error: str
    context: contextvars.Context
    record: CellRecord | None = None  # set once recorded


@dataclass
class Replay:
    """A recording driving the chart, and only the chart: a demonstration of what the chart
    shows on a GPU. The user's own cells stay measured from the live sources."""

    label: str
    source: Any
    sampler: Sampler


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
    # surrogatepass: a cell holding a lone surrogate (pasted binary) still gets its key
    return "src:" + hashlib.sha1(raw.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def make_source() -> Source:
    from .sources.live import LiveSource

    return LiveSource()


def replay_request() -> str | None:
    """What ``GPUMEM_NB_REPLAY`` asks the chart to replay: None, "bundled" or a path."""
    value = os.environ.get(REPLAY_ENV, "").strip()
    if not value or value in ("0", "off"):
        return None
    return "bundled" if value in ("1", "bundled") else value


class Monitor:
    """Everything one loaded extension owns, and the one owner of its settings."""

    def __init__(self, shell: Any, source: Source | None = None,
                 history: History | None = None, config: Config | None = None,
                 session_keys: set[str] | None = None,
                 starting_devices: Sequence[DeviceChoice] = ()) -> None:
        self.shell = shell
        self.config = config if config is not None else Config()
        _repair(self.config)
        # Where the starting device was set, and the sources' next choices (settings.merge):
        # checked once NVML answers.
        self._starting_devices = tuple(starting_devices)
        self.source: Source = source if source is not None else make_source()
        # The one allocator handle: cleanup, peak resets and summaries all go through it.
        self.torch: TorchSource = getattr(self.source, "torch", None) or TorchSource()
        # Live readings take the process's gate: while one hangs (a wedged NVML), no other
        # reading joins it on another thread (sources/gate.py).
        self.read_gate = gate.LIVE
        self.sampler = Sampler(self.source, interval_s=self.config.interval_s,
                               gate=self.read_gate)
        self._history = history if history is not None else History()
        self.tracker = AccumulationTracker(self.config.threshold_bytes)
        self.verdicts: deque[Verdict] = deque(maxlen=100)
        self.marks: deque[CellMark] = deque(maxlen=10_000)
        self.replay: Replay | None = None
        # configure() is the one writer of interval, threshold and device selection.
        self.settings_listeners: list[SettingsListener] = []
        self._settings_lock = threading.Lock()
        # The settings configure() changed in this session: since the kernel started, not
        # since this load (the shell keeps the set across %reload_ext, as it keeps the
        # config). A bare save writes them: after ``config --threshold 1GB`` and a reload,
        # the 1 GB in force is what the user means to keep.
        self.session_keys: set[str] = session_keys if session_keys is not None else set()
        self.saved_keys: tuple[str, ...] = ()  # what the latest save wrote
        self.save_note = ""  # a note on the latest save (it went without the lock)
        self.on_record: list[Callable[[CellRecord, Verdict | None], None]] = []
        # Work asked for while a top-level cell ran, to do once it ends, on the cell's own
        # thread (the chart's cleanup button, when a click reaches the kernel mid-cell).
        self.after_cell: list[Callable[[], None]] = []
        # The exception the user's latest failing cell raised, while the shell keeps it: only
        # that one is a holder or offered to cleanup (a widget handler's is not, issue 7).
        self.last_cell_exception = CellException()
        self._depth = 0
        self._pending: _Pending | None = None
        self._watermarks: list[Watermark] = []
        self._errors: set[str] = set()
        # The allocator's state when no cell runs: the last cell's "after", refreshed by the
        # sampler between cells. The next cell's "before" reuses it instead of reading cold.
        self._baseline: Sample | None = None
        self._baseline_lock = threading.Lock()
        # Records whose NVML "after" figures the sampler's next reading will fill in.
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
        self._apply_device(self.config.device)  # checked against the GPU count in start()
        self.widget: Any = None
        self.read_problem = ""  # why the last on-demand reading is partial, for the magics
        self.started_t_s = time.monotonic()
        self.last_scan_graph = (0.0, 0)  # the last scan's time in autograd graphs, nodes walked
        self.last_search: Outcome | None = None  # the last retention search, if one ran
        self.oom = OomWatch(self)  # explains a CUDA OOM in the cell that hit it
        self.last_trace: Any = None  # the latest %%gpumem --trace result, for %gpumem whatif
        self.cuda_start = CudaStartWatch(self.torch, shell)  # the cell that started CUDA
        # %gpumem cluster / watch --cluster: the collector of the user's client, and the feed
        # polling it for the chart (gpumem_nb.cluster; imported only when asked for).
        self._cluster_collector: Any = None
        self.cluster_feed: Any = None
        # The exception a launcher refusal was explained for in this top-level cell (a nested
        # cell's error can reach its outer cell's result too): advised once. By id: holding
        # the exception would hold its frames' tensors.
        self._advised_id: int | None = None
        self._start_cancelled = threading.Event()
        self._start_thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> str:
        start_note = self._start_source()
        try:
            self.cuda_start.on_load(in_cell=self._loaded_in_cell())
            self.cuda_start.arm()
        except Exception as e:
            self._contain("CUDA start watch", e)
        try:  # torch imported already: the OOM observer waits on CUDA's start-up
            self.oom.arm()
        except Exception as e:
            self._contain("OOM explainer", e)
        if not start_note:
            self._check_starting_device()  # the GPU count is not known before NVML answers
        self.sampler.add_listener(self._on_sample)
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

    def _start_source(self) -> str:
        """Start the sources on a helper thread, waiting ``START_WAIT_S`` at most; "" when
        they answered, else the sentence saying why NVML's figures are unknown for now.

        The helper takes the read gate, so while its start hangs no reading joins it on
        another thread, and a reload while it hangs adds no second stuck start: the new
        helper waits at the gate, and leaves when its monitor is unloaded.
        """
        done = threading.Event()
        begin = getattr(self.source, "begin_start", None)
        if callable(begin):
            begin()

        def work() -> None:
            try:
                while not self._start_cancelled.is_set():
                    if self.read_gate.wait_free(0.2) and self.read_gate.enter(wait_s=0.0):
                        if not self._start_cancelled.is_set():
                            break
                        # Unloaded while it waited: the gate freed as NVML answered. Before,
                        # each such start ran on its closed source, an nvmlInit never
                        # balanced (20 reloads during a hang: 21 inits, 2 shutdowns).
                        self.read_gate.leave()
                        return
                else:
                    return
                try:
                    self.source.start()
                except Exception as e:
                    self._contain("start", e)
                finally:
                    self.read_gate.leave()
            finally:
                done.set()

        self._start_thread = threading.Thread(target=work, name="gpumem_nb-start",
                                              daemon=True)
        self._start_thread.start()
        # A reading already hung inside the gate (a reload while NVML hangs): the start
        # waits behind it, and the load does not.
        hung_before = self.read_gate.hung_s()
        if done.wait(0.0 if hung_before is not None else START_WAIT_S):
            self._start_thread.join()
            self._start_thread = None
            return ""
        if hung_before is not None:
            return (f"a reading of the GPUs has not returned for {hung_before:.1f} s (NVML "
                    "hangs); NVML's figures show as unknown until it does.")
        return (f"NVML has not answered its start for {START_WAIT_S:g} s (a wedged driver, "
                "or a GPU off the bus, can do this); its figures show as unknown until it "
                "does.")

    def _loaded_in_cell(self) -> bool:
        """Whether a cell is running this load (``%load_ext``), not the kernel's start-up:
        a frame of some cell's code is on the stack."""
        table = getattr(getattr(self.shell, "compile", None), "_filename_map", None)
        if not isinstance(table, dict):
            return False
        frame: FrameType | None = sys._getframe(1)
        for _ in range(MAX_LOAD_FRAMES):
            if frame is None:
                return False
            if frame.f_code.co_filename in table:
                return True
            frame = frame.f_back
        return False

    def shutdown(self) -> None:
        # The noted cell exception keeps the failed call's frames (and their tensors): an
        # unloaded monitor that something still references (a widget, a user's variable, a
        # cycle the collector has not reached) must not keep them past the shell's own record.
        self.last_cell_exception.release()
        self._start_cancelled.set()  # a start still waiting at the gate gives up
        self.stop_cluster_feed()
        self._close_cluster_collector()
        self.stop_replay()
        self.oom.close()
        self.cuda_start.close()
        self.sampler.remove_listener(self._on_sample)
        self.sampler.stop()
        # Cells the sampler has not judged yet (the one run just before %reload_ext, a Run
        # All's last few) are recorded and judged now: the next load keeps the history.
        try:
            self._finish_queue(UNLOAD_JUDGE_S)
        except Exception as e:
            self._contain("unload", e)
        self._drop_widget()
        try:
            self.source.close()
        except Exception as e:
            self._contain("close", e)

    def status_line(self) -> str:
        st = self.source.status()
        head = f"gpumem_nb {__version__}"
        if not st.has_gpu:
            return f"{head}: no GPU visible ({st.nvml}); tracking host RAM. %gpumem? for help."
        latest = self.sampler.latest() or self.read()
        names = ", ".join(
            f"{d.index}: {shown_name(d.nvml.name or 'GPU')} {format_bytes(d.nvml.total_bytes)}"
            for d in latest.devices if d.nvml is not None
        )
        if not names:  # NVML hangs or failed: say so rather than name no GPU
            gpus = f"{st.gpu_count} GPU" + ("s" if st.gpu_count != 1 else "")
            why = self.read_problem or "NVML gave no reading; its columns show as unknown."
            return f"{head}: watching {gpus}; {why} %gpumem? for help."
        return f"{head}: watching GPU {names}. %gpumem? for help."

    def _contain(self, where: str, e: BaseException) -> None:
        # Keyed by the kind of failure, not its text: a message carrying a timestamp would
        # otherwise print a new "reported once" line in every cell.
        # The error may be a user's (a listener's, a hostile object's): its text is read
        # through userexc, never by logging (which would run its __str__ unguarded).
        key = f"{where}: {userexc.type_name(e)}"
        if key not in self._errors:
            self._errors.add(key)
            log.warning("gpumem_nb %s failed (reported once): %s", where, userexc.text(e))

    def _apply_device(self, index: int | None) -> None:
        with self._baseline_lock:
            self._selections += 1
            self._selection_t_s = time.monotonic()
            if hasattr(self.source, "selected"):
                self.source.selected = None if index is None else [index]
            self._baseline = None  # other devices now: read them afresh
        self.sampler.request_tick()

    # -- the chart's feed: live, or a replay kept apart ---------------------------------------
    @property
    def feed(self) -> Sampler:
        """What the chart draws: the live sampler, or a replay's own sampler."""
        return self.replay.sampler if self.replay is not None else self.sampler

    def start_replay(self, name: str) -> Replay:
        """Drive the chart from a recording ("bundled" or a file, ``~`` its owner's home, from
        the magic or GPUMEM_NB_REPLAY); the hooks stay live."""
        from .sources.replay import ReplaySource

        source = ReplaySource.from_file(None if name == "bundled" else os.path.expanduser(name))
        source.start()
        self.stop_replay()
        sampler = Sampler(source, interval_s=self.config.interval_s)
        self.replay = Replay(label=source.status().nvml, source=source, sampler=sampler)
        sampler.start()
        self._drop_widget()
        return self.replay

    def stop_replay(self) -> None:
        replay, self.replay = self.replay, None
        if replay is None:
            return
        replay.sampler.stop()
        try:
            replay.source.close()
        except Exception as e:
            self._contain("close", e)
        self._drop_widget()

    def end_chart(self) -> bool:
        """End the chart, if one is shown: its outputs become its static picture (with the
        numbers), and its widgets close. False when there was none."""
        had = self.widget is not None
        self._drop_widget()
        return had

    def on_shell_exit(self, change: Any) -> None:
        """The shell is exiting (a kernel shutdown or restart, or ``exit``): end the chart
        while the kernel can still reach the browser, so its outputs become its picture."""
        if change.get("new"):
            self._drop_widget(kernel_exiting=True)

    # -- a cluster beside the kernel ---------------------------------------------------------
    def cluster_collector(self, client: Any, factory: Callable[[Any], Any]) -> Any:
        """The collector for ``client``, kept while it is the same client (it remembers the
        workers it has seen, so a silent scheduler's rows still have names)."""
        current = self._cluster_collector
        if current is None or getattr(current, "client", None) is not client:
            self.stop_cluster_feed()
            self._close_cluster_collector()
            current = self._cluster_collector = factory(client)
        return current

    def start_cluster_feed(self, collector: Any) -> Any:
        """Poll ``collector`` for the chart's cluster lines (``%gpumem watch --cluster``).
        The feed lives with the chart: ending the chart, or the sampler, ends it too."""
        from .cluster.feed import ClusterFeed

        feed = self.cluster_feed
        if feed is None or feed.collector is not collector or feed.ended:
            self.stop_cluster_feed()
            feed = self.cluster_feed = ClusterFeed(collector, lambda: self.sampler.interval_s)
        feed.start()
        return feed

    def stop_cluster_feed(self) -> bool:
        """Stop collecting for the chart; False when no feed was running."""
        feed, self.cluster_feed = self.cluster_feed, None
        if feed is None:
            return False
        try:
            running = feed.running
            feed.stop()
            return bool(running)
        except Exception as e:
            self._contain("cluster feed", e)
            return False

    def _close_cluster_collector(self) -> None:
        collector, self._cluster_collector = self._cluster_collector, None
        if collector is not None:
            try:
                collector.close()
            except Exception as e:
                self._contain("cluster collector", e)

    def _drop_widget(self, *, kernel_exiting: bool = False) -> None:
        # A chart draws one feed for its whole life; switching feeds makes a new one. The
        # cluster's lines were only for that chart: nobody reads them once it is gone.
        self.stop_cluster_feed()
        if self.widget is not None:
            try:
                if kernel_exiting:
                    self.widget.close(kernel_exiting=True)
                else:
                    self.widget.close()
            except Exception as e:
                self._contain("widget close", e)
            self.widget = None

    # -- readings ----------------------------------------------------------------------------
    def read(self, timeout_s: float = ON_DEMAND_READ_TIMEOUT_S, *,
             contain: bool = True) -> Sample:
        """A full reading, for on-demand work (status, cleanup), bounded in time.

        NVML can hang (a GPU falling off the bus, a wedged driver). The read runs on a
        helper thread; if it has not answered in ``timeout_s`` the magic goes on with the
        allocator and host figures only, and NVML's columns read as unknown. While a reading
        hangs (this one, or the sampler's), no helper is started: the answer is unknown at
        once (``sources.gate``), so there is never more than one stuck thread. A reading
        that fails does the same (``contain=False``: it raises instead, for cleanup's report
        to say why). ``read_problem`` then holds the one line a magic shows; "" otherwise.
        """
        box: list[Sample] = []
        errors: list[BaseException] = []
        t0 = time.monotonic()
        starting = self._start_thread
        if starting is not None and self.read_gate.hung_s() is None:
            starting.join(timeout_s)  # a start under way that is not (yet) taken for hung
            if not starting.is_alive():
                self._start_thread = None
        if not self.read_gate.enter(wait_s=max(timeout_s - (time.monotonic() - t0), 0.0)):
            hung = self.read_gate.hung_s()
            why = (f"a reading of the GPUs has not returned for {hung:.1f} s (NVML hangs)"
                   if hung is not None else f"NVML did not answer within {timeout_s:g} s")
            self._contain("NVML read", TimeoutError(f"{why}; its figures show as unknown"))
            return self._without_nvml(why)

        def work() -> None:
            try:
                box.append(self.source.read(processes=True))
            except BaseException as e:  # handed to the caller below
                errors.append(e)
            finally:
                self.read_gate.leave()

        worker = threading.Thread(target=work, name="gpumem_nb-read", daemon=True)
        worker.start()
        worker.join(max(timeout_s - (time.monotonic() - t0), 0.0))
        if box:
            self.read_problem = ""
            return box[0]
        if errors:
            if not contain:
                raise errors[0]
            e = errors[0]
            self._contain("read", e)
            why = f"reading the GPUs failed ({userexc.type_name(e)}: " \
                  f"{first_line(error_str(e), 120)})"
        else:
            why = f"NVML did not answer within {timeout_s:g} s"
            self._contain("NVML read", TimeoutError(f"{why}; its figures show as unknown"))
        return self._without_nvml(why)

    def _without_nvml(self, why: str) -> Sample:
        """The allocator and host figures now, NVML's unknown, and the line saying why."""
        self.read_problem = f"{why}; the columns it feeds show as unknown."
        try:
            hot = self.read_hot()
        except Exception as e:
            self._contain("read_hot", e)
            return Sample(t_s=time.monotonic(), wall_s=time.time(), rss_bytes=None)
        return replace(hot, devices=tuple(replace(d, nvml=None) for d in hot.devices))

    def status(self) -> SourceStatus:
        """The sources' status, or a plain stand-in when asking fails."""
        try:
            return self.source.status()
        except Exception as e:
            self._contain("status", e)
            return SourceStatus(nvml=f"status unavailable ({type(e).__name__})",
                                torch="unknown", gpu_count=0)

    def learn_child_roles(self) -> None:
        """On demand (main thread): when the sampler has seen children of this kernel whose
        kind is not known, ask torch's own objects which are DataLoader or launched workers
        (see ``ProcessTree.learn_roles``); the next reading names them."""
        tree = getattr(self.source, "processes", None)
        latest = self.sampler.latest()
        if tree is None or latest is None:
            return
        unknown = roles_to_learn(c for d in latest.devices if d.nvml is not None
                                 for c in d.nvml.children)
        if unknown:
            try:
                tree.learn_roles(unknown)
            except Exception as e:
                self._contain("learn_roles", e)

    def nvml_latest(self) -> Sample | None:
        """The sampler's latest reading if it is recent enough to stand for "now"; None when
        the sampler is stopped or stuck (a hung NVML call), so the figure reads as unknown
        rather than stale-as-fresh."""
        latest = self.sampler.latest()
        if latest is None or not self.sampler.running:
            return None
        stale_s = max(3 * self.sampler.interval_s, 2.0)
        return latest if time.monotonic() - latest.t_s <= stale_s else None

    def read_hot(self) -> Sample:
        """Exact allocator figures and RSS now; NVML from the sampler (see ``nvml_latest``)."""
        read_hot = getattr(self.source, "read_hot", None)
        if read_hot is None:
            return self.source.read(processes=False)
        sample: Sample = read_hot(self.nvml_latest())
        return sample

    def _on_sample(self, sample: Sample) -> None:
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

    def gpu_count(self) -> int:
        return self.status().gpu_count

    # -- settings (the monitor is their one owner) ----------------------------------------------
    def check_device(self, index: Any) -> int | None:
        """``index`` if it names a GPU this process sees (None: every GPU); else
        ``SettingsError``."""
        index = check_device(index)
        if index is None:
            return None
        try:
            n = self.gpu_count()
        except Exception as e:  # a failing source sees no GPU
            self._contain("status", e)
            n = 0
        if index >= n:
            seen = f"GPUs 0-{n - 1}" if n > 1 else ("GPU 0" if n == 1 else "no GPU")
            raise SettingsError("device", f"there is no GPU {show_value(index)}: "
                                          f"this process sees {seen}")
        return index

    def configure(
        self,
        *,
        interval_s: float | None = None,
        threshold_bytes: int | None = None,
        device: int | _Keep | None = UNCHANGED,
        peak: str | None = None,
        auto_show: bool | None = None,
        save: bool = False,
    ) -> Config:
        """Change settings: all checked first, saved first, then applied, then announced.

        A value that is refused raises ``SettingsError`` (a ``ValueError``) and changes
        nothing. ``save=True`` writes the settings file before anything is applied, so a write
        that fails (``OSError``) changes nothing either. ``device=None`` watches every GPU;
        leave it out to keep the current choice. Each of ``settings_listeners`` is then called
        with a copy of the settings; a listener that raises is reported once and never stops
        the others or this call. Returns a copy of the settings now in force.
        """
        changes: dict[str, Any] = {}
        if interval_s is not None:
            changes["interval_s"] = check_interval_s(interval_s)
        if threshold_bytes is not None:
            changes["threshold_bytes"] = check_threshold_bytes(threshold_bytes)
        if device is not UNCHANGED:
            changes["device"] = self.check_device(device)
        if peak is not None:
            changes["peak"] = check_peak(peak)
        if auto_show is not None:
            changes["auto_show"] = check_auto_show(auto_show)
        with self._settings_lock:
            new = replace(self.config, **changes)
            if save:
                # Only what this call sets (or, for a bare save, what this session set):
                # another kernel may have saved other keys since this one loaded the file.
                keys = set(changes) or self.session_keys
                saved = save_config({k: getattr(new, k) for k in sorted(keys)})
                self.saved_keys = tuple(sorted(keys - {"device"}))
                self.save_note = saved.note
            self._apply(new)
            self.session_keys |= set(changes)
            now = replace(self.config)
        self._announce(now)
        return now

    def _apply(self, new: Config) -> None:
        old = replace(self.config)
        # In place: the shell keeps this object across %reload_ext.
        for f in fields(Config):
            setattr(self.config, f.name, getattr(new, f.name))
        if new.interval_s != old.interval_s:
            self.sampler.interval_s = new.interval_s  # wakes the thread: re-planned at once
            if self.replay is not None:
                self.replay.sampler.interval_s = new.interval_s
        self.tracker.threshold_bytes = new.threshold_bytes
        if new.device != old.device:
            self._apply_device(new.device)

    def _announce(self, cfg: Config) -> None:
        for fn in list(self.settings_listeners):
            try:
                fn(replace(cfg))  # a copy each: a listener cannot change the settings behind us
            except Exception as e:
                name = getattr(fn, "__qualname__", type(fn).__name__)
                self._contain(f"settings listener {name}", e)

    def _check_starting_device(self) -> None:
        """A starting device this process does not see is reported once, naming the source
        that set it, and gives way to the next source's, then to every GPU: only once the
        sources are up is the GPU count known."""
        if self.config.device is None:
            return
        choices = self._starting_devices
        if not choices or choices[0].index != self.config.device:  # a reload: this session's
            choices = (DeviceChoice(self.config.device, "settings"),)
        refused: list[tuple[DeviceChoice, SettingsError]] = []
        chosen: DeviceChoice | None = None
        for choice in choices:
            try:
                self.check_device(choice.index)
            except SettingsError as e:
                refused.append((choice, e))
            else:
                chosen = choice
                break
        index = None if chosen is None else chosen.index
        instead = instead_words("device", index, None if chosen is None else chosen.origin)
        for choice, why in refused:
            log.warning("%s", bad_setting_line(choice.origin, why, instead))
        if refused:
            self.config.device = index
            self._apply_device(index)

    def _reset_peaks(self) -> bool:
        """Reset the allocator's peak counters: only on request, only once CUDA is up."""
        try:
            done = self.torch.reset_peaks(self.config.device)
            if done and self._pending is not None:
                # Reset from inside a cell (%%gpumem --reset-peak): nothing of the cell ran
                # before it, so the cell's own peak is exact too.
                self._pending.reset_peak = True
            return done
        except Exception as e:
            self._contain("reset_peak_memory_stats", e)
            return False

    def begin(self, *, reset_peak: bool, nvml_now: bool = False,
              ) -> tuple[Sample, Watermark, bool]:
        """Start a measurement with a fresh exact reading (``%%gpumem``). ``nvml_now``: NVML
        read now as well (bounded, as on demand), not the sampler's latest reading, which a
        cell shorter than the sampling interval would otherwise see before and after it."""
        did_reset = self._reset_peaks() if reset_peak else False
        before = self.read() if nvml_now else self.read_hot()
        wm = Watermark(since_t_s=before.t_s)
        self._watermarks.append(wm)
        return before, wm, did_reset

    def end(self, wm: Watermark, *, nvml_now: bool = False) -> Sample:
        after = self.read() if nvml_now else self.read_hot()
        if wm in self._watermarks:
            self._watermarks.remove(wm)
        with self._baseline_lock:
            self._baseline = after
            self._cell_ended_t_s = after.t_s
        return after

    # -- cell hooks --------------------------------------------------------------------------
    def pre_run_cell(self, info: Any) -> None:
        """Cheap by design: no device is read here. The cell starts from the baseline."""
        self._depth += 1
        if self._depth != 1:
            return  # nested (%%capture, run_cell from a cell): part of the outer cell
        self._advised_id = None
        try:  # before a cell that may start CUDA: the OOM observer queued on its start-up
            self.oom.arm()  # one attribute check once tried
        except BaseException as e:
            self._contain("OOM explainer", e)
        try:
            t_s = time.monotonic()
            with self._baseline_lock:
                self._cell_began_t_s = t_s
            reset = self.config.peak == PEAK_RESET and self._reset_peaks()
            with self._baseline_lock:
                before = self._baseline
                if before is None or reset:
                    before = self._baseline = self.read_hot()
                selection = self._selections
                ended_t_s = self._cell_ended_t_s
            if before.nvml_t_s is not None and before.nvml_t_s < ended_t_s:
                # NVML's figures here were read before the previous cell ended (the hooks
                # reuse the sampler's): what that cell did would count as this one's.
                before = replace(before, devices=tuple(
                    replace(d, nvml=None) for d in before.devices))
            if self.cuda_start.started is None:
                self.cuda_start.cell_started(_pre_count(self.shell, info),
                                             getattr(info, "raw_cell", "") or "")
            wm = Watermark(since_t_s=t_s)
            self._watermarks.append(wm)
            self._pending = _Pending(
                before=before, t_s=t_s, wall_s=time.time(), cell_key=cell_key_of(info),
                source=getattr(info, "raw_cell", "") or "",
                execution_count=_pre_count(self.shell, info),
                thread_id=threading.get_ident(), reset_peak=reset, watermark=wm,
                mark=CellMark(t_s), device=self.config.device, selection=selection,
            )
            # Marked at its start, so a long cell shows on the chart while it runs.
            self.marks.append(self._pending.mark)
        except BaseException as e:  # as in post_run_cell
            self._pending = None
            self._contain("pre_run_cell", e)

    def post_run_cell(self, result: Any) -> None:
        if getattr(result, "error_in_exec", None) is None:
            self._post_run_cell(result)
            return
        with one_read_per_error():  # a failing cell's str(exc) runs once, not once per check
            self._post_run_cell(result)

    def _post_run_cell(self, result: Any) -> None:
        # The cell's exception is the user's object, read through ``userexc``/``errtext``.
        # BaseException is contained here, not only Exception: IPython lets anything else
        # out of a callback, and a SystemExit from a user's __str__ ended the kernel (issue
        # 16). The cell's own code is not run here: nothing of the user's is swallowed.
        if self._depth == 0:
            # A blank cell, or the cell that loaded us: no matching pre. That one may have
            # imported torch and started CUDA after the load.
            try:
                if self.cuda_start.started is None and _ran_code(result):
                    self.cuda_start.load_cell_ended(_count_of(result))
                self._watch_refusal(result)
            except BaseException as e:
                self._contain("CUDA start watch", e)
            return
        self._depth -= 1
        if self._depth != 0:
            # Nested (%%capture, %%gpumem, run_cell from a cell): its error, if any, shows
            # here, in the nested cell's output, and never reaches the outer cell's result.
            try:
                self._watch_refusal(result)
            except BaseException as e:
                self._contain("CUDA start watch", e)
            return
        try:  # one attribute check unless the cell raised a CUDA OOM
            self.oom.on_cell_result(result)
        except BaseException as e:
            self._contain("OOM explainer", e)
        try:
            self._watch_cuda_start(result)
        except BaseException as e:
            self._contain("CUDA start watch", e)
        pending = self._pending
        if pending is not None:
            try:
                self._finish(pending, result)
            except BaseException as e:
                self._contain("post_run_cell", e)
            finally:
                self._pending = None
        while self.after_cell:
            try:
                self.after_cell.pop(0)()
            except BaseException as e:
                self._contain("after the cell", e)

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

    @property
    def history(self) -> History:
        """Every finished cell's record: reading it records any cell still queued."""
        self.flush()
        return self._history

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
        self._history.append(rec)
        return rec

    def _drain_done(self, sample: Sample | None, *, keep: int = 0) -> None:
        """Record and judge finished cells in order; with ``sample`` (sampler thread) only
        those that ended before it, completing their NVML figures from it; without, all but
        the newest ``keep``.

        A reading stands for a cell's NVML "after" only if no cell began between that cell's
        end and the reading: in a fast Run All the next cell may already have allocated
        when the sampler reads (issue 16: a ``pass`` cell flagged with 64 MB "outside
        PyTorch"). Such a cell's NVML "after" is unknown instead, and its verdict rests on
        the allocator alone."""
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
                self._history.replace(done.record, complete_nvml(done.record, after))

    def _finish_queue(self, budget_s: float) -> None:
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
                    self._history.replace(done.record, complete_nvml(done.record, None))
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

    def _explain(self, v: Verdict) -> Verdict:
        holders: tuple[Holder, ...] = ()
        if v.cause == CAUSE_LIVE_TENSORS:
            holders = top_holders(self.scan(), v.cause)
        return replace(v, holders=holders, message=verdict_message(v, holders))

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

    def busy_elsewhere(self) -> bool:
        """A cell is running on another thread (a widget click during a cell)."""
        p = self._pending
        return p is not None and p.thread_id != threading.get_ident()

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

    def _root_context(self, stored: Sequence[Any]) -> RootContext:
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
        runs = [r for r in self._history.records() if r.cell_key == p.cell_key] + [
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
            with self._baseline_lock:
                self._baseline = None  # cleanup changed the allocator: read afresh


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


def _repair(cfg: Config) -> None:
    """Every field of a ``Config`` handed in checked; a bad one is reported and reset, so the
    monitor never runs on a value ``configure`` would refuse."""
    for key, check in CHECKS.items():
        try:
            setattr(cfg, key, check(getattr(cfg, key)))
        except SettingsError as e:
            log.warning("%s", bad_setting_line("settings", e))
            setattr(cfg, key, getattr(Config(), key))


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
