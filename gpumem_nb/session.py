"""``%gpumem record on|off``: the allocator's history for the whole session, for
``%gpumem whatif --session`` ("restart the kernel under X and run the same cells").

The recording is PyTorch's own allocation history (a ring buffer of ``max_entries``, Python
stacks on allocations) with what the what-if needs to replay it from its start: the
segments that existed when it began (none when it began with CUDA), the driver's free
memory then and the memory fraction. It never starts CUDA by itself: turning history on
initialises CUDA, so with CUDA not up yet it is armed only when the user says so
(``--start-cuda``), and the message says that this started CUDA.

A full ring buffer drops its oldest entries, which the replay would need: the number
dropped is estimated from the allocator's own counters (allocations, frees, segments since
the start) and said, and the replay then no longer claims the recorded start.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .sources.torch import TorchDebug
from .whatif.snapshot import SESSION_KEY, START_KEY

__all__ = ["MAX_ENTRIES", "SessionRecorder", "SessionSnapshot"]

MAX_ENTRIES = 100_000


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


class SessionRecorder:
    """One kernel's session recording (the monitor keeps one)."""

    def __init__(self, torch: TorchDebug | None = None, *, max_entries: int = MAX_ENTRIES,
                 wall: Callable[[], float] = time.time) -> None:
        self.torch = torch if torch is not None else TorchDebug()
        self.max_entries = max_entries
        self.wall = wall
        self.on = False
        self._start: dict[str, Any] = {}
        self._counts_at_start: dict[int, int | None] = {}
        self.kept: SessionSnapshot | None = None  # the last one, kept when switched off

    @property
    def active(self) -> bool:
        """On, and torch still records (a user's own ``_record_memory_history(None)``
        ends it)."""
        return self.on and self.torch.history_enabled() is not False

    def start(self, *, start_cuda: bool = False, max_entries: int | None = None) -> str:
        """Switch the recording on; the sentence to show (what happened, or why not)."""
        t = self.torch
        if self.active:
            return (f"gpumem record: already on (since {self._since_text()}, "
                    f"{self.max_entries} entries kept at most).")
        if max_entries is not None:
            self.max_entries = max_entries
        started = ""
        if not t.initialized:
            mod = t._modules.get("torch")
            if mod is None:
                return ("gpumem record: torch is not imported, so there is nothing to record "
                        "yet: import torch first.")
            if not start_cuda:
                return ("gpumem record: CUDA is not initialized yet and gpumem_nb never starts "
                        "it by itself (turning history on would). Run a cell that uses the "
                        "GPU first, or %gpumem record on --start-cuda to start CUDA now and "
                        "record the session from an empty GPU (set PYTORCH_ALLOC_CONF before: "
                        "the allocator reads it when CUDA starts).")
            try:
                mod.cuda.init()
            except Exception as e:
                return f"gpumem record: CUDA could not be started ({type(e).__name__}: {e})."
            started = " This started CUDA, as you asked: the session starts from an empty GPU."
        elif t.allocator_backend() == "cudaMallocAsync":
            return ("gpumem record: the cudaMallocAsync backend records no allocation "
                    "history; nothing is recorded.")
        elif t.history_enabled():
            return ("gpumem record: allocation history is already recording (your own "
                    "_record_memory_history); it is left as it is. Switch it off first to "
                    "record a session from now.")
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
        return (f"gpumem record: on, keeping the last {self.max_entries} allocator events."
                f"{started}{state} %gpumem whatif --session replays it.")

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

    def stop(self) -> str:
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
        if not self.active:
            extra = " (a finished session is kept for --session)" if self.kept else ""
            return f"gpumem record: off{extra}."
        return (f"gpumem record: on since {self._since_text()}, keeping the last "
                f"{self.max_entries} allocator events.")
