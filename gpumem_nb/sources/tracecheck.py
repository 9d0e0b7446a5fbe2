"""A recorded trace's samples, every field checked by its type, each when first needed.

A trace is a file from anywhere: a sample is built only from fields whose types are the
records' own (``TraceError`` names the first that is not). Checking them all before playing
held the kernel 5-18 s for a 46 MB trace (20,000 samples of 8 GPUs), so a ``Recording``
checks the first samples at once and the rest as they are played or drawn.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import MISSING, fields, replace
from typing import Any, TypeVar

from ..jsontext import json_prefix
from ..model import (
    STATUS_ERROR,
    STATUS_LOST,
    STATUS_NO_NVML,
    STATUS_OK,
    AllocatorReading,
    ChildProcess,
    DeviceSample,
    NvmlReading,
    Sample,
)
from .processes import shown_cmdline

__all__ = [
    "AHEAD_DEVICES",
    "EAGER_DEVICES",
    "MAX_SAMPLE_CHILDREN",
    "MAX_SAMPLE_DEVICES",
    "Recording",
    "TraceError",
    "children_named",
    "devices_named",
    "sample_from_json",
    "times_of",
]

_STATUSES = (STATUS_OK, STATUS_LOST, STATUS_ERROR, STATUS_NO_NVML)
# Device readings checked before a replay starts: the whole of a short recording (the
# bundled one holds 112), about 0.06 s of a long one (14 us a reading here). Past them, each
# reading the sampler plays checks AHEAD_DEVICES more (0.12 s in its 0.5 s interval), so a
# 46 MB recording of 84,000 readings is checked about 5 s into its playback.
EAGER_DEVICES = 4096
AHEAD_DEVICES = 8192
# GPUs a replayed sample may name: one host has 8 or 16. Past them the sample's devices are
# cut (and the replay says so): each GPU is a timeline, a table row and a chart's lines, and
# 8,000 GPUs in one sample held a replay for seconds.
MAX_SAMPLE_DEVICES = 64
# Children a replayed GPU reading may list (DataLoader workers, ranks): each is a line of the
# table and the picture, and 20,000 of them made an 18.9 MB picture. Past them the listing
# is cut (its recorded children_bytes stays the whole) and the replay says so.
MAX_SAMPLE_CHILDREN = 64

_R = TypeVar("_R")


class TraceError(ValueError):
    """A trace that cannot be replayed, with the problem in plain words."""


def _show(value: object) -> str:
    """The value in 40 characters, from only what is shown: a 5,000,000-float list took
    5.4 s to serialise before its refusal was cut to 40."""
    try:
        return json_prefix(value, 40)
    except (TypeError, ValueError):
        return f"a {type(value).__name__}"


def _maybe_whole(where: str, key: str, value: object, *, optional: bool = True) -> int | None:
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 63:
        raise TraceError(f"{where}: \"{key}\" is {_show(value)}, not a whole number "
                         f"{'of bytes ' if key.endswith('_bytes') else ''}"
                         f"(0 or more){' or null' if optional else ''}")
    return value


def _whole(where: str, key: str, value: object) -> int:
    n = _maybe_whole(where, key, value, optional=False)
    assert n is not None
    return n


def _seconds(where: str, key: str, value: Any) -> float:
    try:
        ok = isinstance(value, int | float) and not isinstance(value, bool) \
            and math.isfinite(value)
    except OverflowError:  # an int past a double's range: JSON allows 4,000 digits
        ok = False
    if not ok:
        raise TraceError(f"{where}: \"{key}\" is {_show(value)}, not a finite number of seconds")
    return float(value)


def _maybe_seconds(where: str, key: str, value: object) -> float | None:
    return None if value is None else _seconds(where, key, value)


def _text(where: str, key: str, value: object) -> str:
    if not isinstance(value, str):
        raise TraceError(f"{where}: \"{key}\" is {_show(value)}, not a string")
    return value


# Each scalar field type of the records, by its annotation, and its check. A new field of a
# type not listed here fails the round-trip test rather than loading unchecked.
_SCALARS: dict[str, Callable[[str, str, object], object]] = {
    "int": _whole, "int | None": _maybe_whole, "str": _text, "float": _seconds,
    "float | None": _maybe_seconds,
}


@functools.cache
def _fields_of(cls: type) -> tuple[frozenset[str], tuple[tuple[str, bool, str], ...]]:
    """``cls``'s field names, and each field's name, whether it must be there, and its type:
    read once per class, not once per record (a long trace has hundreds of thousands)."""
    known = fields(cls)
    return frozenset(f.name for f in known), tuple(
        (f.name, f.default is MISSING and f.default_factory is MISSING, str(f.type))
        for f in known)


def _record(where: str, data: object, cls: type[_R], *,
            nested: dict[str, Callable[[object], object]] | None = None,
            lenient: dict[str, object] | None = None) -> _R:
    """A ``cls`` from ``data``, every field checked by its type: an object with every field
    that has no default (``lenient`` ones too, with the given stand-in) and no unknown one."""
    if not isinstance(data, dict):
        raise TraceError(f"{where} is {_show(data)}, not an object")
    nested, lenient = nested or {}, lenient or {}
    record_type: type = cls  # mypy takes type[_R] for no Hashable (the cache key)
    names, known = _fields_of(record_type)
    if not data.keys() <= names:
        unknown = sorted(set(data) - names, key=str)
        raise TraceError(f"{where} has an unknown field {_show(unknown[0])}")
    kw: dict[str, object] = {}
    for name, required, kind in known:
        if name not in data:
            if name in lenient:
                kw[name] = lenient[name]
            elif required:
                raise TraceError(f"{where} lacks the field {_show(name)}")
            continue
        value = data[name]
        kw[name] = (nested[name](value) if name in nested
                    else _SCALARS[kind](where, name, value))
    return cls(**kw)


def _children_from_json(where: str, raw: object) -> tuple[ChildProcess, ...]:
    if not isinstance(raw, list):
        raise TraceError(f"{where}: \"children\" is {_show(raw)}, not a list")
    children = (_record(f"{where}, child {i}", c, ChildProcess)
                for i, c in enumerate(raw[:MAX_SAMPLE_CHILDREN]))
    # As the live reader gives them: a recording's command lines are anyone's text too.
    return tuple(replace(c, cmdline=shown_cmdline(c.cmdline)) if c.cmdline else c
                 for c in children)


def _nvml_from_json(where: str, nv: object) -> NvmlReading:
    reading: NvmlReading = _record(where, nv, NvmlReading, nested={
        "children": lambda raw: _children_from_json(where, raw)})
    if reading.status not in _STATUSES:
        raise TraceError(f"{where}: \"status\" is {_show(reading.status)}, not one of "
                         f"{', '.join(_STATUSES)}")
    return reading


def _device_from_json(where: str, d: object) -> DeviceSample:
    return _record(where, d, DeviceSample, nested={
        "nvml": lambda nv: None if nv is None else _nvml_from_json(f"{where}, nvml", nv),
        "allocator": lambda al: None if al is None else _record(
            f"{where}, allocator", al, AllocatorReading),
    })


def _devices_from_json(where: str, raw: object) -> tuple[DeviceSample, ...]:
    if not isinstance(raw, list):
        raise TraceError(f"{where}: \"devices\" is {_show(raw)}, not a list")
    return tuple(_device_from_json(f"{where}, device {j}", d)
                 for j, d in enumerate(raw[:MAX_SAMPLE_DEVICES]))


def devices_named(data: object) -> int:
    """How many devices a raw sample lists (0 when it lists none or is malformed)."""
    raw = data.get("devices") if isinstance(data, dict) else None
    return len(raw) if isinstance(raw, list) else 0


def children_named(data: object) -> int:
    """The most children one device of a raw sample lists, among the devices kept (0 when
    none, or malformed: the check says what is wrong)."""
    raw = data.get("devices") if isinstance(data, dict) else None
    most = 0
    for d in raw[:MAX_SAMPLE_DEVICES] if isinstance(raw, list) else ():
        nv = d.get("nvml") if isinstance(d, dict) else None
        kids = nv.get("children") if isinstance(nv, dict) else None
        if isinstance(kids, list):
            most = max(most, len(kids))
    return most


def sample_from_json(data: object, where: str = "sample") -> Sample:
    """A ``Sample`` from its JSON form; ``TraceError`` names the first field that is wrong."""
    return _record(where, data, Sample,
                   nested={"devices": lambda raw: _devices_from_json(where, raw)},
                   # Early traces had neither; they replay with no wall clock and no RSS.
                   lenient={"wall_s": 0.0, "rss_bytes": None})


def times_of(raw: Sequence[object]) -> list[float]:
    """Each raw sample's time, checked at once: playback looks samples up by them."""
    times: list[float] = []
    for i, s in enumerate(raw):
        where = f"sample {i}"
        if not isinstance(s, dict):
            raise TraceError(f"{where} is {_show(s)}, not an object")
        if "t_s" not in s:
            raise TraceError(f"{where} lacks the field {_show('t_s')}")
        t = _seconds(where, "t_s", s["t_s"])
        if times and t < times[-1]:
            raise TraceError(f"{where}: \"t_s\" goes back in time ({t:g} after {times[-1]:g})")
        times.append(t)
    return times


class Recording:
    """A trace's samples in time order, each checked field by field when first needed.

    The times are checked when the recording is made (``times_of``); a sample's other
    fields when it is first played or drawn (``check``). A sample that fails there ends the
    recording before it, and ``problem`` says which and why.
    """

    def __init__(self, raw: list[object], times_s: list[float]) -> None:
        self._raw = raw  # the JSON samples; each let go once checked
        self.times_s = times_s  # cut where a sample fails
        self._checked: list[Sample] = []
        self.problem = ""
        self.most_devices = 0  # the most GPUs one checked sample listed, before any cut
        self.most_children = 0  # the most children one checked GPU reading listed, too
        self._lock = threading.Lock()

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> Recording:
        """A recording of samples already checked."""
        rec = cls([], [s.t_s for s in samples])
        rec._checked = list(samples)
        return rec

    @property
    def checked(self) -> list[Sample]:
        """The samples checked so far, from the first: the whole recording once ``complete``."""
        with self._lock:
            return list(self._checked)

    @property
    def checked_count(self) -> int:
        return len(self._checked)

    @property
    def complete(self) -> bool:
        return len(self._checked) == len(self.times_s)

    def sample(self, index: int) -> Sample:
        """A sample already checked (``check`` said how many are)."""
        return self._checked[index]

    def check(self, index: int, *, more_devices: int = 0, strict: bool = False) -> int:
        """Check the samples through ``index``, then ``more_devices`` device readings beyond
        it; how many samples are checked. A sample that fails raises its ``TraceError`` when
        ``strict``; otherwise the recording ends before it."""
        with self._lock:
            budget = more_devices
            while len(self._checked) < len(self.times_s):
                i = len(self._checked)
                if i > index and budget <= 0:
                    break
                self.most_devices = max(self.most_devices, devices_named(self._raw[i]))
                self.most_children = max(self.most_children, children_named(self._raw[i]))
                try:
                    s = sample_from_json(self._raw[i], f"sample {i}")
                except TraceError as e:
                    if strict:
                        raise
                    self.problem = (f"The recording stops before sample {i:,} of "
                                    f"{len(self.times_s):,}, which cannot be played ({e}).")
                    del self.times_s[i:]
                    break
                self._checked.append(s)
                self._raw[i] = None
                if i > index:
                    budget -= max(len(s.devices), 1)
            return len(self._checked)
