"""``CellTracer``: switch PyTorch's allocation history on before a cell and off after it, read
the snapshot, analyse it and ``--save`` it (pickle protocol 4, the newest that PyTorch's
memory_viz reader accepts).
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import safeio
from ..celltext import CellText
from ..sources.torch.debug import TorchDebug
from ..whatif.snapshot import START_KEY
from .entries import _as_list, _usable
from .replay import TOP_DEFAULT, DeviceTrace, analyze
from .sites import library_dirs

__all__ = ["MAX_ENTRIES", "CellTracer", "TraceResult", "save_snapshot"]

MAX_ENTRIES = 100_000  # history ring buffer: 0.2-0.27 s for torch to snapshot when full (H200)

_PICKLE_PROTOCOL = 4  # memory_viz's JavaScript unpickler rejects protocol 5


@dataclass
class TraceResult:
    devices: tuple[DeviceTrace, ...]
    notes: tuple[str, ...]
    added_s: float  # what tracing added to the cell: arming, snapshot, analysis, disarming
    entries: int
    top: int = TOP_DEFAULT
    saved_to: str = ""
    save_failed: str = ""  # why --save wrote nothing (also among the notes)
    snapshot: dict[str, Any] | None = field(default=None, repr=False)
    # Of added_s: inside PyTorch's own calls. On the H200 (torch 2.11) a snapshot takes
    # 0.4 ms with one entry, 23-25 ms with 10,000 and 205-253 ms with 100,000; a process's
    # first took 4-8 s more before ``inductor_lookup_skipped``.
    snapshot_s: float = 0.0  # torch.cuda.memory._snapshot()
    switch_s: float = 0.0  # _record_memory_history on and off

    @property
    def torch_s(self) -> float:
        return self.snapshot_s + self.switch_s

    @property
    def ours_s(self) -> float:
        """What gpumem_nb itself added: reading the snapshot, ranking sites, saving."""
        return max(self.added_s - self.torch_s, 0.0)

    def sites_at_failure(self) -> list[tuple[str, int]]:
        return [(sb.label, sb.nbytes) for d in self.devices for sb in d.at_oom]


class CellTracer:
    def __init__(self, torch: TorchDebug | None = None, *, max_entries: int = MAX_ENTRIES,
                 clock: Callable[[], float] = time.perf_counter,
                 wall: Callable[[], float] = time.time, session: bool = False) -> None:
        self.torch = torch if torch is not None else TorchDebug()
        self.max_entries = max_entries
        self.session = session  # %gpumem record's history is on: it, not the user's, is read
        self.clock = clock
        self.wall = wall
        self._ours = False
        self._disarmed = False  # switched off early by disarm(): stop still reads it as ours
        self._since_us: float | None = None
        self._spent_s = 0.0
        self._switch_s = 0.0  # of _spent_s, in torch's _record_memory_history
        self._notes: list[str] = []
        self._start_state: dict[str, Any] = {}  # the allocator when tracing began, for the what-if
        self._start_snapshot_s = 0.0

    def _timed_record(self, enabled: bool) -> str:
        t0 = self.clock()
        try:
            return self.torch.record_history(enabled, max_entries=self.max_entries) \
                if enabled else self.torch.record_history(False)
        finally:
            self._switch_s += self.clock() - t0

    def start(self) -> str:
        """Arm the recording. "" when armed, else why this cell cannot be traced."""
        t0 = self.clock()
        try:
            return self._start()
        finally:
            self._spent_s += self.clock() - t0

    def _start(self) -> str:
        t = self.torch
        if not t.initialized:
            return ("CUDA is not initialized yet and gpumem_nb never starts it: run a cell "
                    "that uses the GPU first (for example torch.zeros(1, device='cuda')), "
                    "then trace. This cell runs untraced.")
        if t.allocator_backend() == "cudaMallocAsync":
            return ("the cudaMallocAsync backend records no allocation history (PyTorch "
                    "supports it on the native allocator only); start the kernel without "
                    "backend:cudaMallocAsync to trace. This cell runs untraced.")
        prior = t.history_enabled()
        self._start_state = self._record_start()
        self._since_us = self.wall() * 1e6
        if prior and self.session:
            self._notes.append("The session recording (%gpumem record on) was already on: "
                               "this cell's part of it was read, and it keeps recording.")
            return ""
        if prior:
            self._notes.append("Your own allocation-history recording was already on; it "
                               "was read and left as it was.")
            return ""
        why = self._timed_record(True)
        if why:
            return f"cannot record allocation history: {why}. This cell runs untraced."
        self._ours = True
        if prior is None:
            self._notes.append("This torch cannot say whether history was recording before "
                               "the cell; it is off again now.")
        return ""

    def _record_start(self) -> dict[str, Any]:
        """The segments that exist now (no history: cheap) and, per GPU this process uses,
        what the driver has free: the what-if replays the cell from this state and judges
        OOMs against what PyTorch could have had."""
        t = self.torch
        t0 = self.clock()
        # Blocks allocated while an earlier trace recorded carry frames: listing them
        # symbolizes those too (4.5 s on the H200 for one live tensor, inductor's import).
        segments, why = t.segments_snapshot()
        self._start_snapshot_s = self.clock() - t0
        devices: dict[str, dict[str, Any]] = {}
        for i in range(t.device_count()):
            info = t.mem_info(i)
            if info is not None:
                devices[str(i)] = {"free_bytes": info[0], "total_bytes": info[1],
                                   "fraction": t.memory_fraction(i)}
        if segments is None:
            self._notes.append(f"The what-if has no start state for this cell: {why}.")
        return {"segments": segments, "devices": devices}

    def _devices_at_start(self, snap: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """The start's free memory per GPU; for a GPU that had no context yet when the cell
        began (so could not be asked then), what is free now plus what the cell reserved."""
        devices = dict(self._start_state.get("devices") or {})
        start_segments = self._start_state.get("segments") or ()
        for i, entries in enumerate(snap.get("device_traces") or ()):
            if not entries or str(i) in devices:
                continue
            info = self.torch.mem_info(i)
            if info is None:
                continue

            def held(segs: Any, dev: int = i) -> int:
                return sum(int(x.get("total_size", 0)) for x in segs
                           if int(x.get("device", dev)) == dev)

            devices[str(i)] = {
                "free_bytes": info[0] + held(snap.get("segments") or ()) - held(start_segments),
                "total_bytes": info[1], "fraction": self.torch.memory_fraction(i)}
        return devices

    def disarm(self) -> None:
        """Switch our recording off, once (it was never the user's). ``stop`` does this
        first thing; a caller whose work between ``start`` and ``stop`` failed calls it."""
        if self._ours:
            self._ours = False
            self._disarmed = True
            self._timed_record(False)

    def stop(self, *, top: int = TOP_DEFAULT, save: str | None = None,
             cells: CellText | None = None) -> TraceResult:
        """Snapshot, switch the recording back off (if it was ours), analyse, save.
        ``cells``: the cells' texts as compiled, which their lines are labelled from."""
        t0 = self.clock()
        try:
            snap, why = self.torch.memory_snapshot()
        finally:  # whatever the snapshot does, the recording is not left on
            snapshot_s = self.clock() - t0 + self._start_snapshot_s  # both of torch's
            ours = self._ours or self._disarmed
            self.disarm()
        notes = list(self._notes)
        devices: list[DeviceTrace] = []
        entries = 0
        if snap is None:
            notes.append(f"No snapshot: {why}.")
        else:
            skip = library_dirs(self.torch._modules)
            since = None if ours else self._since_us
            if self._start_state:
                try:
                    at_start = self._devices_at_start(snap)
                except Exception:  # a snapshot not in the form torch writes
                    at_start = dict(self._start_state.get("devices") or {})
                snap[START_KEY] = {**self._start_state, "since_us": since,
                                   "devices": at_start}
            traces = snap.get("device_traces")
            for i, trace in enumerate(traces if isinstance(traces, list | tuple) else ()):
                trace = _as_list(trace)
                if not trace:
                    continue
                first_t = next((u.get("time_us") for u in map(_usable, trace)
                                if u is not None), None)
                if since is not None and first_t is None:
                    notes.append("These history entries carry no timestamps, so this cell's "
                                 "cannot be told apart from earlier ones: all are shown.")
                    since = None
                d = analyze(trace, device=i, since_us=since, top=top, skip=skip, cell=cells)
                entries += d.entries
                if d.allocations:
                    devices.append(d)
                if d.skipped:
                    notes.append(f"GPU {i}: {d.skipped} history entries were not in the form "
                                 "torch writes and were skipped.")
                if ours and len(trace) >= self.max_entries:
                    notes.append(f"GPU {i}: the history buffer filled up ({self.max_entries} "
                                 "entries); the cell's earliest allocations are missing.")
                elif since is not None and first_t is not None and first_t > since:
                    notes.append(f"GPU {i}: your history buffer may have dropped this cell's "
                                 "earliest entries.")
        result = TraceResult(devices=tuple(devices), notes=tuple(notes), added_s=0.0,
                             entries=entries, top=top, snapshot=snap, snapshot_s=snapshot_s,
                             switch_s=self._switch_s)
        if save and snap is not None:
            try:
                result.saved_to = save_snapshot(snap, save)
            except Exception as e:  # refused, disk full, a snapshot pickle cannot hold
                why = safeio.reason(e) if isinstance(e, OSError) else type(e).__name__
                result.save_failed = (f"Could not write {safeio.shown(save)}: {why}; any "
                                      "file already there is unchanged.")
        elif save:
            result.save_failed = (f"Nothing was saved to {safeio.shown(save)}: there is no "
                                  "snapshot.")
        if result.save_failed:
            result.notes += (result.save_failed,)
        result.added_s = self._spent_s + self.clock() - t0
        return result


def save_snapshot(snapshot: Mapping[str, Any], path: str) -> str:
    """Pickle for PyTorch's memory_viz: protocol 4, which its reader accepts (5 it rejects).

    Written the way settings and CSV are (``safeio.write_atomic``): a regular file only,
    never through a link or into a FIFO, and a save that fails part-way leaves the old file
    whole. ``OSError`` when refused."""
    path = os.path.expanduser(path)
    data = dict(snapshot)
    safeio.write_atomic(path, lambda f: pickle.dump(data, f, protocol=_PICKLE_PROTOCOL))
    return path
