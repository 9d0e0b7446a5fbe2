"""Settings survive sessions; auto-show works from the file and the environment; a broken
settings file never stops the extension from loading."""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError

from gpumem_nb.analysis import DEFAULT_THRESHOLD_BYTES
from gpumem_nb.kernel import current_monitor
from gpumem_nb.settings import (
    CHECKS,
    MAX_SETTINGS_BYTES,
    Config,
    SettingsError,
    load_config,
    parse_config,
    read_config,
)

from .fakes import MiB
from .helpers import run, spaced


def test_saved_settings_apply_to_the_next_session(shell, no_gpu, private_settings):
    run(shell, "%load_ext gpumem_nb")
    run(shell, "%gpumem config --interval 2 --threshold 64MiB --peak reset --save")
    saved = json.loads(private_settings.read_text())
    # Only the keys the command set: the file's other keys may be another kernel's.
    assert saved == {"interval_s": 2.0, "threshold_bytes": 64 * MiB, "peak": "reset"}
    run(shell, "%unload_ext gpumem_nb")
    delattr(shell, "_gpumem_nb_config")  # a new kernel has no settings in memory
    run(shell, "%load_ext gpumem_nb")
    mon = current_monitor(shell)
    assert (mon.sampler.interval_s, mon.tracker.threshold_bytes, mon.config.peak) == (
        2.0, 64 * MiB, "reset")


def test_auto_show_setting_shows_the_chart_on_load(shell, no_gpu, private_settings):
    private_settings.write_text(json.dumps({"auto_show": True}))
    run(shell, "%load_ext gpumem_nb")
    assert current_monitor(shell).widget is not None


def test_auto_show_environment_variable_shows_the_chart_on_load(shell, no_gpu, monkeypatch):
    monkeypatch.setenv("GPUMEM_NB_AUTO_SHOW", "1")
    run(shell, "%load_ext gpumem_nb")
    assert current_monitor(shell).widget is not None


def test_a_broken_settings_file_is_ignored_with_one_warning(shell, no_gpu, private_settings,
                                                            caplog):
    private_settings.write_text('{"interval_s": -5, "peak": "sometimes"')
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        result = run(shell, "%load_ext gpumem_nb")
    assert result.success and current_monitor(shell).sampler.interval_s == 0.5
    assert len([r for r in caplog.records if "ignored" in r.getMessage()]) == 1


def test_settings_with_out_of_range_values_are_ignored(shell, no_gpu, private_settings, caplog):
    private_settings.write_text(json.dumps({"interval_s": 0.001}))
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        run(shell, "%load_ext gpumem_nb")
    assert current_monitor(shell).sampler.interval_s == 0.5


# -- issue 8: a settings file never stops the extension from loading ---------------------------
def sampler_threads() -> int:
    return sum(t.name == "gpumem_nb-sampler" and t.is_alive() for t in threading.enumerate())


def problems(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "gpumem_nb" and r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("[]", "holds a list"),
        ("null", "holds null"),
        ('"interval_s"', "holds a string"),
        ("3", "holds a number"),
        ('{"interval_s": 2', "not valid JSON"),
        ("[" * 50_000, "not valid JSON"),  # nested past the parser's recursion limit
        ("\ufeff{}", "not valid JSON"),
    ],
)
def test_a_settings_file_that_is_not_an_object_loads_with_defaults_and_one_line(
        shell, no_gpu, private_settings, caplog, content, why):
    private_settings.write_text(content)
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        result = run(shell, "%load_ext gpumem_nb")
    assert result.success and current_monitor(shell) is not None
    lines = problems(caplog)
    assert len(lines) == 1 and str(private_settings) in lines[0] and why in lines[0], lines
    assert "\n" not in lines[0]
    assert current_monitor(shell).config == Config()


@pytest.mark.parametrize(
    ("key", "value", "default"),
    [
        ("device", '"0"', None),
        ("device", "true", None),
        ("device", "-1", None),
        ("device", "1.5", None),
        ("threshold_bytes", '"64MB"', DEFAULT_THRESHOLD_BYTES),
        ("threshold_bytes", "-5", DEFAULT_THRESHOLD_BYTES),
        ("threshold_bytes", "true", DEFAULT_THRESHOLD_BYTES),
        ("threshold_bytes", "1" + "0" * 100, DEFAULT_THRESHOLD_BYTES),
        ("threshold_bytes", "NaN", DEFAULT_THRESHOLD_BYTES),
        ("threshold_bytes", "1.5", DEFAULT_THRESHOLD_BYTES),
        ("auto_show", '"off"', False),
        ("auto_show", "1", False),
        ("interval_s", "NaN", 0.5),
        ("interval_s", "Infinity", 0.5),
        ("interval_s", "-Infinity", 0.5),
        ("interval_s", "1e999", 0.5),
        ("interval_s", "1" + "0" * 400, 0.5),
        ("interval_s", "true", 0.5),
        ("interval_s", '"fast"', 0.5),
        ("interval_s", "0.001", 0.5),
        ("peak", "5", "preserve"),
        ("peak", '"sometimes"', "preserve"),
    ],
)
def test_a_wrong_value_is_reported_once_naming_file_and_key_and_the_rest_is_kept(
        shell, no_gpu, private_settings, caplog, key, value, default):
    # A good value beside the bad one must survive (unless it is the same key).
    good = '"peak": "reset"' if key != "peak" else '"interval_s": 2'
    private_settings.write_text(f'{{"{key}": {value}, {good}}}')
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        result = run(shell, "%load_ext gpumem_nb")
    assert result.success
    mon = current_monitor(shell)
    lines = problems(caplog)
    assert len(lines) == 1, lines
    assert str(private_settings) in lines[0] and f'"{key}"' in lines[0] and "default" in lines[0]
    assert getattr(mon.config, key) == default
    if key == "peak":
        assert mon.config.interval_s == 2.0 and mon.sampler.interval_s == 2.0
    else:
        assert mon.config.peak == "reset"
    # What the monitor runs on is what the config says, not the bad value.
    assert mon.sampler.interval_s == mon.config.interval_s
    assert mon.tracker.threshold_bytes == mon.config.threshold_bytes


def rerun(shell: Any, source: str, times: int) -> None:
    for _ in range(times):
        shell.run_cell(source, store_history=True, cell_id="cell-rerun")
        spaced(shell)  # the sampler's reading after the cell, as in a real session


def test_threshold_as_text_no_longer_turns_detection_off(shell, fake_gpu, private_settings):
    private_settings.write_text('{"threshold_bytes": "64MB"}')
    run(shell, "%load_ext gpumem_nb")
    shell.user_ns["cuda"] = fake_gpu.cuda
    rerun(shell, "y = cuda.tensor(64 * 2**20)\ny", 3)
    verdicts = current_monitor(shell).verdicts
    assert len(verdicts) == 1 and "64.00 MiB again on run 3" in verdicts[0].message


def test_negative_threshold_does_not_flag_a_cell_that_grew_nothing(shell, fake_gpu,
                                                                   private_settings):
    private_settings.write_text('{"threshold_bytes": -5}')
    run(shell, "%load_ext gpumem_nb")
    rerun(shell, "x = 1", 4)
    assert list(current_monitor(shell).verdicts) == []


def test_auto_show_off_as_text_does_not_show_the_chart(shell, no_gpu, private_settings):
    private_settings.write_text('{"auto_show": "off"}')
    run(shell, "%load_ext gpumem_nb")
    assert current_monitor(shell).widget is None


def test_a_device_this_process_does_not_see_falls_back_to_every_gpu(shell, fake_gpu,
                                                                    private_settings, caplog,
                                                                    capsys):
    private_settings.write_text('{"device": 99}')
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        run(shell, "%load_ext gpumem_nb")
    mon = current_monitor(shell)
    assert mon.config.device is None and mon.source.selected is None
    lines = problems(caplog)
    assert len(lines) == 1 and str(private_settings) in lines[0] and '"device"' in lines[0]
    assert "there is no GPU 99" in lines[0]
    assert "watching GPU 0: NVIDIA H200" in capsys.readouterr().out


def test_a_device_in_the_file_that_exists_is_watched(shell, two_fake_gpus, private_settings):
    private_settings.write_text('{"device": 1}')
    run(shell, "%load_ext gpumem_nb")
    mon = current_monitor(shell)
    assert mon.config.device == 1 and list(mon.source.selected) == [1]
    assert [d.index for d in mon.read().devices] == [1]


def test_unknown_keys_are_named_and_the_known_ones_kept(shell, no_gpu, private_settings, caplog):
    private_settings.write_text('{"intervall_s": 2, "peak": "reset"}')
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        run(shell, "%load_ext gpumem_nb")
    lines = problems(caplog)
    assert len(lines) == 1 and '"intervall_s"' in lines[0] and str(private_settings) in lines[0]
    assert current_monitor(shell).config.peak == "reset"


def test_bad_settings_leave_no_sampler_thread_behind_over_three_attempts(shell, two_fake_gpus,
                                                                         private_settings):
    private_settings.write_text('{"device": "0"}')
    before = sampler_threads()
    for _ in range(3):
        run(shell, "%load_ext gpumem_nb")
        run(shell, "%unload_ext gpumem_nb")
        if hasattr(shell, "_gpumem_nb_config"):
            delattr(shell, "_gpumem_nb_config")  # read the file again, as a new kernel would
    assert sampler_threads() == before


# -- special files -----------------------------------------------------------------------------
def loads_in_time(shell: Any, release: Any = None) -> Any:
    """Load the extension on a thread and insist it finishes; a load stuck on a FIFO is
    released by opening the FIFO for writing, so the failing case never hangs the suite."""
    from .test_safeio import finishes

    return finishes(lambda: load_config(), release)


def test_a_fifo_as_settings_file_neither_hangs_nor_stops_loading(no_gpu, private_settings,
                                                                  caplog):
    os.mkfifo(private_settings)
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        cfg = loads_in_time(None, private_settings)
    assert cfg == Config()
    lines = problems(caplog)
    assert len(lines) == 1 and "FIFO" in lines[0] and str(private_settings) in lines[0]


@pytest.mark.parametrize("special", ["/dev/zero", "directory"])
def test_a_device_or_directory_as_settings_file_is_refused_in_one_line(
        shell, no_gpu, monkeypatch, tmp_path, caplog, special):
    path = str(tmp_path) if special == "directory" else special
    monkeypatch.setenv("GPUMEM_NB_CONFIG", path)
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        result = run(shell, "%load_ext gpumem_nb")
    assert result.success and current_monitor(shell).config == Config()
    lines = problems(caplog)
    reason = "names a directory" if special == "directory" else "not a regular file"
    assert len(lines) == 1 and path in lines[0] and reason in lines[0]


def test_a_settings_file_over_the_size_cap_is_not_read(no_gpu, private_settings, caplog):
    private_settings.write_text('{"peak": "reset"' + " " * MAX_SETTINGS_BYTES + "}")
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        cfg = load_config()
    assert cfg == Config() and "larger than" in problems(caplog)[0]


def test_a_symlinked_settings_file_is_not_read(no_gpu, private_settings, tmp_path, caplog):
    real = tmp_path / "elsewhere.json"
    real.write_text('{"peak": "reset"}')
    private_settings.symlink_to(real)
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        cfg = load_config()
    assert cfg == Config() and "symbolic link" in problems(caplog)[0]


# -- saving ------------------------------------------------------------------------------------
def test_a_failed_save_applies_nothing(shell, no_gpu, private_settings):
    run(shell, "%load_ext gpumem_nb")
    private_settings.write_text("[1]")  # not an object of settings: the save is refused
    mon = current_monitor(shell)
    with pytest.raises(UsageError, match=r"could not save the settings.*nothing was changed"):
        shell.run_line_magic("gpumem", "config --interval 2 --threshold 1GiB --save")
    assert (mon.config.interval_s, mon.sampler.interval_s) == (0.5, 0.5)
    assert mon.config.threshold_bytes == mon.tracker.threshold_bytes == DEFAULT_THRESHOLD_BYTES


def test_save_never_writes_through_a_symlink(shell, no_gpu, private_settings, tmp_path):
    victim = tmp_path / "bashrc"
    victim.write_text("precious")
    private_settings.symlink_to(victim)
    run(shell, "%load_ext gpumem_nb")
    with pytest.raises(UsageError, match="symbolic link"):
        shell.run_line_magic("gpumem", "config --interval 2 --save")
    assert victim.read_text() == "precious" and private_settings.is_symlink()
    assert current_monitor(shell).config.interval_s == 0.5


def test_save_replaces_the_file_atomically_and_round_trips(shell, no_gpu, private_settings):
    private_settings.write_text('{"peak": "reset"}')
    run(shell, "%load_ext gpumem_nb")
    shell.run_line_magic("gpumem", "config --threshold 1GiB --save")
    assert json.loads(private_settings.read_text())["threshold_bytes"] == 1 << 30
    assert [p.name for p in private_settings.parent.iterdir()
            if p.name.startswith(".")] == []  # no temporary file left behind
    assert read_config() == (current_monitor(shell).config, [])


# -- property: any JSON at all gives a valid Config and at most one line per key --------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=10,
)
setting_values = st.one_of(
    json_values, st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from(["preserve", "reset", "64MB", "0", "all", "on", "off"]),
)


def valid(cfg: Config) -> bool:
    try:
        return all(check(getattr(cfg, key)) == getattr(cfg, key) for key, check in CHECKS.items())
    except SettingsError:
        return False


@settings(max_examples=200, deadline=None)
@given(data=st.one_of(json_values, st.dictionaries(st.sampled_from(sorted(CHECKS)) | st.text(
    max_size=8), setting_values, max_size=6)))
def test_any_json_gives_a_valid_config_and_one_line_per_bad_key(data):
    cfg, lines = parse_config(data, "config.json")
    assert valid(cfg)
    assert len(lines) <= (len(data) if isinstance(data, dict) else 1)
    assert all("config.json" in ln and "\n" not in ln for ln in lines)
    if isinstance(data, dict):
        for key, value in data.items():
            if key in CHECKS and not any(f'"{key}"' in ln for ln in lines):
                assert getattr(cfg, key) == value  # a value not reported is the value used


# The one file is rewritten for every input: sharing the fixture across inputs is the point.
@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_file_content_loads_without_raising(content, private_settings):
    private_settings.write_bytes(content)
    cfg, lines = read_config()
    assert valid(cfg) and len(lines) <= max(len(content), 1)
