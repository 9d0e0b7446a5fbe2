"""The extension inside IPython's real shell: loading, hooks, per-cell records, edge cases."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from gpumem_nb.cellnames import counts_ahead_at_start
from gpumem_nb.kernel import current_monitor

from .fakes import GiB, MiB
from .helpers import run_spaced as run


def sampler_threads() -> int:
    """Live sampler threads this test started: an earlier test's sampler that is still
    ending (stuck a few seconds in a hung fake NVML) is not counted (``earlier_threads``)."""
    return sum(t.name == "gpumem_nb-sampler" and t.is_alive() and t not in _EARLIER
               for t in threading.enumerate())


_EARLIER: set[threading.Thread] = set()


@pytest.fixture(autouse=True)
def earlier_threads() -> Any:
    _EARLIER.clear()
    _EARLIER.update(threading.enumerate())
    yield
    _EARLIER.clear()


def test_load_prints_one_line_that_says_there_is_no_gpu(shell, no_gpu, capsys):
    run(shell, "%load_ext gpumem_nb")
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        "gpumem_nb 0.1.0: no GPU visible: no NVIDIA driver on this machine "
        "(libnvidia-ml not found); tracking host RAM. %gpumem? for help."
    ]


def test_load_names_the_gpu_when_there_is_one(shell, fake_gpu, capsys):
    run(shell, "%load_ext gpumem_nb")
    assert "watching GPU 0: NVIDIA H200 141.00 GiB" in capsys.readouterr().out


def test_reload_twenty_times_leaves_one_thread_and_one_set_of_callbacks(shell, no_gpu):
    run(shell, "%load_ext gpumem_nb")
    for _ in range(20):
        run(shell, "%reload_ext gpumem_nb")
    mon = current_monitor(shell)
    assert sampler_threads() == 1
    pre = [f for f in shell.events.callbacks["pre_run_cell"] if "Monitor" in repr(f)]
    post = [f for f in shell.events.callbacks["post_run_cell"] if "Monitor" in repr(f)]
    assert pre == [mon.pre_run_cell] and post == [mon.post_run_cell]


def test_loading_twice_is_harmless(shell, no_gpu):
    from gpumem_nb import load_ipython_extension

    run(shell, "%load_ext gpumem_nb")
    first = current_monitor(shell)
    load_ipython_extension(shell)
    assert current_monitor(shell) is first and sampler_threads() == 1


def test_unload_removes_thread_callbacks_and_magics(shell, no_gpu):
    run(shell, "%load_ext gpumem_nb")
    mon = current_monitor(shell)
    run(shell, "%unload_ext gpumem_nb")
    assert sampler_threads() == 0
    assert mon.pre_run_cell not in shell.events.callbacks["pre_run_cell"]
    assert mon.post_run_cell not in shell.events.callbacks["post_run_cell"]
    assert "gpumem" not in shell.magics_manager.magics["line"]


def test_history_survives_reload(shell, no_gpu):
    run(shell, "%load_ext gpumem_nb")
    run(shell, "a = 1")
    run(shell, "%reload_ext gpumem_nb")
    assert [r.source_preview for r in current_monitor(shell).history.records()][:1] == ["a = 1"]


def test_cell_key_is_the_frontend_cell_id_or_a_source_hash(shell, no_gpu):
    run(shell, "%load_ext gpumem_nb")
    run(shell, "b = 2", cell_id="nbformat-id-7")
    run(shell, "c = 3")
    run(shell, "c = 3")
    keys = [r.cell_key for r in current_monitor(shell).history.records()]
    assert keys[0] == "nbformat-id-7"
    assert keys[1].startswith("src:") and keys[1] == keys[2]


def test_nested_capture_and_run_cell_count_as_one_cell(shell, no_gpu):
    run(shell, "%load_ext gpumem_nb")
    run(shell, "%%capture\nprint('hidden')\nget_ipython().run_cell('d = 4')")
    recs = current_monitor(shell).history.records()
    assert len(recs) == 1 and recs[0].source_preview == "%%capture"


def test_blank_cells_record_nothing_and_print_nothing(shell, no_gpu, capsys):
    run(shell, "%load_ext gpumem_nb")
    capsys.readouterr()
    run(shell, "")
    run(shell, "   \n")
    assert current_monitor(shell).history.records() == []
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err


def test_post_run_cell_with_result_none_is_tolerated(shell, no_gpu):
    run(shell, "%load_ext gpumem_nb")
    mon = current_monitor(shell)
    mon.pre_run_cell(type("Info", (), {"raw_cell": "x", "cell_id": None,
                                       "store_history": True})())
    mon.post_run_cell(None)
    rec = mon.history.records()[-1]
    # IPython >= 9.8 has advanced the count when pre_run_cell fires; older ones have not.
    ahead = 1 if counts_ahead_at_start() else 0
    assert rec.raised is False and rec.execution_count == shell.execution_count - ahead


def test_exceptions_and_keyboard_interrupt_are_recorded_as_raised(shell, no_gpu):
    run(shell, "%load_ext gpumem_nb")
    run(shell, "1/0")
    run(shell, "raise KeyboardInterrupt")
    a, b = current_monitor(shell).history.records()
    assert a.raised and a.error.startswith("ZeroDivisionError")
    assert b.raised and b.error.startswith("KeyboardInterrupt")


def test_a_failing_source_never_puts_a_traceback_on_every_cell(shell, no_gpu, capsys, caplog):
    run(shell, "%load_ext gpumem_nb")
    mon = current_monitor(shell)

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("NVML call failed")

    mon.source.read = broken  # type: ignore[method-assign]
    mon.source.read_hot = broken  # type: ignore[attr-defined]
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        for i in range(3):
            run(shell, f"e = {i}")
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    assert shell.user_ns["e"] == 2
    hooks = [r.getMessage() for r in caplog.records if "run_cell failed" in r.getMessage()]
    assert 1 <= len(hooks) == len(set(m.split(" failed")[0] for m in hooks))  # once per hook
    assert len([r for r in caplog.records if "source failed" in r.getMessage()]) <= 1


def test_records_hold_allocator_and_nvml_before_and_after(shell, fake_gpu):
    run(shell, "%load_ext gpumem_nb")
    shell.user_ns["cuda"] = fake_gpu.cuda
    run(shell, "t = cuda.tensor(1 * 2**30)")
    rec = current_monitor(shell).history.records()[-1]
    d = rec.devices[0]
    assert d.allocated_delta_bytes == GiB and d.reserved_delta_bytes == GiB
    assert d.peak_allocated_bytes == GiB and d.peak_exact
    # The first tensor also brings the CUDA context, which NVML sees and PyTorch does not.
    assert d.nvml_delta_bytes == GiB + 500 * MiB and d.process_delta_bytes == GiB + 500 * MiB
    assert rec.execution_count is not None and rec.duration_s >= 0


def test_transient_peak_is_exact_without_resetting_the_users_counters(shell, fake_gpu):
    run(shell, "%load_ext gpumem_nb")
    shell.user_ns["cuda"] = fake_gpu.cuda
    run(shell, "tmp = cuda.tensor(8 * 2**30); del tmp")
    d = current_monitor(shell).history.records()[-1].devices[0]
    assert (d.peak_allocated_bytes, d.peak_exact, d.allocated_delta_bytes) == (8 * GiB, True, 0)
    assert not [c for c in fake_gpu.cuda.calls if c.startswith("reset_peak")]


def test_peak_below_an_earlier_peak_is_a_lower_bound_not_a_guess(shell, fake_gpu):
    run(shell, "%load_ext gpumem_nb")
    shell.user_ns["cuda"] = fake_gpu.cuda
    run(shell, "tmp = cuda.tensor(8 * 2**30); del tmp")
    run(shell, "keep = cuda.tensor(2**30)")
    d = current_monitor(shell).history.records()[-1].devices[0]
    assert d.peak_exact is False and d.peak_allocated_bytes == GiB


def test_peak_reset_mode_is_exact_every_cell_and_only_resets_when_asked(shell, fake_gpu):
    run(shell, "%load_ext gpumem_nb")
    shell.user_ns["cuda"] = fake_gpu.cuda
    run(shell, "tmp = cuda.tensor(8 * 2**30); del tmp")
    assert not [c for c in fake_gpu.cuda.calls if c.startswith("reset_peak")]
    run(shell, "%gpumem config --peak reset")
    run(shell, "tmp = cuda.tensor(2**30); del tmp")
    d = current_monitor(shell).history.records()[-1].devices[0]
    assert (d.peak_allocated_bytes, d.peak_exact) == (GiB, True)
    assert "reset_peak_memory_stats(0)" in fake_gpu.cuda.calls


def test_peak_reset_is_never_attempted_before_cuda_is_initialised(shell, fake_gpu):
    fake_gpu.cuda.initialized = False
    run(shell, "%load_ext gpumem_nb")
    run(shell, "%gpumem config --peak reset")
    run(shell, "x = 1")  # the fake raises if reset would initialise CUDA
    assert not [c for c in fake_gpu.cuda.calls if c.startswith("reset_peak")]


def test_sampled_nvml_peak_covers_what_happened_inside_a_long_cell(shell, fake_gpu):
    run(shell, "%load_ext gpumem_nb")
    mon = current_monitor(shell)
    mon.sampler.stop()
    shell.user_ns.update(cuda=fake_gpu.cuda, tick=mon.sampler.tick)
    run(shell, "tmp = cuda.tensor(4 * 2**30); tick(); del tmp; cuda.empty_cache()")
    mon.sampler.tick()  # the reading after the cell, which completes its NVML figures
    d = mon.history.records()[-1].devices[0]
    assert d.nvml_peak_bytes == 500 * MiB + 4 * GiB
    assert d.nvml_used_after_bytes == 500 * MiB


def test_a_second_gpu_the_notebook_never_touches_gets_no_rows(shell, two_fake_gpus):
    run(shell, "%load_ext gpumem_nb")
    shell.user_ns["cuda"] = two_fake_gpus
    run(shell, "t = cuda.tensor(2**30)")
    rec = current_monitor(shell).history.records()[-1]
    # Never read either: a GPU without this process's context costs the hooks nothing.
    assert [d.index for d in rec.devices] == [0]
    assert [d.index for d in rec.shown_devices()] == [0]


def test_a_cell_run_before_the_samplers_next_reading_shows_nvml_after_as_unknown(shell, fake_gpu):
    # nbclient runs cells back to back: the sampler has not read NVML since the cell ended, so
    # the record must say "unknown" rather than carry the reading from before the cell.
    shell.run_cell("%load_ext gpumem_nb")
    shell.user_ns["cuda"] = fake_gpu.cuda
    shell.run_cell("t = cuda.tensor(2**30)", store_history=True)
    shell.run_cell("u = 1", store_history=True)  # no tick in between
    rec = next(r for r in current_monitor(shell).history.records()
               if r.source_preview.startswith("t ="))
    d = rec.devices[0]
    assert d.nvml_used_after_bytes is None or d.nvml_used_after_bytes >= GiB


def test_reset_peak_cell_magic_makes_the_cells_own_record_exact(shell, fake_gpu):
    run(shell, "%load_ext gpumem_nb")
    shell.user_ns["cuda"] = fake_gpu.cuda
    run(shell, "big = cuda.tensor(8 * 2**30); del big")
    run(shell, "%%gpumem --reset-peak -q\ntmp = cuda.tensor(2**30); del tmp")
    d = current_monitor(shell).history.records()[-1].devices[0]
    assert (d.peak_allocated_bytes, d.peak_exact) == (GiB, True)
