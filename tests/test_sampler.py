"""The sampler: deterministic ticks, bounded memory, contained errors, prompt shutdown."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from gpumem_nb.model import Sample, SourceStatus
from gpumem_nb.sampler import Sampler

from .helpers import hang_guard, wait_until


class ScriptedSource:
    def __init__(self, clock, fail_with: Exception | None = None) -> None:
        self.clock = clock
        self.fail_with = fail_with
        self.reads = 0

    def start(self) -> bool:
        return True

    def close(self) -> None:
        pass

    def status(self) -> SourceStatus:
        return SourceStatus(nvml="scripted", torch="scripted", gpu_count=0)

    def read(self) -> Sample:
        self.reads += 1
        if self.fail_with is not None:
            raise self.fail_with
        return Sample(t_s=self.clock(), wall_s=0.0, rss_bytes=self.reads)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_tick_stores_the_sample_and_tells_listeners():
    clock = FakeClock()
    sampler = Sampler(ScriptedSource(clock), clock=clock)
    seen: list[Sample] = []
    sampler.add_listener(seen.append)
    clock.now = 101.0
    s = sampler.tick()
    assert s is not None and s.t_s == 101.0
    assert sampler.samples() == [s] and seen == [s]


def test_ring_buffer_never_grows_past_its_capacity():
    clock = FakeClock()
    sampler = Sampler(ScriptedSource(clock), clock=clock, capacity=50)
    for i in range(500):
        clock.now = 100.0 + i
        sampler.tick()
    kept = sampler.samples()
    assert len(kept) == 50 and kept[-1].t_s == 599.0
    assert [s.t_s for s in sampler.samples(since_t_s=590.0)] == [590.0 + i for i in range(10)]


def test_a_failing_source_is_contained_and_logged_once(caplog):
    clock = FakeClock()
    sampler = Sampler(ScriptedSource(clock, fail_with=RuntimeError("GPU is lost")), clock=clock)
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        for _ in range(5):
            assert sampler.tick() is None
    assert len(caplog.records) == 1
    assert sampler.errors == {"source: RuntimeError": 5}


def test_a_failing_listener_does_not_stop_sampling(caplog):
    clock = FakeClock()
    sampler = Sampler(ScriptedSource(clock), clock=clock)

    def broken(_s: Sample) -> None:
        raise ValueError("widget gone")

    sampler.add_listener(broken)
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        assert sampler.tick() is not None
        assert sampler.tick() is not None
    assert len(sampler.samples()) == 2 and len(caplog.records) == 1


@pytest.mark.parametrize("bad", [-1, 0, 0.01, 61, 1e9])
def test_interval_outside_the_allowed_range_is_refused(bad):
    with pytest.raises(ValueError, match=r"between 0\.05 and 60 seconds"):
        Sampler(ScriptedSource(time.monotonic), interval_s=bad)


def test_thread_samples_and_stop_joins_within_a_second():
    src = ScriptedSource(time.monotonic)
    sampler = Sampler(src, interval_s=0.05)
    earlier = set(threading.enumerate())  # another test's sampler is not this one's
    sampler.start()
    sampler.start()  # idempotent: still one thread
    names = [t.name for t in threading.enumerate() if t not in earlier]
    assert names.count("gpumem_nb-sampler") == 1
    assert wait_until(lambda: src.reads >= 3, 5.0)
    t0 = time.monotonic()
    assert sampler.stop()
    assert time.monotonic() - t0 < hang_guard(1.0)
    assert "gpumem_nb-sampler" not in [t.name for t in threading.enumerate()
                                       if t not in earlier]
    assert src.reads >= 3


def test_request_tick_is_served_without_waiting_for_the_interval():
    src = ScriptedSource(time.monotonic)
    sampler = Sampler(src, interval_s=60)
    sampler.start()
    try:
        sampler.request_tick()
        assert wait_until(lambda: src.reads >= 1, 5.0)
        assert src.reads == 1
    finally:
        sampler.stop()
