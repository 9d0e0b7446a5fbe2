"""A faulty world must never hang or spam a cell: hung NVML, stop/start during a hung tick."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from gpumem_nb.kernel import current_monitor
from gpumem_nb.sources import gate

from .helpers import hang_guard, wait_until


def sampler_threads() -> int:
    return sum(t.name == "gpumem_nb-sampler" and t.is_alive() for t in threading.enumerate())


# How long a hung call waits for its release: far past any hang guard (``hang_guard`` of the
# budgets below), so a guard fails when the code under test waits for the driver instead of
# bounding its wait. Every test releases it in ``finally``.
HANG_S = 60.0


class Hang:
    """Makes the fake NVML's memory query block until released, like a wedged driver.
    ``most`` is the largest number of threads that were stuck inside it at once."""

    def __init__(self, nvml: Any, call: str = "nvmlDeviceGetMemoryInfo") -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self._orig = getattr(nvml, call)
        self._lock = threading.Lock()
        self.inside = self.most = 0

        def hung(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.inside += 1
                self.most = max(self.most, self.inside)
            self.entered.set()
            try:
                self.release.wait(HANG_S)
            finally:
                with self._lock:
                    self.inside -= 1
            return self._orig(*args, **kwargs)

        setattr(nvml, call, hung)


def test_a_hung_nvml_never_holds_up_a_cell(shell, fake_gpu):
    shell.run_cell("%load_ext gpumem_nb")
    hang = Hang(fake_gpu.nvml)
    try:
        assert hang.entered.wait(2.0)  # the sampler is now stuck inside NVML
        times = []
        for i in range(5):
            t0 = time.perf_counter()
            shell.run_cell(f"x = {i}", store_history=True)
            times.append(time.perf_counter() - t0)
        assert max(times) < hang_guard(0.05), times
    finally:
        hang.release.set()


def test_a_hung_nvml_reads_as_unknown_not_stale_as_fresh(shell, fake_gpu):
    shell.run_cell("%load_ext gpumem_nb")
    mon = current_monitor(shell)
    mon.sampler.interval_s = 0.05
    hang = Hang(fake_gpu.nvml)
    try:
        assert hang.entered.wait(2.0)
        # Later than the staleness bound (max(3 intervals, 2 s)), on the readings' clock.
        mon.readings.clock = lambda: time.monotonic() + 2.5
        shell.run_cell("y = 1", store_history=True)
        rec = mon.history.records()[-1]
        assert rec.devices[0].nvml_used_after_bytes is None
        assert rec.devices[0].allocated_after_bytes is not None  # the allocator still counts
    finally:
        hang.release.set()


def test_status_magic_answers_within_a_second_while_nvml_hangs(shell, fake_gpu, capsys):
    shell.run_cell("%load_ext gpumem_nb")
    hang = Hang(fake_gpu.nvml)
    try:
        assert hang.entered.wait(2.0)
        t0 = time.perf_counter()
        result = shell.run_cell("%gpumem")
        assert time.perf_counter() - t0 < hang_guard(1.5)
        assert result.error_in_exec is None
    finally:
        hang.release.set()


def test_stop_and_start_during_a_hung_tick_leave_one_sampler_thread(shell, fake_gpu):
    before = sampler_threads()
    shell.run_cell("%load_ext gpumem_nb")
    hang = Hang(fake_gpu.nvml)
    try:
        assert hang.entered.wait(2.0)
        for _ in range(3):
            shell.run_cell("%gpumem stop")
            shell.run_cell("%gpumem start")
        assert sampler_threads() == before + 1
    finally:
        hang.release.set()
    assert wait_until(lambda: sampler_threads() == before + 1), sampler_threads()
    shell.run_cell("%unload_ext gpumem_nb")
    assert wait_until(lambda: sampler_threads() == before), sampler_threads()


def test_an_error_whose_text_changes_every_call_is_reported_once(shell, fake_gpu, caplog):
    import logging

    shell.run_cell("%load_ext gpumem_nb")
    mon = current_monitor(shell)
    calls = iter(range(10**6))

    def flaky(*_: Any, **__: Any) -> Any:
        raise TimeoutError(f"timed out at t={next(calls)}")

    mon.source.read_hot = flaky  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        for i in range(5):
            shell.run_cell(f"z = {i}")
    lines = [r.getMessage() for r in caplog.records if "timed out" in r.getMessage()]
    assert len(lines) <= 2  # once per hook at most, never once per cell


def _timed(ip: Any, line: str) -> float:
    t0 = time.perf_counter()
    result = ip.run_cell(line)
    assert result.error_in_exec is None, (line, result.error_in_exec)
    return time.perf_counter() - t0


@pytest.fixture
def quick_gate(monkeypatch: Any) -> Any:
    """A reading is taken for hung after 0.3 s here (1 s in a session), to keep tests short."""
    monkeypatch.setattr(gate.LIVE, "stuck_s", 0.3)
    return gate.LIVE


def test_commands_while_nvml_hangs_add_no_stuck_thread_and_answer_at_once(shell, fake_gpu,
                                                                          quick_gate):
    shell.run_cell("%load_ext gpumem_nb")
    hang = Hang(fake_gpu.nvml)
    try:
        assert hang.entered.wait(2.0)  # the sampler is stuck inside NVML
        assert wait_until(lambda: quick_gate.hung_s() is not None)  # ... past the gate's limit
        times = [_timed(shell, line) for line in ["%gpumem", "%gpumem summary",
                                                  "%gpumem status", "%gpumem cleanup --dry-run",
                                                  "%gpumem who"] * 3]
        # Before: each command waited 1 s and left one more thread stuck in NVML (20 after
        # 20 commands).
        assert hang.most == 1, hang.most
        assert max(times) < hang_guard(0.15), times
        assert not [t for t in threading.enumerate() if t.name == "gpumem_nb-read"]
    finally:
        hang.release.set()


def test_reloads_while_nvml_hangs_are_quick_and_add_no_stuck_thread(shell, fake_gpu,
                                                                     quick_gate, capsys):
    before = sampler_threads()
    shell.run_cell("%load_ext gpumem_nb")
    hang = Hang(fake_gpu.nvml)
    try:
        assert hang.entered.wait(2.0)
        assert wait_until(lambda: quick_gate.hung_s() is not None)
        times = [_timed(shell, "%reload_ext gpumem_nb") for _ in range(5)]
        # Before: 2 s per reload, and a stuck sampler and a stuck reader more each time.
        assert max(times) < hang_guard(0.15), times
        assert hang.most == 1, hang.most
        assert sampler_threads() <= before + 2  # the stuck one and the live one
        assert "has not returned" in capsys.readouterr().out  # the load line says why
        assert _timed(shell, "x = 1") < hang_guard(0.05)
    finally:
        hang.release.set()
    assert wait_until(lambda: sampler_threads() <= before + 1)
    assert sampler_threads() == before + 1  # the stuck one returned and ended
    m = current_monitor(shell)
    assert m is not None
    m.sampler.tick()
    assert m.read().devices[0].nvml is not None  # NVML reads again once it answers


def test_an_oom_while_nvml_hangs_is_explained_without_hanging_the_cell(shell, fake_gpu,
                                                                       quick_gate, capsys):
    from .fakes import GiB

    shell.run_cell("%load_ext gpumem_nb")
    shell.user_ns.update(cuda=fake_gpu.cuda, GiB=GiB)
    shell.run_cell("warm = cuda.tensor(1)")  # CUDA up: the OOM observer attaches
    hang = Hang(fake_gpu.nvml)
    # The explainer's own process listing would hang too.
    listing = Hang(fake_gpu.nvml, "nvmlDeviceGetComputeRunningProcesses_v3")
    try:
        assert hang.entered.wait(2.0)
        assert wait_until(lambda: quick_gate.hung_s() is not None)
        capsys.readouterr()
        t0 = time.perf_counter()
        shell.run_cell("x = cuda.tensor(400 * GiB)", store_history=True)
        elapsed = time.perf_counter() - t0
        # Before: the observer listed NVML's processes on the cell's own thread, inside the
        # hang (here until the test releases it).
        assert elapsed < hang_guard(1.0), elapsed
        assert "gpumem: CUDA out of memory on GPU 0" in capsys.readouterr().out
        assert listing.most == 0
    finally:
        hang.release.set()
        listing.release.set()



def test_an_oom_while_only_the_process_listing_hangs_and_the_sampler_is_stopped_is_bounded(
        shell, fake_gpu, capsys):
    """Nothing else inside the gate, so the gate alone could not tell it hangs: the cell
    waited for the driver (a real wedged one: forever)."""
    from .fakes import GiB

    shell.run_cell("%load_ext gpumem_nb")
    shell.user_ns.update(cuda=fake_gpu.cuda, GiB=GiB)
    shell.run_cell("warm = cuda.tensor(1)")
    shell.run_cell("%gpumem stop")
    listing = Hang(fake_gpu.nvml, "nvmlDeviceGetComputeRunningProcesses_v3")
    try:
        capsys.readouterr()
        t0 = time.perf_counter()
        shell.run_cell("x = cuda.tensor(400 * GiB)", store_history=True)
        elapsed = time.perf_counter() - t0
        assert elapsed < hang_guard(2.0), elapsed
        assert "gpumem: CUDA out of memory on GPU 0" in capsys.readouterr().out
        assert _gpumem_threads("gpumem_nb-oom-processes") <= 1
    finally:
        listing.release.set()
    assert wait_until(lambda: _gpumem_threads("gpumem_nb-oom-processes") == 0)


def _gpumem_threads(name: str) -> int:
    return sum(t.name == name and t.is_alive() for t in threading.enumerate())


@pytest.mark.parametrize("call", ["nvmlInit", "nvmlDeviceGetCount"])
def test_a_load_whose_nvml_start_hangs_answers_within_two_seconds_and_says_why(
        shell, fake_gpu, capsys, call):
    # Before: nvmlInit and the device count ran on the main thread at load, so a wedged
    # driver froze %load_ext (and a kernel that loads the extension at start) for good.
    hang = Hang(fake_gpu.nvml, call)
    try:
        t0 = time.perf_counter()
        shell.run_cell("%load_ext gpumem_nb")
        elapsed = time.perf_counter() - t0
        out = capsys.readouterr().out
        assert hang.entered.is_set()
        assert elapsed < hang_guard(2.2), elapsed
        assert "NVML has not answered its start" in out, out
        assert "unknown" in out
        assert _timed(shell, "x = 1") < hang_guard(0.05)
        assert _timed(shell, "%gpumem") < hang_guard(0.3)
        mon = current_monitor(shell)
        assert mon is not None
        assert all(d.nvml is None for d in mon.read(timeout_s=0.2).devices)
    finally:
        hang.release.set()
    assert wait_until(lambda: _gpumem_threads("gpumem_nb-start") == 0)
    # Once NVML answers, its figures are read again.
    assert mon.read().devices[0].nvml is not None


def test_unloading_while_nvml_start_hangs_is_quick_and_leaves_nothing_behind(
        shell, fake_gpu, capsys):
    nvml = fake_gpu.nvml
    samplers = sampler_threads()
    hang = Hang(nvml, "nvmlInit")
    try:
        assert _timed(shell, "%load_ext gpumem_nb") < hang_guard(2.2)
        assert hang.entered.is_set()
        assert _timed(shell, "%unload_ext gpumem_nb") < hang_guard(1.0)
    finally:
        hang.release.set()
    # The start returns once the driver answers, balances its own nvmlInit, and ends.
    assert wait_until(lambda: _gpumem_threads("gpumem_nb-start") == 0)
    assert wait_until(lambda: nvml.inits == nvml.shutdowns == 1), (nvml.inits, nvml.shutdowns)
    assert sampler_threads() == samplers


def test_reloads_during_a_hung_start_leave_nvml_balanced_when_it_answers(shell, fake_gpu,
                                                                         capsys):
    nvml = fake_gpu.nvml
    hang = Hang(nvml, "nvmlInit")
    try:
        shell.run_cell("%load_ext gpumem_nb")
        assert hang.entered.is_set()
        for _ in range(5):  # each new monitor's start waits at the gate behind the hung one
            shell.run_cell("%reload_ext gpumem_nb")
        shell.run_cell("%unload_ext gpumem_nb")
    finally:
        hang.release.set()  # the driver answers while the cancelled starts still wait
    assert wait_until(lambda: _gpumem_threads("gpumem_nb-start") == 0)
    # Before: each waiting start, cancelled by its unload, still went in once the gate freed
    # and started NVML on its closed source: 6 nvmlInit, 1 nvmlShutdown.
    assert wait_until(lambda: nvml.inits == nvml.shutdowns), (nvml.inits, nvml.shutdowns)
    time.sleep(0.3)  # an observation window: no late start may follow the balance
    assert nvml.inits == nvml.shutdowns, (nvml.inits, nvml.shutdowns)


def test_the_samplers_reading_stands_for_now_until_the_staleness_bound_and_not_after():
    """The bound is max(3 intervals, 2 s), on the readings' clock: tested by the clock, not
    by sleeping past it."""
    from types import SimpleNamespace

    from gpumem_nb.kernel.contain import FailureLog
    from gpumem_nb.kernel.readings import Readings
    from gpumem_nb.model import Sample

    latest = Sample(t_s=100.0, wall_s=0.0, rss_bytes=None)
    sampler = SimpleNamespace(latest=lambda: latest, running=True, interval_s=0.5)
    now = [0.0]
    readings = Readings(None, sampler, None, FailureLog(), clock=lambda: now[0])  # type: ignore[arg-type]
    for age_s, fresh in [(0.0, True), (1.99, True), (2.0, True), (2.01, False), (60.0, False)]:
        now[0] = 100.0 + age_s
        assert (readings.nvml_latest() is latest) is fresh, age_s
    sampler.interval_s = 1.0  # three intervals are longer than 2 s
    now[0] = 102.9
    assert readings.nvml_latest() is latest
    now[0] = 103.1
    assert readings.nvml_latest() is None
    sampler.running = False  # a stopped sampler's reading stands for nothing
    now[0] = 100.0
    assert readings.nvml_latest() is None
