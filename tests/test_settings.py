"""Settings survive sessions; auto-show works from the file and the environment; a broken
settings file never stops the extension from loading."""

from __future__ import annotations

import json
import logging
from typing import Any

from gpumem_nb.magics import current_monitor

from .fakes import MiB


def run(ip: Any, source: str) -> Any:
    return ip.run_cell(source, store_history=True)


def test_saved_settings_apply_to_the_next_session(shell, no_gpu, private_settings):
    run(shell, "%load_ext gpumem_nb")
    run(shell, "%gpumem config --interval 2 --threshold 64MiB --peak reset --save")
    saved = json.loads(private_settings.read_text())
    assert saved == {"interval_s": 2.0, "threshold_bytes": 64 * MiB, "peak": "reset",
                     "auto_show": False}
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
