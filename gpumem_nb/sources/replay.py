"""Recorded sessions: write samples to a small JSON trace and play them back.

Binder and CI have no GPU; a replayed H200 session lets the chart, the banner and the browser
test run there on real numbers. Playback re-stamps each sample with the current clock so the
chart moves in real time. It stops at the recording's end (the last reading holds, with its
own time), so the chart's axis stays "seconds into the recording"; ``loop=True`` plays it
again and again, each pass later on the clock.
"""

from __future__ import annotations

import bisect
import json
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import MISSING, asdict, fields
from importlib import resources
from pathlib import Path
from typing import Any

from .. import safeio
from ..model import (
    STATUS_ERROR,
    STATUS_LOST,
    STATUS_OK,
    AllocatorReading,
    ChildProcess,
    DeviceSample,
    NvmlReading,
    Sample,
    SourceStatus,
)
from ..units import cut, printable, shown_name

TRACE_FORMAT = "gpumem_nb-trace"
BUNDLED_TRACE = "h200_session.json"


# A long recorded session is a few MB; the cap keeps a wrong file from filling memory.
MAX_TRACE_BYTES = 64 << 20
_STATUSES = (STATUS_OK, STATUS_LOST, STATUS_ERROR)
MAX_NOTE_CHARS = 300  # of the recording's note, shown under the chart's table


class TraceError(ValueError):
    """A trace that cannot be replayed, with the problem in plain words."""


def sample_to_json(sample: Sample) -> dict[str, Any]:
    return asdict(sample)


# -- validation: every field of every sample, before anything is built ----------------------
def _show(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        return f"a {type(value).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


def _maybe_whole(where: str, key: str, value: Any, *, optional: bool = True) -> int | None:
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 63:
        raise TraceError(f"{where}: \"{key}\" is {_show(value)}, not a whole number "
                         f"{'of bytes ' if key.endswith('_bytes') else ''}"
                         f"(0 or more){' or null' if optional else ''}")
    return value


def _whole(where: str, key: str, value: Any) -> int:
    n = _maybe_whole(where, key, value, optional=False)
    assert n is not None
    return n


def _seconds(where: str, key: str, value: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise TraceError(f"{where}: \"{key}\" is {_show(value)}, not a finite number of seconds")
    return float(value)


def _maybe_seconds(where: str, key: str, value: Any) -> float | None:
    return None if value is None else _seconds(where, key, value)


def _text(where: str, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TraceError(f"{where}: \"{key}\" is {_show(value)}, not a string")
    return value


# Each scalar field type of the records, by its annotation, and its check. A new field of a
# type not listed here fails the round-trip test rather than loading unchecked.
_SCALARS: dict[str, Callable[[str, str, Any], Any]] = {
    "int": _whole, "int | None": _maybe_whole, "str": _text, "float": _seconds,
    "float | None": _maybe_seconds,
}


def _record(where: str, data: Any, cls: type, *, nested: dict[str, Callable[[Any], Any]]
            | None = None, lenient: dict[str, Any] | None = None) -> Any:
    """A ``cls`` from ``data``, every field checked by its type: an object with every field
    that has no default (``lenient`` ones too, with the given stand-in) and no unknown one."""
    if not isinstance(data, dict):
        raise TraceError(f"{where} is {_show(data)}, not an object")
    nested, lenient = nested or {}, lenient or {}
    known = fields(cls)
    if unknown := sorted(set(data) - {f.name for f in known}, key=str):
        raise TraceError(f"{where} has an unknown field {_show(unknown[0])}")
    kw: dict[str, Any] = {}
    for f in known:
        if f.name not in data:
            if f.name in lenient:
                kw[f.name] = lenient[f.name]
            elif f.default is MISSING and f.default_factory is MISSING:
                raise TraceError(f"{where} lacks the field {_show(f.name)}")
            continue
        value = data[f.name]
        kw[f.name] = (nested[f.name](value) if f.name in nested
                      else _SCALARS[str(f.type)](where, f.name, value))
    return cls(**kw)


def _children_from_json(where: str, raw: Any) -> tuple[ChildProcess, ...]:
    if not isinstance(raw, list):
        raise TraceError(f"{where}: \"children\" is {_show(raw)}, not a list")
    return tuple(_record(f"{where}, child {i}", c, ChildProcess) for i, c in enumerate(raw))


def _nvml_from_json(where: str, nv: Any) -> NvmlReading:
    reading: NvmlReading = _record(where, nv, NvmlReading, nested={
        "children": lambda raw: _children_from_json(where, raw)})
    if reading.status not in _STATUSES:
        raise TraceError(f"{where}: \"status\" is {_show(reading.status)}, not one of "
                         f"{', '.join(_STATUSES)}")
    return reading


def _device_from_json(where: str, d: Any) -> DeviceSample:
    return _record(where, d, DeviceSample, nested={
        "nvml": lambda nv: None if nv is None else _nvml_from_json(f"{where}, nvml", nv),
        "allocator": lambda al: None if al is None else _record(
            f"{where}, allocator", al, AllocatorReading),
    })


def _devices_from_json(where: str, raw: Any) -> tuple[DeviceSample, ...]:
    if not isinstance(raw, list):
        raise TraceError(f"{where}: \"devices\" is {_show(raw)}, not a list")
    return tuple(_device_from_json(f"{where}, device {j}", d) for j, d in enumerate(raw))


def sample_from_json(data: Any, where: str = "sample") -> Sample:
    """A ``Sample`` from its JSON form; ``TraceError`` names the first field that is wrong."""
    return _record(where, data, Sample,
                   nested={"devices": lambda raw: _devices_from_json(where, raw)},
                   # Early traces had neither; they replay with no wall clock and no RSS.
                   lenient={"wall_s": 0.0, "rss_bytes": None})


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


def parse_trace(text: str) -> tuple[list[Sample], str]:
    """Samples and note of a trace's text, every field checked; ``TraceError`` otherwise."""
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as e:
        where = f" ({e.msg}, line {e.lineno})" if isinstance(e, json.JSONDecodeError) else ""
        raise TraceError(f"it is not valid JSON{where}") from None
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
    samples = [sample_from_json(s, f"sample {i}") for i, s in enumerate(raw)]
    for i in range(1, len(samples)):
        if samples[i].t_s < samples[i - 1].t_s:  # playback looks samples up by time
            raise TraceError(f"sample {i}: \"t_s\" goes back in time "
                             f"({samples[i].t_s:g} after {samples[i - 1].t_s:g})")
    note = body.get("note", "")
    if not isinstance(note, str):
        raise TraceError(f"\"note\" is {_show(note)}, not a string")
    return samples, note


def load_trace(path: str | Path | None = None) -> tuple[list[Sample], str]:
    """Samples and note of a trace file; ``None`` loads the bundled H200 recording.

    Reads only a regular file of at most ``MAX_TRACE_BYTES`` (never a FIFO or a device, see
    ``safeio``). Every failure is a ``TraceError`` whose text says what is wrong.
    """
    if path is None:
        text = resources.files("gpumem_nb.data").joinpath(BUNDLED_TRACE).read_text()
    else:
        try:
            text = safeio.read_text(path, max_bytes=MAX_TRACE_BYTES)
        except OSError as e:
            raise TraceError(safeio.reason(e)) from None
    return parse_trace(text)


def _shift(s: Sample, dt: float, wall: float | None = None) -> Sample:
    return Sample(t_s=s.t_s + dt, wall_s=s.wall_s if wall is None else wall,
                  rss_bytes=s.rss_bytes, devices=s.devices)


class ReplaySource:
    """Plays a trace at its recorded pace (times ``speed``), once (or looping)."""

    def __init__(
        self,
        samples: list[Sample],
        *,
        note: str = "",
        speed: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        loop: bool = False,
    ) -> None:
        if not samples:
            raise ValueError("a replay needs at least one sample")
        self._samples = samples
        self._note = note
        self._speed = speed
        self._clock = clock
        self._loop = loop
        self._t0: float | None = None
        self._offsets_s = [x.t_s - samples[0].t_s for x in samples]
        self._span_s = max(samples[-1].t_s - samples[0].t_s, 1e-9)
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: str | Path | None = None, **kw: Any) -> ReplaySource:
        """A source playing ``path`` (None: the bundled trace). Raises ``TraceError`` (a
        ``ValueError``) with a plain message for a file that is missing, special, too large
        or malformed in any field; nothing else has happened then."""
        samples, note = load_trace(path)
        return cls(samples, note=note, **kw)

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
            last = self._samples[-1]
            return _shift(last, self._t0 + self._span_s / self._speed - last.t_s,
                          wall=time.time())
        pos = played % (self._span_s + 1e-9)
        # The last recorded sample at or before the playback position.
        chosen = self._samples[max(bisect.bisect_right(self._offsets_s, pos) - 1, 0)]
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
            for i in range(lo, hi):
                s = self._samples[i]
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
        """Every recorded sample, at its recorded time: the whole story, for a picture."""
        return list(self._samples)

    def status(self) -> SourceStatus:
        n = len(self._samples[0].devices)
        name = ""
        if n and self._samples[0].devices[0].nvml:
            name = self._samples[0].devices[0].nvml.name
        return SourceStatus(
            nvml=f"replay of a recorded session ({shown_name(name) if name else 'no GPU'})",
            torch="replay",
            gpu_count=n,
            # The recording's own words, bounded as a cluster's notes are.
            notes=(printable(cut(self._note, MAX_NOTE_CHARS)),) if self._note else (),
        )
