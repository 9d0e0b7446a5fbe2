"""Hostile messages, files, reloads and settings, through the real magics (issue 16).

Every test here runs IPython's real shell with the extension loaded, and each is named after
a failure found in the features added since the core was hardened: the OOM parser freezing
the kernel, ``--trace --save`` bypassing ``safeio``, records lost at reload, verdicts resting
on readings of the wrong cells, the explainer raising on odd exceptions, a failing source
printing tracebacks, leaked descriptors and monitors, allocation history left recording,
malformed history entries, settings saves losing another kernel's keys, and refused values
echoed whole.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from typing import Any

import pytest
from IPython.core.error import UsageError

from gpumem_nb import safeio, settings, trace
from gpumem_nb.ipython.grammar import MAX_MESSAGE_CHARS
from gpumem_nb.kernel import Monitor, cellqueue, current_monitor
from gpumem_nb.settings import Config, lock_path, read_config

from .fakes import GiB, MiB, OutOfMemoryError
from .helpers import hang_guard, ipython_8_for, run, spaced
from .test_oom import TORCH_2_11_H200, make_world


@pytest.fixture
def loaded(loaded: Any, fake_gpu: Any, capsys: Any) -> Any:
    """The conftest's, with ``dev`` and one cell already run and read by the sampler."""
    loaded.user_ns["dev"] = fake_gpu.cuda.devices[0]
    run(loaded, "warm = 1")
    spaced(loaded)
    capsys.readouterr()
    return loaded


def monitor(ip: Any) -> Monitor:
    m = current_monitor(ip)
    assert m is not None
    return m


def no_sampler_ticks(ip: Any, monkeypatch: Any) -> None:
    """Make the sampler's reading after a cell never come by itself: what a reload racing
    the sampler's 50 ms delay looks like, made certain."""
    m = monitor(ip)
    m.sampler.stop()
    monkeypatch.setattr(m.sampler, "_thread", _AliveThread())


class _AliveThread:
    """A sampler thread that is running but never reads (``Sampler.running`` is True)."""

    def is_alive(self) -> bool:
        return True

    def join(self, timeout: float | None = None) -> None:
        return None


# --------------------------------------------------------------------------------------------
# 1. The OOM parser on a cell's exception
# --------------------------------------------------------------------------------------------
FROZE = "CUDA out of memory. Tried to allocate 1.00 GiB (GPU 0; 1 B" + " " * 1200 + "\nb\nc)"


def test_a_value_error_that_froze_the_kernel_is_recorded_at_once_and_not_explained(loaded):
    loaded.user_ns["msg"] = FROZE
    t0 = time.perf_counter()
    result = run(loaded, "raise ValueError(msg)")
    elapsed = time.perf_counter() - t0
    assert isinstance(result.error_in_exec, ValueError)
    assert elapsed < 2.0, elapsed  # 6-18 s before; a hang guard, not a benchmark
    assert monitor(loaded).oom.last is None  # a user's ValueError is not an allocator OOM
    assert monitor(loaded).history.records()[-1].error.startswith("ValueError: CUDA out of")


def test_a_ten_megabyte_oom_message_is_explained_without_freezing_the_kernel(loaded, capsys):
    loaded.user_ns["msg"] = TORCH_2_11_H200 + " " * 10_000_000
    t0 = time.perf_counter()
    run(loaded, "raise RuntimeError(msg)")
    assert time.perf_counter() - t0 < 5.0  # more than 40 s before
    e = monitor(loaded).oom.last
    assert e is not None and e.facts.requested_bytes == 400 * GiB
    assert len(e.error) <= 300


def test_a_long_message_of_repeated_oom_heads_does_not_hold_the_kernel(loaded):
    loaded.user_ns["msg"] = "CUDA out of memory. Tried to allocate 1 B (GPU 1;" * 4000
    t0 = time.perf_counter()
    run(loaded, "raise RuntimeError(msg)")
    assert time.perf_counter() - t0 < 2.0  # about 11 s before: quadratic in its length


def test_a_400_digit_size_and_a_5000_digit_gpu_index_are_still_explained(loaded):
    head = "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of 139.80 GiB"
    tail = (" of which 2.00 GiB is free. Of the allocated memory 130.00 GiB is allocated by "
            "PyTorch, and 1.00 GiB is reserved by PyTorch but unallocated.")
    for size, gpu in (("9" * 400 + " GiB", "0"), ("1.00 GiB", "7" * 5000)):
        loaded.user_ns["msg"] = head.format(size, gpu) + tail
        monitor(loaded).oom.last = None
        result = run(loaded, "raise RuntimeError(msg)")
        assert isinstance(result.error_in_exec, RuntimeError)
        e = monitor(loaded).oom.last
        assert e is not None, "the explanation was given up"
        assert e.facts.free_bytes == 2 * GiB and e.facts.allocated_bytes == 130 * GiB


def test_a_users_value_error_quoting_an_oom_is_not_explained(loaded, capsys):
    loaded.user_ns["msg"] = TORCH_2_11_H200
    run(loaded, "raise ValueError(msg)")
    run(loaded, "raise RuntimeError('retrying after: ' + msg)")
    assert monitor(loaded).oom.last is None
    assert "gpumem: CUDA out of memory" not in capsys.readouterr().out


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this __str__ is broken")


def test_an_exception_whose_str_raises_keeps_its_report_line_under_gpumem(loaded, capsys):
    loaded.user_ns["BrokenStr"] = BrokenStr
    result = run(loaded, "%%gpumem\nraise BrokenStr()")
    out = capsys.readouterr()
    assert result.error_in_exec is None, result.error_in_exec  # no traceback from gpumem
    assert "gpumem: " in out.out and " ms · " in out.out  # the report line
    assert "monitor.py" not in out.out + out.err
    run(loaded, "raise BrokenStr()")
    rec = monitor(loaded).history.records()[-1]
    assert rec.source_preview == "raise BrokenStr()" and rec.raised  # the record is kept


def test_a_torch_oom_whose_str_raises_is_explained_from_the_observers_numbers(shell,
                                                                              monkeypatch,
                                                                              capsys):
    w = make_world(monkeypatch)
    run(shell, "%load_ext gpumem_nb")
    shell.user_ns.update(cuda=w.cuda, GiB=GiB, OutOfMemoryError=OutOfMemoryError)
    run(shell, "warm = 1")
    # store_history=False, as %%gpumem runs its body: with history stored, IPython 9 itself
    # fails formatting such an exception and hands the hooks its own RuntimeError instead.
    shell.run_cell(textwrap.dedent("""\
        class Unprintable(OutOfMemoryError):
            def __str__(self):
                raise RuntimeError('no text')
        Unprintable.__name__ = 'OutOfMemoryError'
        try:
            x = cuda.tensor(400 * GiB)
        except OutOfMemoryError:
            raise Unprintable() from None
        """), store_history=False)
    e = monitor(shell).oom.last
    assert e is not None
    assert e.facts.requested_bytes == 400 * GiB and "observer" in e.source
    assert "gpumem: CUDA out of memory on GPU 0. Asked 400.00 GiB" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# 2. %%gpumem --trace --save
# --------------------------------------------------------------------------------------------
def trace_save(ip: Any, path: str, body: str = "x = cuda.tensor(MiB)") -> Any:
    return ip.run_cell_magic("gpumem", f"--trace --save {path}", body)


def test_trace_save_refuses_a_symlink_and_leaves_its_target_alone(loaded, tmp_path):
    victim = tmp_path / "notes.txt"
    victim.write_text("precious")
    link = tmp_path / "cell.pickle"
    link.symlink_to(victim)
    with pytest.raises(UsageError, match="symbolic link"):
        trace_save(loaded, str(link))
    assert victim.read_text() == "precious" and link.is_symlink()
    assert "x" not in loaded.user_ns  # refused before the cell ran
    assert loaded.user_ns["cuda"].history is None


def test_trace_save_refuses_a_fifo_at_once(loaded, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    done = threading.Event()
    errors: list[BaseException] = []

    def attempt() -> None:
        try:
            trace_save(loaded, str(fifo))
        except BaseException as e:
            errors.append(e)
        done.set()

    threading.Thread(target=attempt, daemon=True).start()
    assert done.wait(5.0), "saving into a FIFO with no reader hung"
    assert errors and isinstance(errors[0], UsageError) and "FIFO" in str(errors[0])


def test_trace_save_with_a_nul_or_an_empty_name_is_a_usage_error(loaded):
    for name in ("'a\0b'", "''", "'  '"):
        with pytest.raises(UsageError) as info:
            trace_save(loaded, name)
        assert "Traceback" not in str(info.value)
    assert "x" not in loaded.user_ns


def test_trace_save_writes_a_regular_file_atomically(loaded, tmp_path):
    path = tmp_path / "cell.pickle"
    path.write_bytes(b"old")
    trace_save(loaded, str(path))
    assert path.read_bytes()[:2] == b"\x80\x04"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cell.pickle"]


# --------------------------------------------------------------------------------------------
# 3. Records at reload
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reload", ["%reload_ext gpumem_nb",
                                    "%unload_ext gpumem_nb\n%load_ext gpumem_nb"])
def test_a_cell_run_just_before_reload_ext_is_recorded(loaded, monkeypatch, reload):
    no_sampler_ticks(loaded, monkeypatch)
    run(loaded, "just_before = 1")
    run(loaded, reload)
    sources = [r.source_preview for r in monitor(loaded).history.records()]
    assert "just_before = 1" in sources


def test_rapid_run_all_with_reloads_in_the_middle_loses_no_record(loaded):
    cells = 0
    for i in range(240):
        if i % 20 == 19:
            run(loaded, "%reload_ext gpumem_nb")
        else:
            run(loaded, f"v = {i}")
            cells += 1
    spaced(loaded)  # the sampler's reading after the last cell
    sources = [r.source_preview for r in monitor(loaded).history.records()]
    missing = [f"v = {i}" for i in range(240) if i % 20 != 19 and f"v = {i}" not in sources]
    assert missing == []


def test_a_stuck_sampler_never_lets_the_queue_of_cells_grow_without_bound(loaded,
                                                                          monkeypatch):
    no_sampler_ticks(loaded, monkeypatch)
    for i in range(200):
        run(loaded, f"q = {i}")
    m = monitor(loaded)
    assert len(m.cells._done) <= cellqueue.MAX_QUEUED_CELLS
    assert len(m.cells.history) >= 200 - cellqueue.MAX_QUEUED_CELLS


# --------------------------------------------------------------------------------------------
# 4. Re-run verdicts
# --------------------------------------------------------------------------------------------
def test_alternating_the_watched_gpu_is_not_read_as_growth(shell, two_fake_gpus, capsys):
    run(shell, "%load_ext gpumem_nb")
    shell.user_ns.update(cuda=two_fake_gpus, GiB=GiB)
    run(shell, "big = cuda.tensor(2 * GiB, device=0)")
    spaced(shell)
    for _ in range(3):
        for device in (1, 0):
            run(shell, f"%gpumem config --device {device}")
            spaced(shell)
    out = capsys.readouterr().out
    assert "grew GPU" not in out, out
    assert not monitor(shell).verdicts


def test_a_reading_made_after_the_next_cell_allocated_is_not_the_previous_cells(loaded, capsys,
                                                                                monkeypatch):
    m = monitor(loaded)
    no_sampler_ticks(loaded, monkeypatch)
    loaded.user_ns["tick"] = m.sampler.tick
    for _ in range(3):
        run(loaded, "pass", cell_id="idle")
        # The next cell allocates outside PyTorch, then the sampler's first reading after
        # "pass" lands (in a fast Run All it comes this late).
        run(loaded, "dev.outside += 64 * MiB; cuda._sync(); tick()", cell_id="grows")
    out = capsys.readouterr().out
    assert "cell [" not in out or "outside PyTorch" not in out, out
    assert not [v for v in m.verdicts if v.cell_key == "idle"]


def test_a_reading_made_before_the_previous_cell_ended_is_not_the_next_cells_before(loaded, capsys,
                                                                                    monkeypatch):
    m = monitor(loaded)
    no_sampler_ticks(loaded, monkeypatch)
    for _ in range(3):
        run(loaded, "dev.outside += 64 * MiB; cuda._sync()", cell_id="grows")
        run(loaded, "pass", cell_id="idle")
        m.sampler.tick()
    assert not [v for v in m.verdicts if v.cell_key == "idle"], capsys.readouterr().out


def test_growth_outside_pytorch_is_still_flagged_when_readings_come_between_cells(loaded, capsys,
                                                                                  monkeypatch):
    m = monitor(loaded)
    no_sampler_ticks(loaded, monkeypatch)
    for _ in range(3):
        run(loaded, "dev.outside += 64 * MiB; cuda._sync()", cell_id="grows")
        m.sampler.tick()
        run(loaded, "pass", cell_id="idle")
        m.sampler.tick()
    assert [v.cause for v in m.verdicts if v.cell_key == "grows"] == ["outside PyTorch"]
    assert not [v for v in m.verdicts if v.cell_key == "idle"]


@ipython_8_for("cannot run such a cell: its should_run_async encodes the cell as UTF-8")
def test_a_cell_holding_a_lone_surrogate_is_recorded(loaded, caplog):
    # Found while re-running the closing attack: the cell's key hashed its source as UTF-8,
    # which a lone surrogate cannot be: "pre_run_cell failed" and no record.
    # (not stored in IPython's history, whose own database refuses a lone surrogate)
    loaded.run_cell("s = 'pasted \udcff bytes'", store_history=False)
    assert monitor(loaded).history.records()[-1].source_preview.startswith("s = 'pasted")
    assert not [r for r in caplog.records if "failed (reported once)" in r.getMessage()]


# --------------------------------------------------------------------------------------------
# 6. A failing source
# --------------------------------------------------------------------------------------------
def test_a_reading_that_times_out_shows_unknown_columns_and_one_line(loaded, capsys):
    m = monitor(loaded)

    def timed_out(**_: Any) -> Any:
        raise TimeoutError("NVML call timed out after 1 s")

    m.source.read = timed_out  # type: ignore[method-assign]
    for line in ("%gpumem", "%gpumem summary"):
        result = run(loaded, line)
        assert result.error_in_exec is None, (line, result.error_in_exec)
        out = capsys.readouterr().out
        assert "reading the GPUs failed (TimeoutError: NVML call timed out" in out, out
        assert "show as unknown" in out
    assert "—" in str(_last_snapshot(loaded))


def _last_snapshot(ip: Any) -> Any:
    from gpumem_nb.views import Snapshot

    m = monitor(ip)
    return Snapshot(status=m.status(), sample=m.read())


# --------------------------------------------------------------------------------------------
# 7. Leaks
# --------------------------------------------------------------------------------------------
def statm_fds() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").endswith("/statm"):
                count += 1
        except OSError:
            pass
    return count


def test_reloads_do_not_leave_a_statm_descriptor_each_even_before_collection(shell, no_gpu):
    run(shell, "%load_ext gpumem_nb")
    gc.collect()
    before = statm_fds()
    gc.disable()  # what keeps the old monitors alive for a while in a real kernel
    try:
        for _ in range(20):
            run(shell, "%reload_ext gpumem_nb")
        assert statm_fds() <= before
    finally:
        gc.enable()


def test_unload_inside_a_gpumem_cell_leaves_no_monitor_alive(loaded):
    # This test's own monitor, by weak reference: a scan for every Monitor object failed
    # whenever an earlier test (test_widget's kernel shutdown) left one of its own behind.
    mon = weakref.ref(current_monitor(loaded))
    run(loaded, "%%gpumem\n%unload_ext gpumem_nb")
    assert current_monitor(loaded) is None
    gc.collect()
    assert mon() is None


@pytest.mark.parametrize("line", ["%unload_ext gpumem_nb", "%reload_ext gpumem_nb"])
def test_unloading_inside_a_gpumem_cell_leaves_every_nvml_init_balanced(shell, fake_gpu, line):
    # Before: the cell's closing reading started NVML again on the unloaded monitor's source,
    # one nvmlInit more than nvmlShutdown per such cell (7 after the review's sequence).
    nvml = fake_gpu.nvml
    run(shell, "%load_ext gpumem_nb")
    for _ in range(3):
        run(shell, f"%%gpumem\n{line}")
        if current_monitor(shell) is None:
            run(shell, "%load_ext gpumem_nb")
    run(shell, "%unload_ext gpumem_nb")
    assert nvml.inits == nvml.shutdowns, (nvml.inits, nvml.shutdowns)


# --------------------------------------------------------------------------------------------
# 8. Allocation history never left recording
# --------------------------------------------------------------------------------------------
def test_a_failure_between_arming_and_running_leaves_no_recording_and_the_cell_runs(
        loaded, monkeypatch, capsys):
    m = monitor(loaded)

    def broken(**_: Any) -> Any:
        raise RuntimeError("allocator stats unreadable")

    monkeypatch.setattr(m.cells, "begin", broken)
    result = run(loaded, "%%gpumem --trace\nran = True")
    assert loaded.user_ns["cuda"].history is None  # switched off again
    assert loaded.user_ns.get("ran") is True  # the user's code still ran
    assert result.error_in_exec is None
    assert "runs unmeasured" in capsys.readouterr().out


def test_an_interrupt_between_arming_and_running_switches_recording_off(loaded,
                                                                        monkeypatch):
    m = monitor(loaded)

    def interrupted(**_: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(m.cells, "flush", interrupted)
    run(loaded, "%%gpumem --trace\nran = True")
    assert loaded.user_ns["cuda"].history is None


# --------------------------------------------------------------------------------------------
# 9. Malformed history entries
# --------------------------------------------------------------------------------------------
MALFORMED = [
    None,  # not a dict
    ["alloc", 1, 2],  # a list
    "alloc",  # a string
    {"action": "alloc", "addr": 1, "size": "big", "frames": []},  # size not a number
    {"action": "alloc", "addr": 2, "size": None, "frames": []},
    {"action": "alloc", "addr": 3, "size": 8, "time_us": "later", "frames": []},
    {"action": "alloc", "addr": 4, "size": 8, "frames": [{"filename": "f.py", "line": "x",
                                                         "name": "g"}]},
    {"action": "alloc", "addr": 5, "size": 8, "frames": ["not a frame"]},
    {"action": "alloc", "addr": 6, "size": 8, "frames": 42},
    {"action": "oom", "size": float("nan")},
    {"action": 7, "addr": 8},
    {"action": "alloc", "addr": [9], "size": 8, "frames": []},  # unhashable address
]


def test_malformed_history_entries_are_skipped_and_counted(loaded, capsys):
    cuda = loaded.user_ns["cuda"]
    loaded.user_ns["junk"] = MALFORMED
    result = run(loaded, "%%gpumem --trace\nkeep = cuda.tensor(64 * MiB)\n"
                         "cuda.traces[0].extend(junk)")
    out = capsys.readouterr().out
    assert result.error_in_exec is None, result.error_in_exec
    assert f"{len(MALFORMED)} history entries were not in the form torch writes" in out, out
    assert "top sites at the cell's peak (64.00 MiB" in out
    assert cuda.history is None


def test_analyze_reads_the_good_entries_among_the_malformed_ones():
    good = {"action": "alloc", "addr": 100, "size": 4 * MiB, "time_us": 1.0,
            "frames": [{"filename": "<ipython-input-1-0123456789ab>", "line": 1,
                        "name": "<module>"}]}
    d = trace.analyze([*MALFORMED, good, *MALFORMED])
    assert d.skipped == 2 * len(MALFORMED)
    assert d.allocations == 1 and d.end_bytes == 4 * MiB
    assert trace.analyze(42).entries == 0  # type: ignore[arg-type]


class RaisingGet(dict):  # type: ignore[type-arg]
    """A dict whose own ``get`` raises: only dict's methods may read it."""

    def get(self, *args: Any) -> Any:
        raise RuntimeError("get")


_FRAME = {"filename": "<ipython-input-9-0123456789ab>", "line": 1, "name": "<module>"}
ODD = {  # one odd entry each; before, any of them discarded the whole analysis
    "size 10**400": ({"action": "alloc", "addr": 70, "size": 10**400, "frames": [_FRAME]}, 1),
    "time 10**400": ({"action": "alloc", "addr": 71, "size": 8, "time_us": 10**400,
                      "frames": [_FRAME]}, 1),
    "line 10**5000": ({"action": "alloc", "addr": 72, "size": 8,
                       "frames": [dict(_FRAME, line=10**5000)]}, 1),
    "oom size 10**400": ({"action": "oom", "size": 10**400}, 1),
    # read through dict's own methods: what they hold is torch's form
    "an entry whose get raises": (RaisingGet(action="alloc", addr=73, size=8), 0),
    "a frame whose get raises": ({"action": "alloc", "addr": 74, "size": 8,
                                  "frames": [RaisingGet(_FRAME)]}, 0),
    "line None": ({"action": "alloc", "addr": 75, "size": 8,
                   "frames": [dict(_FRAME, line=None)]}, 0),  # torch's "no line": read
}


@pytest.mark.parametrize("shape", list(ODD))
def test_one_odd_history_entry_does_not_discard_the_whole_trace_analysis(loaded, capsys,
                                                                         shape):
    entry, skipped = ODD[shape]
    loaded.user_ns["odd"] = entry
    result = run(loaded, "%%gpumem --trace\nkeep = cuda.tensor(64 * MiB)\n"
                         "cuda.traces[0].append(odd)")
    out = capsys.readouterr()
    assert result.error_in_exec is None, result.error_in_exec
    assert "could not be read" not in out.out, out.out  # "(OverflowError)" and the like
    assert "top sites at the cell's peak (64.00 MiB" in out.out, out.out
    assert ("1 history entries were not in the form torch writes" in out.out) == bool(skipped)
    assert "Traceback" not in out.out + out.err


# --------------------------------------------------------------------------------------------
# 10. Settings saves
# --------------------------------------------------------------------------------------------
def test_a_save_keeps_the_keys_another_kernel_saved_since_this_one_loaded(private_settings):
    first = Monitor(shell=None, config=settings.load_config())
    second = Monitor(shell=None, config=settings.load_config())  # both loaded the same file
    try:
        second.configure(interval_s=2.0, save=True)
        first.configure(threshold_bytes=GiB, save=True)
        assert json.loads(private_settings.read_text()) == {"interval_s": 2.0,
                                                              "threshold_bytes": GiB}
        cfg, problems = read_config()
        assert (cfg.interval_s, cfg.threshold_bytes, problems) == (2.0, GiB, [])
    finally:
        first.sampler.stop()
        second.sampler.stop()


def test_a_bare_save_writes_what_this_session_changed_and_nothing_it_only_loaded(
        shell, no_gpu, private_settings, capsys):
    run(shell, "%load_ext gpumem_nb")
    run(shell, "%gpumem config --interval 2")
    private_settings.write_text('{"threshold_bytes": 1073741824, "peak": "reset"}')  # elsewhere
    run(shell, "%gpumem config --save")
    assert json.loads(private_settings.read_text()) == {
        "threshold_bytes": GiB, "peak": "reset", "interval_s": 2.0}
    assert "saved interval_s to" in capsys.readouterr().out


def test_a_save_waits_for_another_kernel_holding_the_lock(private_settings):
    private_settings.write_text("{}")
    m = Monitor(shell=None, config=Config())
    held = threading.Event()
    release = threading.Event()

    def other_kernel() -> None:
        with safeio.locked(lock_path(private_settings)):
            held.set()
            release.wait(5.0)
            private_settings.write_text('{"peak": "reset"}')  # its save, under the lock

    t = threading.Thread(target=other_kernel)
    t.start()
    try:
        assert held.wait(5.0)
        saver = threading.Thread(target=lambda: m.configure(interval_s=3.0, save=True))
        saver.start()
        time.sleep(0.3)  # an observation window: the saver may not write while locked out
        assert json.loads(private_settings.read_text()) == {}  # still waiting its turn
        release.set()
        saver.join(5.0)
        assert json.loads(private_settings.read_text()) == {"peak": "reset", "interval_s": 3.0}
    finally:
        release.set()
        t.join(5.0)
        m.sampler.stop()


SAVER = """\
import sys
from gpumem_nb.kernel import Monitor
from gpumem_nb.settings import load_config
m = Monitor(shell=None, config=load_config())
key = sys.argv[1]
for i in range(1, 41):
    if key == "interval":
        m.configure(interval_s=float(i), save=True)
    else:
        m.configure(threshold_bytes=i * 2**20, save=True)
m.sampler.stop()
"""


def test_two_kernels_saving_different_keys_at_once_both_keep_theirs(private_settings,
                                                                   tmp_path):
    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    env = {**os.environ, "GPUMEM_NB_CONFIG": str(private_settings),
           "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    procs = [subprocess.Popen([sys.executable, str(script), key], env=env)
             for key in ("interval", "threshold")]
    for p in procs:
        assert p.wait(120) == 0
    saved = json.loads(private_settings.read_text())
    assert saved == {"interval_s": 40.0, "threshold_bytes": 40 * MiB}


def test_a_settings_file_that_is_not_a_json_object_is_refused_not_overwritten(
        shell, no_gpu, private_settings):
    private_settings.write_text("# my notes, not JSON")
    run(shell, "%load_ext gpumem_nb")
    with pytest.raises(UsageError, match=r"not hold a JSON object.*nothing was changed"):
        shell.run_line_magic("gpumem", "config --interval 2 --save")
    assert private_settings.read_text() == "# my notes, not JSON"
    assert monitor(shell).config.interval_s == 0.5


# --------------------------------------------------------------------------------------------
# 11. Refused values are cut
# --------------------------------------------------------------------------------------------
LONG = "9" * 9_950  # the longest a line may be (10,000 characters) holds this and a command


@pytest.mark.parametrize("line", [
    f"history -n {LONG}", f"config --interval x{LONG}", f"config --threshold {LONG}",
    f"config --peak {LONG}", f"cleanup --vars a,1{LONG}", f"x{LONG}",
    f"watch --replay {LONG}", f"history --csv {LONG}", f"history --bogus{LONG}",
    f"config --device {LONG}",
])
def test_a_refused_value_is_echoed_cut_not_whole(shell, no_gpu, line):
    run(shell, "%load_ext gpumem_nb")
    magic = shell.magics_manager.magics["line"]["gpumem"]  # skips IPython's $var expansion
    with pytest.raises(UsageError) as info:
        magic(line)
    text = str(info.value)
    assert len(text) <= MAX_MESSAGE_CHARS and "…" in text, text[:500]


def test_a_long_refused_value_through_the_shell_is_cut(shell, no_gpu, capsys):
    run(shell, "%load_ext gpumem_nb")
    # IPython's own $-expansion is quadratic in the line's length, so this one is shorter.
    with pytest.raises(UsageError) as info:
        shell.run_line_magic("gpumem", "config --interval x" + "9" * 3000)
    assert len(str(info.value)) <= MAX_MESSAGE_CHARS
    with pytest.raises(UsageError) as info:
        shell.run_cell_magic("gpumem", "--top y" + "9" * 3000, "pass")
    assert len(str(info.value)) <= MAX_MESSAGE_CHARS


@pytest.mark.parametrize(("line", "escaped"), [
    ("who '--\x1b[31mred'", "--\\x1b[31mred"),  # a terminal turned red
    ("who '--\u202eevil'", "--\\u202eevil"),  # the line read backwards
    ("who --gc '--\x1b[2J' -n 3", "--\\x1b[2J"),
    ("whatif '--c=\x1b[2J'", "--c=\\x1b[2J could match"),  # argparse's "ambiguous option"
])
def test_an_escape_typed_in_an_unknown_flag_is_echoed_escaped_not_live(shell, no_gpu, line,
                                                                      escaped):
    run(shell, "%load_ext gpumem_nb")
    with pytest.raises(UsageError) as info:
        shell.run_line_magic("gpumem", line)
    text = str(info.value)
    assert escaped in text and not any(c in text for c in "\x1b\u202e"), ascii(text)


def test_twenty_thousand_unknown_flags_are_refused_at_once(shell, no_gpu):
    # argparse's loop costs the square of the flags it reads, and each unknown flag had its
    # own did-you-mean search: 5,000 flags took 0.46 s, these 20,000 about 8 s.
    run(shell, "%load_ext gpumem_nb")
    magic = shell.magics_manager.magics["line"]["gpumem"]  # skips IPython's $var expansion
    line = "who " + " ".join(f"--f{i}" for i in range(20_000))
    start = time.perf_counter()
    with pytest.raises(UsageError) as info:
        magic(line)
    took_s = time.perf_counter() - start
    assert str(info.value) == ("%gpumem: the line is 168,893 characters long, more than any "
                               "command takes (at most 10,000)")
    assert took_s < hang_guard(1.0), took_s
    # As many flags as a line may hold reach argparse, which reads only the first 200.
    line = "who " + " ".join(f"--f{i}" for i in range(1_300))
    assert len(line) <= 10_000
    start = time.perf_counter()
    with pytest.raises(UsageError) as info:
        magic(line)
    took_s = time.perf_counter() - start
    assert str(info.value).startswith("%gpumem who: unrecognized arguments: --f0 --f1 ")
    assert took_s < hang_guard(1.0), took_s


def test_a_line_of_more_words_than_any_command_takes_is_refused_in_a_sentence(shell, no_gpu):
    run(shell, "%load_ext gpumem_nb")
    with pytest.raises(UsageError) as info:
        shell.run_line_magic("gpumem", "who" + " --gc" * 300)
    assert str(info.value) == ("%gpumem who: 301 words is more than any command takes "
                               "(at most 200)")


def _unknown_flags_line(total: int, flag: str) -> str:
    """``who`` and unknown flags whose message, uncut, is ``total`` characters long."""
    words = [flag]
    room = total - len(f"%gpumem who: unrecognized arguments: {flag}")
    while room > 0:  # a space and a word of 3 to 60 characters, to the character
        size = min(room - 1, 60) if room - 1 - min(room - 1, 60) not in (1, 2, 3) else 50
        words.append("--" + "q" * (size - 2))
        room -= size + 1
    assert room == 0
    return "who " + " ".join(words)


@pytest.mark.parametrize("total", [398, 399, 400, 401, 402, 800])
@pytest.mark.parametrize("flag", ["--zz", "--gcc"])  # --gcc: "did you mean '--gc'?" follows
def test_an_unknown_flags_message_is_at_most_400_characters_hint_included(shell, no_gpu,
                                                                          total, flag):
    run(shell, "%load_ext gpumem_nb")
    with pytest.raises(UsageError) as info:
        shell.run_line_magic("gpumem", _unknown_flags_line(total, flag))
    text = str(info.value)
    assert len(text) <= MAX_MESSAGE_CHARS, len(text)
    if flag == "--gcc":
        assert text.endswith("; did you mean '--gc'?")
    else:  # cut only past the limit, and then to the limit exactly
        assert len(text) == min(total, MAX_MESSAGE_CHARS)
        assert text.endswith("…") == (total > MAX_MESSAGE_CHARS)


def test_whatif_on_a_trace_with_malformed_entries_answers_or_refuses_in_a_sentence(loaded,
                                                                                  capsys):
    loaded.user_ns["junk"] = MALFORMED
    run(loaded, "%%gpumem --trace -q\nkeep2 = cuda.tensor(64 * MiB)\ncuda.traces[0].extend(junk)")
    try:
        loaded.run_line_magic("gpumem", "whatif")
    except UsageError as e:
        assert "Traceback" not in str(e) and len(str(e)) <= MAX_MESSAGE_CHARS
