"""Every %gpumem subcommand, every bad input, and the re-run / cleanup stories end to end."""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest
from IPython.core.error import UsageError

from gpumem_nb.analysis import (
    CAUSE_CACHE,
    CAUSE_LIVE_TENSORS,
    CAUSE_OUTSIDE,
    DEFAULT_THRESHOLD_BYTES,
    classify,
)
from gpumem_nb.kernel import current_monitor
from gpumem_nb.settings import PEAK_PRESERVE
from gpumem_nb.views import CellReport

from .fakes import GiB, MiB
from .helpers import magic
from .helpers import run_spaced as run


# -- help and status ---------------------------------------------------------------------------
def test_question_mark_help_lists_every_subcommand(loaded):
    doc = loaded.find_line_magic("gpumem").__doc__
    for word in ("history", "who", "cleanup", "config", "summary", "start", "watch",
                 "%%gpumem"):
        assert word in doc


def parser_words() -> list[tuple[str, str]]:
    """(subcommand, flag) for every flag the parsers accept: the truth the help must tell."""
    import argparse

    from gpumem_nb.ipython.commands import build_cell_parser as _build_cell_parser
    from gpumem_nb.ipython.commands import build_line_parser as _build_parser

    words = []
    for action in _build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                words.append((name, ""))
                words += [(name, flag) for a in sub._actions for flag in a.option_strings]
    words += [("%%gpumem", flag) for a in _build_cell_parser()._actions
              for flag in a.option_strings]
    return words


def test_help_names_every_subcommand_and_flag_the_parser_accepts(loaded):
    doc = loaded.find_line_magic("gpumem").__doc__
    sections = {}
    for block in doc.split("\n  %")[1:]:
        head = block.split()[0].lstrip("%")
        sections["%%gpumem" if head == "gpumem" and block.startswith("%gpumem") else
                 block.split()[1] if head == "gpumem" else head] = block
    missing = [(sub, flag) for sub, flag in parser_words()
               if sub not in sections or (flag and flag not in sections[sub])]
    assert missing == []


def test_the_dead_traceback_flag_is_gone_from_help_and_parser(loaded):
    assert "--traceback " not in loaded.find_line_magic("gpumem").__doc__.replace(
        "--keep-traceback", "")
    assert ("cleanup", "--traceback") not in parser_words()


def test_dash_h_after_a_subcommand_prints_its_help_and_changes_nothing(loaded, capsys):
    mon = current_monitor(loaded)
    magic(loaded, "config --interval 2 -h")
    out = capsys.readouterr().out
    assert "%gpumem config" in out and "--threshold SIZE" in out and "history" not in out
    assert mon.config.interval_s == 0.5


def test_status_shows_nvml_allocator_and_outside_pytorch(loaded, capsys):
    run(loaded, "t = cuda.tensor(2**30)")
    capsys.readouterr()
    magic(loaded, "")
    out = capsys.readouterr().out
    assert "NVML used / total" in out and "outside PyTorch" in out
    assert "1.49 GiB / 141.00 GiB" in out  # 500 MiB context + 1 GiB reserved
    assert "500.00 MiB" in out  # the context, outside PyTorch


def test_status_says_whether_the_oom_observer_is_attached(loaded, capsys):
    run(loaded, "t = cuda.tensor(2**30)")
    capsys.readouterr()
    magic(loaded, "status")
    assert "OOM observer: attached." in capsys.readouterr().out


def test_status_without_a_gpu_says_there_is_no_observer_rather_than_nothing(
        shell, no_gpu, capsys):
    shell.run_cell("%load_ext gpumem_nb")
    capsys.readouterr()
    magic(shell, "status")
    out = capsys.readouterr().out
    assert "OOM observer: none, as no GPU is visible." in out
    assert "queued" not in out  # nothing waits for a CUDA that cannot start


# -- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("config --interval -1", "between 0.05 and 60 seconds"),
        ("config --interval soon", "invalid float value"),
        ("config --device 99", "there is no GPU 99: this process sees GPU 0"),
        ("config --device first", "takes a GPU number or 'all'"),
        ("config --threshold lots", "'lots' is not a size"),
        ("config --peak sometimes", "invalid choice"),
        ("frobnicate", "has no subcommand 'frobnicate'"),
        ("cleanup --vars nope", "no variable named 'nope'"),
        ("cleanup --vars 'a b'", "--vars takes variable names"),
        ("history -n 0", "-n must be a positive number"),
        ("who -n -3", "-n must be a positive number"),
        ("history --bogus", "unrecognized arguments"),
        ("config --interval '1", "could not read the arguments"),
        ("config --threshold 1e400", "too large a size"),
        ("config --threshold 2PB", "not a size"),
        ("config --threshold 1e30", "between 0 B and 1024.00 TiB"),
        ("config --interval nan", "between 0.05 and 60 seconds"),
        ("config --interval 1e400", "between 0.05 and 60 seconds"),
        ("config --device -1", "takes a GPU number or 'all'"),
        ("config --device " + "9" * 5000, "takes a GPU number or 'all'"),
        ("history --csv 'a\0b'", "contains a NUL character"),
        ("history --csv ''", "empty file name"),
        ("watch --replay 'a\0b'", "contains a NUL character"),
        ("cleanup --traceback", "unrecognized arguments: --traceback"),
        ("'a b'", "has no subcommand 'a b'"),
        ('config "--interval', "could not read the arguments"),
    ],
)
def test_bad_input_is_a_usage_error_with_a_sentence_and_changes_nothing(loaded, line, message):
    mon = current_monitor(loaded)
    before = (mon.config.interval_s, mon.config.device, mon.config.threshold_bytes,
              mon.config.peak, sorted(loaded.user_ns))
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        magic(loaded, line)
    after = (mon.config.interval_s, mon.config.device, mon.config.threshold_bytes,
             mon.config.peak, sorted(loaded.user_ns))
    assert after == before


def test_a_bad_value_among_good_ones_applies_none_of_them(loaded):
    mon = current_monitor(loaded)
    with pytest.raises(UsageError):
        magic(loaded, "config --interval 2 --threshold lots")
    assert mon.config.interval_s == 0.5 and mon.sampler.interval_s == 0.5


def test_config_applies_interval_threshold_device_and_peak(loaded, capsys):
    magic(loaded, "config --interval 2 --threshold 64MiB --device 0 --peak reset")
    mon = current_monitor(loaded)
    assert (mon.sampler.interval_s, mon.tracker.threshold_bytes, mon.config.device,
            mon.config.peak) == (2.0, 64 * MiB, 0, "reset")
    assert "64.00 MiB" in capsys.readouterr().out
    magic(loaded, "config --device all --peak preserve")
    assert mon.config.device is None and mon.config.peak == PEAK_PRESERVE


# -- history -----------------------------------------------------------------------------------
def test_history_exports_to_dataframe_and_csv(loaded, tmp_path):
    run(loaded, "t = cuda.tensor(2**30)")
    run(loaded, "u = 1")
    df = magic(loaded, "history -o")
    assert list(df["allocated_delta_bytes"])[-2:] == [GiB, 0]
    magic(loaded, f"history --csv {tmp_path / 'h.csv'}")
    text = (tmp_path / "h.csv").read_text().splitlines()
    assert text[0].startswith("execution_count,cell_key,source")
    assert len(text) == 1 + len(df)


def test_history_table_shows_the_last_n_cells(loaded, capsys):
    for i in range(5):
        run(loaded, f"v{i} = {i}")
    capsys.readouterr()
    magic(loaded, "history -n 2")
    out = capsys.readouterr().out
    assert "Last 2 of 5 cells" in out and "v4 = 4" in out and "v2 = 2" not in out


def test_gpumem_nb_history_returns_a_dataframe(loaded):
    import gpumem_nb

    run(loaded, "w = 1")
    df = gpumem_nb.history()
    assert df.iloc[-1]["source"] == "w = 1"


# -- re-run accumulation -----------------------------------------------------------------------
def test_rerun_kept_alive_by_out_is_flagged_as_live_tensors_held_by_out(loaded, capsys):
    cell = "y = cuda.tensor(64 * 2**20)\ny"
    for _ in range(3):
        run(loaded, cell, cell_id="cell-y")
    out = capsys.readouterr().out
    flags = [ln for ln in out.splitlines() if ln.startswith("gpumem: cell")]
    assert len(flags) == 1  # once two re-runs in a row have grown
    assert "64.00 MiB again on run 3 (live tensors)" in flags[0]
    assert "Held by: Out[" in flags[0] and "%gpumem cleanup --out" in flags[0]
    verdict = current_monitor(loaded).verdicts[-1]
    assert verdict.holders[0].kind == "output cache"


def test_rerun_that_replaces_its_variable_is_not_flagged(loaded, capsys):
    # Run 2 holds old and new tensor at once, so the cache doubles once: not accumulation.
    for _ in range(4):
        run(loaded, "z = cuda.tensor(64 * 2**20)", cell_id="cell-z")
    assert "gpumem: cell" not in capsys.readouterr().out
    m = current_monitor(loaded)
    assert list(m.verdicts) == []
    # The decision behind the silence: only one re-run grew, and only once is not a pattern.
    runs = [r for r in m.history.records() if r.source_preview.startswith("z = ")]
    grew = [classify(r.devices[0], m.tracker.threshold_bytes) is not None for r in runs[1:]]
    assert len(runs) == 4 and grew.count(True) <= 1, grew


def test_rerun_growing_only_the_cache_is_called_cache(loaded, capsys, fake_gpu):
    loaded.user_ns["dev"] = fake_gpu.cuda.devices[0]
    for _ in range(3):
        run(loaded, "dev.reserved += 256 * 2**20; cuda._sync()", cell_id="cell-c")
    out = capsys.readouterr().out
    assert "(cache)" in out and "Held by" not in out
    verdict = current_monitor(loaded).verdicts[-1]
    assert verdict.cause == CAUSE_CACHE and verdict.holders == ()


def test_rerun_growing_memory_outside_pytorch_is_called_that(loaded, capsys, fake_gpu):
    loaded.user_ns["dev"] = fake_gpu.cuda.devices[0]
    for _ in range(3):
        run(loaded, "dev.outside += 256 * 2**20; cuda._sync()", cell_id="cell-o")
    assert "(outside PyTorch)" in capsys.readouterr().out
    assert current_monitor(loaded).verdicts[-1].cause == CAUSE_OUTSIDE


def test_cell_that_raises_after_allocating_is_flagged_as_held_by_the_traceback(loaded, capsys):
    cell = "def f():\n    big = cuda.tensor(2**30)\n    raise ValueError('boom')\nf()"
    run(loaded, cell)
    out = capsys.readouterr().out
    assert "and raised (live tensors)" in out
    assert "traceback: f() locals" in out and "%gpumem cleanup` drops" in out


def test_threshold_setting_silences_small_growth(loaded, capsys):
    magic(loaded, "config --threshold 128MiB")
    for _ in range(3):
        run(loaded, "y = cuda.tensor(64 * 2**20)\ny", cell_id="small")
    assert "gpumem: cell" not in capsys.readouterr().out
    m = current_monitor(loaded)
    assert list(m.verdicts) == [] and m.tracker.threshold_bytes == 128 * MiB
    # The growth was there (Out keeps each run's tensor): the threshold is what silenced it.
    runs = [r for r in m.history.records() if r.source_preview.startswith("y = ")]
    assert [classify(r.devices[0], DEFAULT_THRESHOLD_BYTES) for r in runs[1:]] == [
        (CAUSE_LIVE_TENSORS, 64 * MiB)] * 2
    assert [classify(r.devices[0], 128 * MiB) for r in runs[1:]] == [None] * 2


# -- who ---------------------------------------------------------------------------------------
def test_who_lists_variables_out_and_traceback_largest_first(loaded, capsys):
    run(loaded, "a = cuda.tensor(2**30)")
    run(loaded, "cuda.tensor(3 * 2**30)")  # only Out keeps it
    run(loaded, "def g():\n    tmp = cuda.tensor(2 * 2**30)\n    1/0\ng()")
    report = magic(loaded, "who -o")
    kinds = [(h.kind, h.nbytes) for h in report.holders]
    assert kinds[:3] == [("output cache", 3 * GiB), ("traceback", 2 * GiB), ("variable", GiB)]
    assert report.holders[0].name.startswith("Out[")
    assert report.holders[1].name == "traceback: g() locals"
    assert report.holders[2].name == "a"


# -- cleanup -----------------------------------------------------------------------------------
def test_default_cleanup_frees_the_traceback_and_empties_the_cache(loaded, fake_gpu):
    run(loaded, "def f():\n    big = cuda.tensor(2**30)\n    raise ValueError\nf()")
    assert fake_gpu.cuda.devices[0].allocated == GiB
    report = magic(loaded, "cleanup -o")
    steps = {s.step: s for s in report.steps}
    assert steps["last exception"].freed_allocated_bytes == GiB
    assert steps["empty_cache"].freed_reserved_bytes == GiB
    assert report.freed_nvml_bytes == GiB
    assert fake_gpu.cuda.devices[0].allocated == 0


def test_cleanup_out_frees_tensors_held_only_by_the_output_cache(loaded, fake_gpu):
    for _ in range(3):
        run(loaded, "y = cuda.tensor(64 * 2**20)\ny", cell_id="cell-y")
    report = magic(loaded, "cleanup --out -o")
    steps = {s.step: s for s in report.steps}
    assert steps["output cache"].freed_allocated_bytes == 2 * 64 * MiB
    assert fake_gpu.cuda.devices[0].allocated == 64 * MiB  # `y` itself is the user's data


def test_cleanup_never_deletes_a_variable_that_was_not_named(loaded, fake_gpu):
    run(loaded, "keep_t = cuda.tensor(2**30); keep_list = [cuda.tensor(2**20)]; n = 5")
    run(loaded, "drop_me = cuda.tensor(2**30)")
    run(loaded, "keep_t")
    user_vars = {k: v for k, v in loaded.user_ns.items()
                 if not k.startswith("_") and k not in ("In", "Out", "exit", "quit",
                                                         "get_ipython")}
    magic(loaded, "cleanup --out --vars drop_me")
    for name, value in user_vars.items():
        if name == "drop_me":
            assert name not in loaded.user_ns
        else:
            assert loaded.user_ns[name] is value, name


def test_cleanup_dry_run_changes_nothing_and_estimates(loaded, fake_gpu):
    run(loaded, "x = cuda.tensor(2**30)")
    run(loaded, "x")
    out_before = dict(loaded.user_ns["Out"])
    report = magic(loaded, "cleanup --dry-run --out --vars x -o")
    assert report.dry_run and "empty_cache" not in fake_gpu.cuda.calls
    assert dict(loaded.user_ns["Out"]) == out_before and "x" in loaded.user_ns
    est = {s.step: s.freed_allocated_bytes for s in report.steps}
    assert est["variables"] == GiB  # x is attributed to the variable, not to Out


def test_cleanup_from_another_thread_while_a_cell_runs_is_refused(loaded):
    mon = current_monitor(loaded)
    results: list[str] = []

    def click() -> None:
        try:
            magic(loaded, "cleanup")
            results.append("ran")
        except UsageError as e:
            results.append(str(e))

    loaded.user_ns["click"] = click
    loaded.user_ns["threading"] = threading
    run(loaded, "th = threading.Thread(target=click); th.start(); th.join()")
    assert results == ["a cell is running; cleanup waits until it finishes"]
    assert mon.busy_elsewhere() is False


# -- %%gpumem ----------------------------------------------------------------------------------
def test_cell_magic_reports_the_exact_transient_peak(loaded, capsys):
    run(loaded, "%%gpumem -o\ntmp = cuda.tensor(8 * 2**30)\ndel tmp")
    report = loaded.user_ns["_"]
    assert isinstance(report, CellReport)
    assert report.peak_allocated_bytes == 8 * GiB
    assert "peak 8.00 GiB (exact)" in capsys.readouterr().out


def test_cell_magic_record_carries_its_own_cell_number_not_the_next(loaded):
    """IPython 9 advances execution_count as a cell starts: read during the cell, the shell's
    counter is the next cell's number, and the record disagreed with the history by one."""
    result = run(loaded, "%%gpumem -q -o\ntmp = cuda.tensor(2**30)\ndel tmp")
    measured = loaded.user_ns["_"].record
    numbers = [r.execution_count for r in current_monitor(loaded).history.records()]
    assert measured.execution_count == result.execution_count == numbers[-1]


def test_cell_magic_reads_nvml_itself_not_the_samplers_reading_from_before_the_cell(loaded):
    """The tutorials' review (H1): a cell shorter than the sampling interval printed the
    sampler's last NVML reading, taken before it, as its "NVML peak" (3.25 MiB after CUDA
    started, 21.62 MiB with 8 GiB reserved)."""
    run(loaded, "warm = cuda.tensor(1)")  # the CUDA context, in a cell of its own
    current_monitor(loaded).sampler.stop()  # no reading lands during the next cell
    run(loaded, "%%gpumem -q -o\nkeep = cuda.tensor(2 * 2**30)")
    d = loaded.user_ns["_"].record.devices[0]
    assert d.nvml_used_after_bytes - d.nvml_used_before_bytes == 2 * GiB
    assert d.nvml_peak_bytes == d.nvml_used_after_bytes


def test_an_error_in_a_measured_cell_is_stored_under_that_cells_number(loaded, capsys):
    """The nested run compiles the cell under the shell's next number: cleanup said the
    OutOfMemoryError of cell [14] for one raised in In [13]."""
    from gpumem_nb.holders import stored_cell_exception

    result = run(loaded, "%%gpumem -q\nraise ValueError('in the measured cell')")
    stored = stored_cell_exception(loaded, current_monitor(loaded).last_cell_exception)
    assert stored is not None and stored.execution_count == result.execution_count


def test_cell_magic_quiet_prints_nothing_and_keeps_ipython_semantics(loaded, capsys):
    run(loaded, "%%gpumem -q\nq = 41 + 1\nq")
    out = capsys.readouterr().out
    assert "gpumem:" not in out and "42" in out and loaded.user_ns["q"] == 42


def test_cell_magic_for_a_gpu_this_machine_lacks_still_runs_the_cell(loaded, capsys):
    loaded.run_cell_magic("gpumem", "--device 3", "ran = 1")
    lines = capsys.readouterr().out.splitlines()
    assert loaded.user_ns["ran"] == 1
    assert lines[0] == ("gpumem: --device 3: there is no GPU 3: this process sees GPU 0; "
                        "the cell runs all the same, measured without that GPU.")
    assert "GPU 0" not in lines[1]  # the report is of GPU 3 only, which is not there


def test_cell_magic_device_that_is_not_a_number_is_a_usage_error(loaded):
    with pytest.raises(UsageError, match="argument --device: invalid int value"):
        loaded.run_cell_magic("gpumem", "--device first", "pass")


# -- summary, start/stop -----------------------------------------------------------------------
def test_summary_explains_fragmentation_with_a_hint(loaded, fake_gpu, capsys):
    d = fake_gpu.cuda.devices[0]
    d.reserved, d.allocated, d.inactive_split = 4 * GiB, 2 * GiB, GiB
    magic(loaded, "summary")
    out = capsys.readouterr().out
    assert "cached free blocks" in out and "expandable_segments:True" in out


def test_stop_and_start_control_the_sampler(loaded):
    mon = current_monitor(loaded)
    magic(loaded, "stop")
    assert not mon.sampler.running
    magic(loaded, "start")
    assert mon.sampler.running


# -- no GPU, no torch --------------------------------------------------------------------------
def test_without_gpu_or_torch_who_and_cleanup_still_work_for_cpu_objects(shell, no_gpu, capsys):
    import numpy as np

    run(shell, "%load_ext gpumem_nb")
    shell.user_ns["arr"] = np.zeros(10**6)
    report = magic(shell, "who -o")
    assert [(h.name, h.device, h.nbytes) for h in report.holders] == [("arr", "cpu", 8 * 10**6)]
    cleaned = magic(shell, "cleanup -o")
    assert [s.step for s in cleaned.steps][-1] == "empty_cache"
    assert "torch" not in sys.modules


def test_status_names_sampler_errors_that_were_only_logged(loaded, capsys, fake_gpu):
    mon = current_monitor(loaded)
    mon.sampler.stop()
    fake_gpu.gpu.lost = True
    fake_gpu.cuda.initialized = False
    real = mon.source.read

    def lost(**kw: Any) -> Any:
        raise RuntimeError("GPU is lost")

    mon.source.read = lost  # type: ignore[method-assign]
    mon.sampler.tick()
    mon.source.read = real  # type: ignore[method-assign]
    capsys.readouterr()
    magic(loaded, "")
    out = capsys.readouterr().out
    assert "The sampler hit 1 error(s); the last: source: RuntimeError: GPU is lost" in out
    assert "lost" in out.splitlines()[2]  # the device row shows the placeholder


# -- the monitor owns the settings (issue 7) ---------------------------------------------------
def test_only_the_monitor_writes_interval_threshold_and_device_selection():
    """Nobody outside the monitor (kernel/monitor.py, and kernel/cells.py for the device
    selection its settings apply) assigns sampler.interval_s, tracker.threshold_bytes or
    source.selected (an object's own __init__ may set its own field)."""
    import ast
    from pathlib import Path

    import gpumem_nb

    owned = {"interval_s", "threshold_bytes", "selected", "threshold"}
    offenders = []
    for path in Path(gpumem_nb.__file__).parent.rglob("*.py"):
        if path.parent.name == "kernel" and path.name in ("monitor.py", "cells.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else [])
            for t in targets:
                if (isinstance(t, ast.Attribute) and t.attr in owned
                        and not (isinstance(t.value, ast.Name) and t.value.id == "self")):
                    offenders.append(f"{path.name}:{node.lineno} {ast.unparse(t)}")
    assert offenders == []


def test_config_device_switches_what_the_source_reads(shell, two_fake_gpus):
    run(shell, "%load_ext gpumem_nb")
    mon = current_monitor(shell)
    magic(shell, "config --device 1")
    assert [d.index for d in mon.read().devices] == [1]
    magic(shell, "config --device all")
    assert [d.index for d in mon.read().devices] == [0, 1]


def test_configure_checks_everything_before_applying_anything(loaded):
    from gpumem_nb.settings import SettingsError

    mon = current_monitor(loaded)
    for bad in ({"interval_s": 2, "threshold_bytes": -5}, {"interval_s": 2, "device": 7},
                {"interval_s": 2, "peak": "sometimes"}, {"interval_s": 2, "auto_show": "off"},
                {"threshold_bytes": 64 * MiB, "interval_s": float("nan")},
                {"interval_s": 2, "device": True}, {"interval_s": True}):
        with pytest.raises(SettingsError):
            mon.configure(**bad)
        assert (mon.config.interval_s, mon.sampler.interval_s) == (0.5, 0.5)
        assert mon.config.threshold_bytes == mon.tracker.threshold_bytes == 16 * MiB
        assert mon.config.device is None and mon.source.selected is None


def test_configure_keeps_the_device_unless_asked_and_none_means_every_gpu(shell, two_fake_gpus):
    run(shell, "%load_ext gpumem_nb")
    mon = current_monitor(shell)
    assert mon.configure(device=1).device == 1
    assert mon.configure(interval_s=2).device == 1 and list(mon.source.selected) == [1]
    assert mon.configure(device=None).device is None and mon.source.selected is None


def test_configure_save_failure_raises_and_applies_nothing(loaded, private_settings):
    mon = current_monitor(loaded)
    private_settings.write_text("[1]")  # not an object of settings: the save is refused
    with pytest.raises(OSError):
        mon.configure(interval_s=2, save=True)
    assert mon.config.interval_s == mon.sampler.interval_s == 0.5


def test_settings_listeners_hear_every_change_and_a_raising_one_is_reported_once(loaded, caplog):
    import logging

    mon = current_monitor(loaded)
    heard = []

    def broken(cfg: Any) -> None:
        raise RuntimeError(f"boom at {len(heard)}")  # a new text every time

    mon.settings_listeners.extend([broken, heard.append])
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        for interval in (1.0, 2.0, 3.0):
            magic(loaded, f"config --interval {interval}")
    assert [c.interval_s for c in heard] == [1.0, 2.0, 3.0]
    heard[0].interval_s = 99.0  # a listener's copy is its own
    assert mon.config.interval_s == 3.0
    assert len([r for r in caplog.records if "settings listener" in r.getMessage()]) == 1


# -- %gpumem history --csv: a path the user names is written, never what it points at --------
def test_history_csv_never_writes_through_a_symlink(loaded, tmp_path):
    victim = tmp_path / "notes.txt"
    victim.write_text("precious")
    link = tmp_path / "h.csv"
    link.symlink_to(victim)
    with pytest.raises(UsageError, match="symbolic link"):
        magic(loaded, f"history --csv {link}")
    assert victim.read_text() == "precious"


def test_history_csv_to_a_fifo_is_refused_without_blocking(loaded, tmp_path):
    import os

    from .test_safeio import finishes

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="FIFO"):
        finishes(lambda: magic(loaded, f"history --csv {fifo}"), fifo)


def test_history_csv_writes_under_the_home_directory_a_tilde_names(loaded, tmp_path,
                                                                    monkeypatch, capsys):
    # "~/x.csv" answered "No such file or directory", though --trace and --save expand it.
    monkeypatch.setenv("HOME", str(tmp_path))
    magic(loaded, "history --csv ~/cells.csv")
    assert (tmp_path / "cells.csv").read_text().startswith("execution_count")
    assert f"to {tmp_path / 'cells.csv'}" in capsys.readouterr().out


# -- loading and reloading ---------------------------------------------------------------------
def sampler_threads() -> int:
    return sum(t.name == "gpumem_nb-sampler" and t.is_alive() for t in threading.enumerate())


def test_a_load_failing_after_the_sampler_started_leaves_no_thread(shell, no_gpu, monkeypatch):
    before = sampler_threads()

    def fail(*a: Any, **kw: Any) -> None:
        assert sampler_threads() == before + 1  # the failure really comes after the start
        raise RuntimeError("injected")

    monkeypatch.setattr(shell, "register_magics", fail)
    for _ in range(3):
        with pytest.raises(RuntimeError, match="injected"):
            shell.extension_manager.load_extension("gpumem_nb")
    assert sampler_threads() == before
    assert current_monitor(shell) is None
    for event in ("pre_run_cell", "post_run_cell"):
        assert not [f for f in shell.events.callbacks[event]
                    if "Monitor" in getattr(f, "__qualname__", "")]
    monkeypatch.undo()
    run(shell, "%load_ext gpumem_nb")
    assert sampler_threads() == before + 1


def live_monitors() -> int:
    import gc

    from gpumem_nb.kernel import Monitor

    gc.collect()
    return sum(isinstance(o, Monitor) for o in gc.get_objects())


def open_fds() -> int:
    import os

    return len(os.listdir("/proc/self/fd"))


def open_widgets() -> int:
    from ipywidgets.widgets import widget

    return len(widget._instances)  # every widget not yet closed (ipywidgets' registry)


def reloads_stay_flat(shell: Any, times: int) -> None:
    """Load, warm up, reload ``times`` times: one more live monitor than before, one sampler
    thread, one registered magics object, and no file descriptor or open widget more than
    after warm-up."""
    monitors = live_monitors()  # earlier tests' monitors, if any are still referenced
    run(shell, "%load_ext gpumem_nb")
    for _ in range(3):  # warm up: first-use imports and caches open what they keep
        run(shell, "%reload_ext gpumem_nb")
    fds, widgets = open_fds(), open_widgets()
    for _ in range(times):
        assert run(shell, "%reload_ext gpumem_nb").success
    assert live_monitors() == monitors + 1
    assert open_fds() <= fds
    assert open_widgets() <= widgets
    assert sampler_threads() == 1
    assert sum(type(c).__name__ == "GpumemMagics" for c in shell.configurables) == 1


def test_reload_ext_keeps_monitors_and_file_descriptors_flat_over_50_reloads(shell, no_gpu):
    reloads_stay_flat(shell, 50)


def test_reload_ext_with_the_chart_shown_keeps_monitors_flat(shell, no_gpu, private_settings):
    private_settings.write_text('{"auto_show": true}')
    reloads_stay_flat(shell, 20)
    assert current_monitor(shell).widget is not None


def test_unload_leaves_nothing_that_references_the_monitor(shell, no_gpu):
    monitors = live_monitors()
    run(shell, "%load_ext gpumem_nb")
    run(shell, "%unload_ext gpumem_nb")
    assert live_monitors() == monitors
    assert not [c for c in shell.configurables if type(c).__name__ == "GpumemMagics"]
    assert "GpumemMagics" not in shell.magics_manager.registry
