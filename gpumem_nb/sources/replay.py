"""Recorded sessions: write samples to a small JSON trace and play them back.

Binder and CI have no GPU; a replayed H200 session lets the chart, the banner and the browser
test run there on real numbers. Playback re-stamps each sample with the current clock so the
chart moves in real time, and loops when the trace ends.
"""

from __future__ import annotations

import bisect
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

from ..model import AllocatorReading, DeviceSample, NvmlReading, Sample, SourceStatus

TRACE_FORMAT = "gpumem_nb-trace"
BUNDLED_TRACE = "h200_session.json"


def sample_to_json(sample: Sample) -> dict[str, Any]:
    return asdict(sample)


def sample_from_json(data: dict[str, Any]) -> Sample:
    devices = []
    for d in data.get("devices", ()):
        nv = d.get("nvml")
        al = d.get("allocator")
        devices.append(
            DeviceSample(
                index=int(d["index"]),
                nvml=NvmlReading(**nv) if nv else None,
                allocator=AllocatorReading(**al) if al else None,
            )
        )
    return Sample(
        t_s=float(data["t_s"]),
        wall_s=float(data.get("wall_s", 0.0)),
        rss_bytes=data.get("rss_bytes"),
        devices=tuple(devices),
    )


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


def load_trace(path: str | Path | None = None) -> tuple[list[Sample], str]:
    """Samples and note of a trace file; ``None`` loads the bundled H200 recording."""
    if path is None:
        text = resources.files("gpumem_nb.data").joinpath(BUNDLED_TRACE).read_text()
    else:
        text = Path(path).read_text()
    body = json.loads(text)
    if body.get("format") != TRACE_FORMAT:
        raise ValueError(f"{path} is not a gpumem_nb trace (no \"format\": \"{TRACE_FORMAT}\")")
    samples = [sample_from_json(s) for s in body["samples"]]
    if not samples:
        raise ValueError(f"{path} holds no samples")
    return samples, str(body.get("note", ""))


def _shift(s: Sample, dt: float, wall: float | None = None) -> Sample:
    return Sample(t_s=s.t_s + dt, wall_s=s.wall_s if wall is None else wall,
                  rss_bytes=s.rss_bytes, devices=s.devices)


class ReplaySource:
    """Plays a trace at its recorded pace (times ``speed``), looping at the end."""

    def __init__(
        self,
        samples: list[Sample],
        *,
        note: str = "",
        speed: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not samples:
            raise ValueError("a replay needs at least one sample")
        self._samples = samples
        self._note = note
        self._speed = speed
        self._clock = clock
        self._t0: float | None = None
        self._offsets_s = [x.t_s - samples[0].t_s for x in samples]
        self._span_s = max(samples[-1].t_s - samples[0].t_s, 1e-9)
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: str | Path | None = None, **kw: Any) -> ReplaySource:
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
        pos = ((now - self._t0) * self._speed) % (self._span_s + 1e-9)
        # The last recorded sample at or before the playback position.
        chosen = self._samples[max(bisect.bisect_right(self._offsets_s, pos) - 1, 0)]
        return _shift(chosen, now - chosen.t_s, wall=time.time())

    def status(self) -> SourceStatus:
        n = len(self._samples[0].devices)
        name = ""
        if n and self._samples[0].devices[0].nvml:
            name = self._samples[0].devices[0].nvml.name
        return SourceStatus(
            nvml=f"replay of a recorded session ({name or 'no GPU'})",
            torch="replay",
            gpu_count=n,
            notes=(self._note,) if self._note else (),
        )
