"""Recorded sessions: write samples to a small JSON trace and play them back.

Binder and CI have no GPU; a replayed H200 session lets the chart, the banner and the browser
test run there on real numbers. Playback re-stamps each sample with the current clock so the
chart moves in real time. It stops at the recording's end (the last reading holds, with its
own time), so the chart's axis stays "seconds into the recording"; ``loop=True`` plays it
again and again, each pass later on the clock.
"""

from __future__ import annotations

import bisect
import gc
import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

from .. import safeio
from ..model import Sample, SourceStatus
from ..units import cut, printable, shown_name
from .tracecheck import (
    AHEAD_DEVICES,
    EAGER_DEVICES,
    MAX_SAMPLE_CHILDREN,
    MAX_SAMPLE_DEVICES,
    Recording,
    TraceError,
    _show,
    sample_from_json,
    times_of,
)

__all__ = ["ReplaySource", "TraceError", "load_trace", "open_trace", "parse_trace",
           "sample_from_json", "sample_to_json", "write_trace"]

TRACE_FORMAT = "gpumem_nb-trace"
BUNDLED_TRACE = "h200_session.json"


# A long recorded session is a few MB; the cap keeps a wrong file from filling memory.
MAX_TRACE_BYTES = 64 << 20
MAX_NOTE_CHARS = 300  # of the recording's note, shown under the chart's table


def sample_to_json(sample: Sample) -> dict[str, Any]:
    return asdict(sample)


def write_trace(path: str | Path, samples: Iterable[Sample], *, note: str = "") -> None:
    samples = list(samples)
    t0 = samples[0].t_s if samples else 0.0
    body = {
        "format": TRACE_FORMAT,
        "version": 1,
        "note": note,
        "samples": [sample_to_json(_shift(s, -t0)) for s in samples],
    }
    Path(path).write_text(json.dumps(body, separators=(",", ":")))


def recording_of(text: str) -> tuple[Recording, str]:
    """A trace's recording and note, with the samples' times checked (and ``EAGER_DEVICES``
    device readings' worth of samples, the first at least); ``TraceError`` otherwise."""
    # A long trace's hundreds of thousands of dicts set off collections that find nothing
    # to free: a third of the parse of a 46 MB trace.
    collecting = gc.isenabled()
    gc.disable()
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as e:
        where = f" ({e.msg}, line {e.lineno})" if isinstance(e, json.JSONDecodeError) else ""
        raise TraceError(f"it is not valid JSON{where}") from None
    finally:
        if collecting:
            gc.enable()
    if not isinstance(body, dict) or body.get("format") != TRACE_FORMAT:
        raise TraceError(f"it is not a gpumem_nb trace (no \"format\": \"{TRACE_FORMAT}\")")
    if body.get("version", 1) != 1 or isinstance(body.get("version"), bool):
        raise TraceError(f"it is a trace of version {_show(body.get('version'))}; "
                         "this gpumem_nb reads version 1")
    raw = body.get("samples")
    if not isinstance(raw, list):
        raise TraceError(f"\"samples\" is {_show(raw)}, not a list")
    if not raw:
        raise TraceError("it holds no samples")
    note = body.get("note", "")
    if not isinstance(note, str):
        raise TraceError(f"\"note\" is {_show(note)}, not a string")
    rec = Recording(raw, times_of(raw))
    rec.check(0, more_devices=EAGER_DEVICES, strict=True)
    return rec, note


def parse_trace(text: str) -> tuple[list[Sample], str]:
    """Samples and note of a trace's text, every field checked; ``TraceError`` otherwise."""
    rec, note = recording_of(text)
    rec.check(len(rec.times_s) - 1, strict=True)
    return rec.checked, note


def _trace_text(path: str | Path | None) -> str:
    """A trace file's text; ``None``: the bundled H200 recording's. Reads only a regular file
    of at most ``MAX_TRACE_BYTES`` (never a FIFO or a device, see ``safeio``)."""
    if path is None:
        return resources.files("gpumem_nb.data").joinpath(BUNDLED_TRACE).read_text()
    try:
        return safeio.read_text(path, max_bytes=MAX_TRACE_BYTES)
    except OSError as e:
        raise TraceError(safeio.reason(e)) from None


def load_trace(path: str | Path | None = None) -> tuple[list[Sample], str]:
    """Samples and note of a trace file, every field checked; ``None`` loads the bundled H200
    recording. Every failure is a ``TraceError`` whose text says what is wrong."""
    return parse_trace(_trace_text(path))


def open_trace(path: str | Path | None = None) -> tuple[Recording, str]:
    """``load_trace``, its samples past the first ``EAGER_DEVICES`` device readings checked
    as they are played (``Recording``)."""
    return recording_of(_trace_text(path))


def _shift(s: Sample, dt: float, wall: float | None = None) -> Sample:
    return Sample(t_s=s.t_s + dt, wall_s=s.wall_s if wall is None else wall,
                  rss_bytes=s.rss_bytes, devices=s.devices)


# How far a replay looks for the recording's first GPU use when it opens: a few hundred
# samples, checked as playing them would check them (milliseconds), not the whole file.
IDLE_LOOK_SAMPLES = 256
IDLE_SAID_S = 1.0  # a shorter idle start is not worth a line


def _in_use(s: Sample) -> bool:
    return any((d.nvml is not None and bool(d.nvml.used_bytes))
               or (d.allocator is not None and d.allocator.reserved_bytes > 0)
               for d in s.devices)


def idle_lead_s(rec: Recording) -> float:
    """How long the recording shows no GPU memory in use before its first sample that does
    (0 where that comes first, or is not within the first ``IDLE_LOOK_SAMPLES``)."""
    n = rec.check(min(IDLE_LOOK_SAMPLES, len(rec.times_s)) - 1)
    for i in range(n):
        if _in_use(rec.sample(i)):
            return rec.times_s[i] - rec.times_s[0]
    return 0.0


class ReplaySource:
    """Plays a trace at its recorded pace (times ``speed``), once (or looping). A
    ``Recording`` from ``open_trace`` is checked as it plays: each ``read`` (the sampler's)
    checks ``AHEAD_DEVICES`` device readings ahead; a sample that fails ends it there."""

    def __init__(
        self,
        samples: Sequence[Sample] | Recording,
        *,
        note: str = "",
        speed: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        loop: bool = False,
    ) -> None:
        rec = samples if isinstance(samples, Recording) else Recording.of(samples)
        if not rec.times_s:
            raise ValueError("a replay needs at least one sample")
        rec.check(0, strict=True)  # the first sample names the GPUs (status)
        self._rec = rec
        self._note = note
        self._speed = speed
        self._clock = clock
        self._loop = loop
        self._t0: float | None = None
        # A recording that starts before CUDA does draws flat lines at 0 until then: a
        # newcomer watching the bundled one saw nothing happen for its first 5.7 s.
        self._idle_s = idle_lead_s(rec)
        self._offsets_s = [t - rec.times_s[0] for t in rec.times_s]
        self._span_s = max(self._offsets_s[-1], 1e-9)
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: str | Path | None = None, **kw: Any) -> ReplaySource:
        """A source playing ``path`` (None: the bundled trace). Raises ``TraceError`` (a
        ``ValueError``) with a plain message for a file that is missing, special, too large
        or malformed in its times or its first samples' fields; nothing else has happened
        then. A later sample that is malformed ends the recording before it, said in the
        source's status."""
        rec, note = open_trace(path)
        return cls(rec, note=note, **kw)

    def _through(self, index: int, *, ahead: int = 0) -> int:
        """Check the samples through ``index``, and ``ahead`` device readings past it; the
        index of the sample to play for it: ``index``, or the last before one that failed."""
        n = self._rec.check(index, more_devices=ahead)
        end = len(self._rec.times_s)
        if end < len(self._offsets_s):  # the recording now ends before a malformed sample
            with self._lock:
                self._offsets_s = self._offsets_s[:end]
                self._span_s = max(self._offsets_s[-1], 1e-9)
        return min(index, n - 1)

    def start(self) -> bool:
        with self._lock:
            if self._t0 is None:
                self._t0 = self._clock()
        return True

    def close(self) -> None:
        pass

    def read(self, *, processes: bool | None = None) -> Sample:
        self.start()
        now = self._clock()
        assert self._t0 is not None
        played = (now - self._t0) * self._speed
        if not self._loop and played >= self._span_s:
            # Ended: the last reading, stamped when it was played, so nothing new is drawn.
            last = self._rec.sample(self._through(len(self._offsets_s) - 1))
            return _shift(last, self._t0 + self._span_s / self._speed - last.t_s,
                          wall=time.time())
        pos = played % (self._span_s + 1e-9)
        # The last recorded sample at or before the playback position.
        # The sampler's thread reads: it checks the samples to come, off the cell's path.
        index = self._through(max(bisect.bisect_right(self._offsets_s, pos) - 1, 0),
                              ahead=AHEAD_DEVICES)
        chosen = self._rec.sample(index)
        return _shift(chosen, now - chosen.t_s, wall=time.time())

    def played(self, after_s: float | None = None) -> list[Sample]:
        """The recording's own readings played so far, after ``after_s``: each stamped with
        its time into the playback (its time into the recording; a loop's later passes
        later by a whole recording each), the newest at or before the playback position.

        A chart of the replay draws these, every recorded point at its own time, rather
        than samples of them: a 0.25 s spike read every 0.5 s would be missed, and a
        reading taken 0.5 s into the playback would be drawn at 0. ``after_s=None`` starts
        at the current pass's first reading."""
        if self._t0 is None:
            return []
        pos = (self._clock() - self._t0) * self._speed
        period = self._span_s + 1e-9  # as read() wraps a loop
        if not self._loop:
            pos = min(pos, self._span_s)
        first_pass = int(pos // period) if after_s is None else max(int(after_s // period), 0)
        # A cursor many passes behind (a chart made long after the loop began) gets the
        # current pass only: what is drawn is bounded by one recording.
        first_pass = max(first_pass, int(pos // period) - 1)
        out: list[Sample] = []
        for n in range(first_pass, int(pos // period) + 1):
            base = n * period
            lo = 0 if after_s is None else bisect.bisect_right(self._offsets_s, after_s - base)
            hi = bisect.bisect_right(self._offsets_s, pos - base)
            if hi > lo:
                hi = min(hi, self._through(hi - 1) + 1)
            for i in range(lo, hi):
                s = self._rec.sample(i)
                out.append(_shift(s, base + self._offsets_s[i] - s.t_s))
            if not self._loop:
                break
        return out

    @property
    def ended(self) -> bool:
        """The recording has played to its end (never, when looping)."""
        if self._loop or self._t0 is None:
            return False
        return (self._clock() - self._t0) * self._speed >= self._span_s

    @property
    def recording(self) -> list[Sample]:
        """Every recorded sample checked so far (all of them once checked), at its recorded
        time: the whole story, for a picture."""
        return self._rec.checked

    def status(self) -> SourceStatus:
        first = self._rec.sample(0)
        n = len(first.devices)
        name = first.devices[0].nvml.name if n and first.devices[0].nvml else ""
        # The recording's own words, bounded as a cluster's notes are.
        notes = [printable(cut(self._note, MAX_NOTE_CHARS))] if self._note else []
        if self._idle_s >= IDLE_SAID_S:
            notes.append(f"The recording is idle for its first {self._idle_s:.1f} s: no GPU "
                         "memory is in use until then, so its lines start flat at 0.")
        if self._rec.most_devices > MAX_SAMPLE_DEVICES:
            notes.append(f"Samples are shown for their first {MAX_SAMPLE_DEVICES} GPUs: "
                         f"{self._rec.most_devices - MAX_SAMPLE_DEVICES:,} more in the "
                         f"widest ({self._rec.most_devices:,}) were left out.")
        if self._rec.most_children > MAX_SAMPLE_CHILDREN:
            notes.append(f"Each GPU's children are shown for the first {MAX_SAMPLE_CHILDREN}: "
                         f"{self._rec.most_children - MAX_SAMPLE_CHILDREN:,} more in the "
                         f"longest listing ({self._rec.most_children:,}) were left out.")
        if self._rec.problem:
            notes.append(self._rec.problem)
        elif not self._rec.complete:
            notes.append(f"The recording's samples are checked as they play: "
                         f"{self._rec.checked_count:,} of {len(self._offsets_s):,} so far, "
                         "and the picture draws those.")
        return SourceStatus(
            nvml=f"replay of a recorded session ({shown_name(name) if name else 'no GPU'})",
            torch="replay",
            gpu_count=n,
            notes=tuple(notes),
        )
