"""``%gpumem record on|off``: the allocator's history for the whole session, for
``%gpumem whatif --session`` ("restart the kernel under X and run the same cells").

The recording is PyTorch's own allocation history (a ring buffer of ``max_entries``, Python
stacks on allocations) with what the what-if needs to replay it from its start: the
segments that existed when it began (none when it began with CUDA), the driver's free
memory then and the memory fraction. It never starts CUDA nor imports torch by itself:
switched on before either, it is armed, and begins inside torch's CUDA start-up (a call
queued on ``torch.cuda._lazy_call`` once torch's import finishes), before the first
allocation. ``--start-cuda`` imports torch and starts CUDA, as the user asked.

A full ring buffer drops its oldest entries, which the replay would need: the number
dropped is estimated from the allocator's own counters (allocations, frees, segments since
the start) and said, and the replay then no longer claims the recorded start.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from .importwatch import AfterImport
from .sources.torch.debug import TorchDebug
from .sources.torch.source import CudaStartHook
from .whatif.snapshot import MAX_HISTORY_ENTRIES, SESSION_KEY, START_KEY

__all__ = ["MAX_ENTRIES", "SessionRecorder", "SessionSnapshot", "max_entries_refusal"]

MAX_ENTRIES = 100_000
RECORD_HOOK_ATTR = "_gpumem_nb_record_hook"  # on torch.cuda: the recording's queued start
_ASYNC = ("gpumem record: the cudaMallocAsync backend records no allocation history; nothing "
          "is recorded.")


class _StartHook(CudaStartHook):
    """The hook that begins an armed recording as CUDA starts."""


@dataclass(frozen=True)
class SessionSnapshot:
    snapshot: dict[str, Any]
    entries: int
    dropped: int  # entries the ring buffer dropped, estimated (0: none)
    notes: tuple[str, ...]


def _counts(cuda: Any, device: int) -> int | None:
    """What the history would hold since the counters began, for one GPU: each allocation
    is one entry, each free two (requested, completed), each segment one."""
    try:
        stats = cuda.memory_stats(device)
    except Exception:
        return None
    try:
        return (int(stats.get("allocation.all.allocated", 0))
                + 2 * int(stats.get("allocation.all.freed", 0))
                + int(stats.get("segment.all.allocated", 0))
                + int(stats.get("segment.all.freed", 0)))
    except (TypeError, ValueError):
        return None


def max_entries_refusal(max_entries: int | None, recorder: SessionRecorder,
                        switching_on: bool) -> str:
    """Why a recording cannot keep ``max_entries`` events, or "" where it can. No more than
    ``whatif --session`` replays: past it, reading the history back alone takes minutes
    (176 ms per 100,000 entries on the H200) and gigabytes of dicts. A recording already on
    keeps the ring it started with: torch cannot resize it without dropping what it holds."""
    if max_entries is None:
        return ""
    if not 1 <= max_entries <= MAX_HISTORY_ENTRIES:
        return (f"--max-entries is a number of events between 1 and {MAX_HISTORY_ENTRIES} "
                f"(what %gpumem whatif --session replays at most), not {max_entries}")
    if switching_on and recorder.active and max_entries != recorder.max_entries:
        return (f"the session recording is already on, keeping {recorder.max_entries} "
                f"events: switch it off first (%gpumem record off) to record with "
                f"--max-entries {max_entries}")
    return ""


class SessionRecorder:
    """One kernel's session recording (the monitor keeps one)."""

    def __init__(self, torch: TorchDebug | None = None, *, max_entries: int = MAX_ENTRIES,
                 wall: Callable[[], float] = time.time,
                 cell_number: Callable[[], int | None] | None = None) -> None:
        self.torch = torch if torch is not None else TorchDebug()
        self.max_entries = max_entries
        self.wall = wall
        self.on = False
        self._start: dict[str, Any] = {}
        self._counts_at_start: dict[int, int | None] = {}
        self.kept: SessionSnapshot | None = None  # the last one, kept when switched off
        self.cell_number = cell_number or (lambda: None)
        self.since_cell: int | None = None  # the cell running when the recording began
        self.armed = False  # waiting for torch's import and CUDA's start
        self._import_watch: AfterImport | None = None
        self._hook: CudaStartHook | None = None  # the call queued on CUDA's start-up
        self._begun_text = ""
        self._why_not_armed = ""

    @property
    def active(self) -> bool:
        """On, and torch still records (a user's own ``_record_memory_history(None)``
        ends it)."""
        return self.on and self.torch.history_enabled() is not False

    def start(self, *, start_cuda: bool = False, max_entries: int | None = None) -> str:
        """Switch the recording on, or arm it to begin as CUDA starts; the sentence to show
        (what happened, or why not)."""
        t = self.torch
        if self.active:
            return (f"gpumem record: already on (since {self._since_text()}, "
                    f"{self.max_entries} entries kept at most).")
        if max_entries is not None:
            self.max_entries = max_entries
        if not t.initialized:
            if t.modules.get("torch") is None:
                if not start_cuda:
                    return self._arm()
                why = t.import_torch()  # the user asked: --start-cuda
                if why:
                    return f"gpumem record: {why}."
            mod: Any = t.modules.get("torch")
            if not start_cuda:
                return self._arm()
            try:
                mod.cuda.init()  # runs the armed hook, if any: it begins the recording
            except Exception as e:
                return f"gpumem record: CUDA could not be started ({type(e).__name__}: {e})."
            started = " This started CUDA, as you asked: the session starts from an empty GPU."
            if self.on:
                return self._begun_text + started
            self.disarm()
            return self._begin(started)
        if t.allocator_backend() == "cudaMallocAsync":
            return _ASYNC
        if t.history_enabled():
            return ("gpumem record: allocation history is already recording (your own "
                    "_record_memory_history); it is left as it is. Switch it off first to "
                    "record a session from now.")
        self.disarm()
        return self._begin("")

    # -- armed: the recording begins as CUDA starts ----------------------------------------
    def _arm(self) -> str:
        """Wait for torch's import (a finder on ``sys.meta_path``) and then for CUDA's start
        (a call queued on ``torch.cuda._lazy_call``), which begins the recording inside
        ``_lazy_init``, before the call that started CUDA allocates: an empty GPU."""
        self.armed = True
        self.kept = None
        self.poll()
        if not self.armed:  # CUDA came up meanwhile, or torch cannot queue the start
            return self._begun_text or self._why_not_armed
        waiting = "torch's import, then CUDA's start" if self._import_watch is not None \
            else "CUDA's start"
        return ("gpumem record: armed, waiting for " + waiting + ". CUDA is not initialized "
                "yet and gpumem_nb never starts it by itself: the recording begins when your "
                "code starts CUDA, from an empty GPU, and keeps the last "
                f"{self.max_entries} allocator events (set PYTORCH_ALLOC_CONF before that: "
                "the allocator reads it when CUDA starts). %gpumem record on --start-cuda "
                "starts CUDA now; %gpumem record status says when it began.")

    def poll(self) -> None:
        """While armed: watch for torch's import, or queue the start once torch is
        imported; begin at once if CUDA is already up (it started where the hook could not
        see it). Cheap: a dict lookup while torch is not imported. Called at each cell's start
        and when torch's import finishes."""
        if not self.armed:
            return
        t = self.torch
        if t.modules.get("torch") is None or getattr(t.modules["torch"], "cuda", None) is None:
            if self._import_watch is None:
                self._import_watch = AfterImport("torch", self.poll)
                self._import_watch.install()
            return
        self._close_import_watch()
        if self._hook is None:
            hook, why = t.on_cuda_init(_StartHook, attr=RECORD_HOOK_ATTR)
            if hook is not None:
                hook.handler = self._on_cuda_start
                self._hook = hook
                return
            if t.initialized:  # up before the hook could be queued
                self.armed = False
                self._begun_text = self._begin(
                    " CUDA had started before the recording could be queued on its start: "
                    "what it reserved before is the recording's start.")
                return
            self.armed = False
            self._why_not_armed = (f"gpumem record: cannot wait for CUDA's start ({why}); run "
                                   "a cell that uses the GPU, then %gpumem record on.")
            return

    def _on_cuda_start(self, _frame: FrameType | None = None) -> None:
        """Inside torch's ``_lazy_init``, before anything is allocated."""
        if not self.armed:
            return
        self.armed = False
        with self.torch.while_cuda_starts():
            if self.torch.allocator_backend() == "cudaMallocAsync":
                self._begun_text = _ASYNC
                return
            self._begun_text = self._begin(" It began as CUDA started.")

    def disarm(self) -> None:
        """Stop waiting: the finder leaves ``sys.meta_path``; the queued call (torch never
        empties its queue) forwards to nothing."""
        self.armed = False
        self._close_import_watch()
        hook, self._hook = self._hook, None
        if hook is not None and getattr(hook, "handler", None) == self._on_cuda_start:
            hook.handler = None

    def _close_import_watch(self) -> None:
        watch, self._import_watch = self._import_watch, None
        if watch is not None:
            watch.close()

    def _begin(self, started: str) -> str:
        t = self.torch
        segments, why = t.segments_snapshot()
        devices: dict[str, dict[str, Any]] = {}
        for i in range(t.device_count()):
            info = t.mem_info(i)
            # A GPU with no context yet cannot say what is free (asking would create one):
            # its size and fraction still model a memory fraction's cap; what is free is
            # filled in at the snapshot (the H200 run: without them no OOM was judged).
            devices[str(i)] = {"free_bytes": info[0] if info else None,
                               "total_bytes": info[1] if info else t.device_total_bytes(i),
                               "fraction": t.memory_fraction(i)}
        cuda = t._cuda()
        self._counts_at_start = {i: _counts(cuda, i) for i in range(t.device_count())}
        since = self.wall() * 1e6
        err = t.record_history(True, max_entries=self.max_entries)
        if err:
            return f"gpumem record: cannot record allocation history: {err}."
        self._start = {"segments": segments, "devices": devices, "since_us": since}
        self.on = True
        self.kept = None
        self.since_cell = self.cell_number()
        held = sum(int(s.get("total_size", 0)) for s in segments or ())
        if segments is None:
            state = f" The segments reserved now could not be read ({why}): the replay " \
                    "rebuilds them."
        elif held:
            state = (f" {len(segments)} segment(s) were already reserved; the session is "
                     "replayed from them, so it answers 'restart the kernel' only from an "
                     "empty GPU: switch it on before the first cell that uses the GPU.")
        else:
            state = " Nothing is reserved yet: the session replays from an empty GPU."
        self._begun_text = (f"gpumem record: on, keeping the last {self.max_entries} "
                            f"allocator events.{started}{state} %gpumem whatif --session "
                            "replays it.")
        return self._begun_text

    def _since_text(self) -> str:
        since = self._start.get("since_us")
        return time.strftime("%H:%M:%S", time.localtime(since / 1e6)) if since else "?"

    def snapshot(self) -> SessionSnapshot | None:
        """The history since the recording began, with its start; None when it is off
        (the one kept when it was switched off, if any)."""
        if not self.active:
            return self.kept
        t = self.torch
        snap, _why = t.memory_snapshot()
        if snap is None:
            return None
        notes: list[str] = []
        start = dict(self._start)
        traces = snap.get("device_traces")
        entries = sum(len(x) for x in traces or () if isinstance(x, list))
        dropped = 0
        cuda = t._cuda()
        for i, trace in enumerate(traces if isinstance(traces, list) else ()):
            if not isinstance(trace, list) or len(trace) < self.max_entries:
                continue
            now, then = _counts(cuda, i), self._counts_at_start.get(i)
            lost = (now - then - len(trace)) if now is not None and then is not None else None
            dropped += max(lost or 0, 1)
            notes.append(f"GPU {i}: the session's history filled its {self.max_entries} "
                         f"entries and dropped {'about ' + str(lost) if lost else 'its oldest'}"
                         " of them: the replay cannot start from the recording's start, so "
                         "it starts from segments rebuilt from the end state; record with "
                         "more entries (%gpumem record on --max-entries N) for a whole session.")
        start["devices"] = self._devices_now(snap, start)
        if dropped:
            start["segments"] = None  # the recorded start no longer precedes the history
        snap[START_KEY] = start
        snap[SESSION_KEY] = {"since_us": start.get("since_us"), "dropped": dropped,
                             "max_entries": self.max_entries}
        return SessionSnapshot(snap, entries, dropped, tuple(notes))

    def _devices_now(self, snap: dict[str, Any], start: dict[str, Any]
                     ) -> dict[str, dict[str, Any]]:
        """The start's free memory per GPU; for one that had no context when recording
        began, what is free now plus what the session reserved since."""
        out = {k: dict(v) for k, v in (start.get("devices") or {}).items()}
        for key, dev in out.items():
            if dev.get("free_bytes") is not None:
                continue
            i = int(key)
            info = self.torch.mem_info(i)
            if info is None:
                continue

            def held(segs: Any, d: int = i) -> int:
                return sum(int(x.get("total_size", 0)) for x in segs or ()
                           if int(x.get("device", d)) == d)

            dev["free_bytes"] = info[0] + held(snap.get("segments")) - held(start.get("segments"))
            dev["total_bytes"] = dev.get("total_bytes") or info[1]
        return out

    def entries_estimate(self, device: int) -> int | None:
        """How many entries the history holds for ``device`` now, from the allocator's
        counters (one ``memory_stats`` call, well under a millisecond) rather than the
        snapshot, whose cost grows with the history; None when they cannot say."""
        if not self.active:
            return None
        now, then = _counts(self.torch._cuda(), device), self._counts_at_start.get(device)
        if now is None or then is None:
            return None
        return max(0, min(now - then, self.max_entries))

    def stop(self) -> str:
        if self.armed:
            self.disarm()
            return "gpumem record: off (it was armed; CUDA had not started, nothing recorded)."
        if not self.on:
            return "gpumem record: off (it was not on)."
        kept = None
        try:
            kept = self.snapshot()
        finally:
            self.on = False
            if self.torch.history_enabled():
                self.torch.record_history(False)
        self.kept = kept
        n = kept.entries if kept is not None else 0
        return (f"gpumem record: off. The session's {n} entries are kept for %gpumem whatif "
                "--session until the next recording.")

    def status(self) -> str:
        """Off, armed (waiting for torch or for CUDA), recording (since which cell, how many
        entries) or stopped (a finished session kept)."""
        if self.armed:
            what = "torch to be imported, then CUDA to start" if self._import_watch is not None \
                else "CUDA to start"
            return (f"gpumem record: armed, waiting for {what}; the recording begins as CUDA "
                    "starts, from an empty GPU.")
        if self.active:
            cell = f"cell [{self.since_cell}] ({self._since_text()})" \
                if self.since_cell is not None else self._since_text()
            counts = [n for n in (self.entries_estimate(i) for i in self._counts_at_start)
                      if n is not None]
            held = f"about {sum(counts):,} allocator events so far, " if counts else ""
            return (f"gpumem record: recording since {cell}: {held}the last "
                    f"{self.max_entries:,} kept.")
        if self.kept is not None:
            return (f"gpumem record: stopped; a finished session is kept for --session "
                    f"({self.kept.entries:,} entries): %gpumem whatif --session replays it.")
        return "gpumem record: off."
