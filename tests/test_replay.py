"""Recorded traces round-trip and play back in real time."""

from __future__ import annotations

import pytest

from gpumem_nb.model import AllocatorReading, DeviceSample, NvmlReading, Sample
from gpumem_nb.sources.replay import ReplaySource, load_trace, write_trace

from .fakes import GiB


def sample(t: float, used: int) -> Sample:
    nv = NvmlReading(0, "NVIDIA H200", "GPU-x", "0:18:00.0", 141 * GiB, used)
    al = AllocatorReading(used // 2, used, used // 2, 0, used, used, 0, 0)
    return Sample(t_s=t, wall_s=1e9 + t, rss_bytes=GiB, devices=(DeviceSample(0, nv, al),))


def test_trace_round_trips_every_field(tmp_path):
    samples = [sample(10.0, GiB), sample(10.5, 2 * GiB)]
    write_trace(tmp_path / "t.json", samples, note="demo")
    back, note = load_trace(tmp_path / "t.json")
    assert note == "demo"
    assert [s.devices for s in back] == [s.devices for s in samples]
    assert [s.t_s for s in back] == [0.0, 0.5]


def test_playback_follows_the_clock_and_loops():
    now = [0.0]
    src = ReplaySource([sample(0.0, GiB), sample(1.0, 2 * GiB), sample(2.0, 3 * GiB)],
                       clock=lambda: now[0])
    used = []
    for t in (0.0, 0.5, 1.2, 2.0, 2.5):
        now[0] = t
        s = src.read()
        assert s.t_s == t
        used.append(s.devices[0].nvml.used_bytes)  # type: ignore[union-attr]
    assert used == [GiB, GiB, 2 * GiB, 3 * GiB, GiB]


def test_bundled_h200_session_loads():
    samples, note = load_trace(None)
    assert len(samples) > 10 and "H200" in note


def test_a_file_that_is_not_a_trace_is_refused_plainly(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"samples": []}')
    with pytest.raises(ValueError, match="not a gpumem_nb trace"):
        load_trace(p)
