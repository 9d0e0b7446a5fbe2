"""The settings as IPython's configuration: ``c.GpumemNb.*`` in ipython_config.py and
``%config GpumemNb``, the same settings as ``%gpumem config`` and the saved file, in one
documented order of precedence; and a GPUMEM_NB_CONFIG that names no file."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError

from gpumem_nb.configurable import GpumemNb
from gpumem_nb.kernel import current_monitor
from gpumem_nb.settings import DEFAULT_THRESHOLD_BYTES

ROOT = Path(__file__).resolve().parent.parent


def traits(shell: Any) -> list[GpumemNb]:
    return [c for c in shell.configurables if isinstance(c, GpumemNb)]


@pytest.fixture(autouse=True)
def ipython_config(shell: Any) -> Any:
    """The shell's ``c.GpumemNb`` section, as ipython_config.py sets it. Emptied before and
    after: ``%config GpumemNb.x = ...`` also writes it there (the shell's configuration is
    shared by its configurables), and the shell outlives each test."""
    shell.config.pop("GpumemNb", None)
    yield shell.config.GpumemNb
    shell.config.pop("GpumemNb", None)


def load(shell: Any, capsys: Any) -> Any:
    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    capsys.readouterr()
    return current_monitor(shell)


# -- %config GpumemNb --------------------------------------------------------------------------
def test_config_gpumemnb_shows_the_settings_in_force(shell, no_gpu, capsys):
    mon = load(shell, capsys)
    mon.configure(interval_s=2.5)
    shell.run_line_magic("config", "GpumemNb")
    out = capsys.readouterr().out
    assert "GpumemNb.interval=<Float>" in out
    assert "Current: 2.5" in out and "GpumemNb.threshold" in out and "GpumemNb.peak" in out


def test_config_gpumemnb_sets_the_interval_the_sampler_uses(shell, no_gpu, capsys):
    mon = load(shell, capsys)
    shell.run_line_magic("config", "GpumemNb.interval = 2")
    assert mon.config.interval_s == mon.sampler.interval_s == 2.0
    assert "interval_s" in mon.session_keys  # a bare `config --save` keeps it
    shell.run_line_magic("config", "GpumemNb.threshold = '1GiB'")
    assert mon.config.threshold_bytes == mon.tracker.threshold_bytes == 2**30


def test_gpumem_config_is_what_config_gpumemnb_reads_back(shell, no_gpu, capsys):
    load(shell, capsys)
    shell.run_line_magic("gpumem", "config --interval 3 --peak reset")
    assert shell.run_line_magic("config", "GpumemNb.interval") == 3.0
    assert shell.run_line_magic("config", "GpumemNb.peak") == "reset"


def test_a_refused_config_value_changes_nothing_and_says_why(shell, no_gpu, capsys, caplog):
    mon = load(shell, capsys)
    with caplog.at_level(logging.ERROR):
        shell.run_line_magic("config", "GpumemNb.interval = 200")
        shell.run_line_magic("config", "GpumemNb.device = 3")
    said = caplog.text + capsys.readouterr().err
    assert "GpumemNb.interval: must be between 0.05 and 60 seconds, not 200" in said
    assert "GpumemNb.device: there is no GPU 3: this process sees no GPU" in said
    assert mon.config.interval_s == mon.sampler.interval_s == 0.5 and mon.config.device is None
    assert shell.run_line_magic("config", "GpumemNb.interval") == 0.5


def test_a_refused_config_value_says_usageerror_not_error_root(shell, no_gpu, capsys, caplog):
    load(shell, capsys)
    with caplog.at_level(logging.ERROR):
        shell.run_line_magic("config", "GpumemNb.interval = -2")
    err = capsys.readouterr().err
    assert "UsageError: GpumemNb.interval: must be between 0.05 and 60 seconds, not -2" in err
    assert "GpumemNb.interval" not in caplog.text  # no "ERROR:root:" log record


def test_reload_ext_leaves_one_gpumemnb_driving_the_new_monitor(shell, no_gpu, capsys):
    load(shell, capsys)
    for _ in range(3):
        shell.run_line_magic("reload_ext", "gpumem_nb")
    assert len(traits(shell)) == 1
    shell.run_line_magic("config", "GpumemNb.interval = 4")
    assert current_monitor(shell).sampler.interval_s == 4.0
    shell.run_line_magic("unload_ext", "gpumem_nb")
    assert traits(shell) == []


# -- precedence --------------------------------------------------------------------------------
def test_ipython_config_sets_the_starting_settings(shell, no_gpu, capsys, ipython_config):
    ipython_config.interval = 1.5
    ipython_config.threshold = "256MiB"
    mon = load(shell, capsys)
    assert mon.config.interval_s == mon.sampler.interval_s == 1.5
    assert mon.config.threshold_bytes == 256 * 2**20


def test_the_saved_file_overrides_ipython_config_key_by_key(shell, no_gpu, capsys,
                                                            ipython_config, private_settings):
    ipython_config.interval = 1.5
    ipython_config.peak = "reset"
    private_settings.write_text(json.dumps({"interval_s": 2.0}))
    mon = load(shell, capsys)
    assert mon.config.interval_s == 2.0  # the file's
    assert mon.config.peak == "reset"  # ipython_config's: the file does not set it
    assert mon.config.threshold_bytes == DEFAULT_THRESHOLD_BYTES  # neither: the default


def test_the_environment_overrides_the_file_and_the_session_overrides_all(
        shell, no_gpu, capsys, ipython_config, private_settings, monkeypatch):
    ipython_config.auto_show = False
    private_settings.write_text(json.dumps({"auto_show": False, "interval_s": 2.0}))
    monkeypatch.setenv("GPUMEM_NB_AUTO_SHOW", "1")
    mon = load(shell, capsys)
    assert mon.config.auto_show is True
    shell.run_line_magic("gpumem", "config --interval 5")
    assert mon.config.interval_s == 5.0


def test_a_bad_ipython_config_value_is_one_line_and_the_extension_loads(
        shell, no_gpu, capsys, caplog, ipython_config):
    ipython_config.peak = "sometimes"
    ipython_config.interval = 1.5
    ipython_config.intervall = 3
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        mon = load(shell, capsys)
    lines = [r.getMessage() for r in caplog.records if r.name == "gpumem_nb"]
    assert ('gpumem_nb: IPython configuration (c.GpumemNb): "peak" must be "preserve" or '
            '"reset", not "sometimes"; using the default ("preserve").') in lines
    assert any("unknown setting \"intervall\" ignored" in ln for ln in lines)
    assert mon.config.interval_s == 1.5 and mon.config.peak == "preserve"


# -- a refused value names its own source, and the value used instead -----------------------
def gpumem_lines(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gpumem_nb"]


def test_a_device_from_ipython_config_that_names_no_gpu_is_blamed_on_ipython_config(
        shell, no_gpu, capsys, caplog, ipython_config, private_settings):
    # It was blamed on the settings file, which did not even exist.
    ipython_config.device = 3
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        mon = load(shell, capsys)
    assert gpumem_lines(caplog) == [
        'gpumem_nb: IPython configuration (c.GpumemNb): "device" there is no GPU 3: this '
        'process sees no GPU; using the default (every GPU).']
    assert mon.config.device is None and not private_settings.exists()


def test_a_bad_file_value_names_the_ipython_config_value_in_force_not_the_default(
        shell, no_gpu, capsys, caplog, ipython_config, private_settings):
    ipython_config.interval = 1.5
    ipython_config.threshold = "1GiB"
    private_settings.write_text(json.dumps({"interval_s": "fast", "threshold_bytes": -1}))
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        mon = load(shell, capsys)
    file = str(private_settings)
    assert gpumem_lines(caplog) == [
        f'gpumem_nb: {file}: "interval_s" must be a number of seconds, not "fast"; using '
        '1.5 s from IPython configuration (c.GpumemNb).',
        f'gpumem_nb: {file}: "threshold_bytes" must be between 0 B and 1024.00 TiB, not -1; '
        'using 1.00 GiB from IPython configuration (c.GpumemNb).']
    assert mon.config.interval_s == 1.5 and mon.config.threshold_bytes == 2**30


def test_a_file_device_that_names_no_gpu_gives_way_to_ipython_configs_device(
        shell, two_fake_gpus, capsys, caplog, ipython_config, private_settings):
    ipython_config.device = 1
    private_settings.write_text(json.dumps({"device": 5}))
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        mon = load(shell, capsys)
    assert gpumem_lines(caplog) == [
        f'gpumem_nb: {private_settings}: "device" there is no GPU 5: this process sees GPUs '
        '0-1; using GPU 1 from IPython configuration (c.GpumemNb).']
    assert mon.config.device == 1 and list(mon.source.selected) == [1]


def test_a_bad_file_value_names_the_environment_value_in_force(
        shell, no_gpu, capsys, caplog, private_settings, monkeypatch):
    monkeypatch.setenv("GPUMEM_NB_AUTO_SHOW", "1")
    private_settings.write_text(json.dumps({"auto_show": "off"}))
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        mon = load(shell, capsys)
    assert gpumem_lines(caplog) == [
        f'gpumem_nb: {private_settings}: "auto_show" must be true or false, not "off"; using '
        'true from GPUMEM_NB_AUTO_SHOW.']
    assert mon.config.auto_show is True


def test_an_unreadable_file_says_ipython_configs_settings_are_still_used(
        shell, no_gpu, capsys, caplog, ipython_config, private_settings):
    ipython_config.interval = 1.5
    private_settings.write_text("[1, 2]")
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        mon = load(shell, capsys)
    assert gpumem_lines(caplog) == [
        f"gpumem_nb: {private_settings}: ignored: it holds a list, not an object of settings; "
        "using the settings from IPython configuration (c.GpumemNb), and the defaults."]
    assert mon.config.interval_s == 1.5


# -- numbers and text whose own methods raise or lie -------------------------------------------
def _raises(self: Any, other: Any) -> Any:
    return 1 / 0


class RaisingFloat(float):
    __le__ = __ge__ = __lt__ = __gt__ = __eq__ = __ne__ = _raises
    __hash__ = float.__hash__


class RaisingInt(int):
    __le__ = __ge__ = __lt__ = __gt__ = __eq__ = __ne__ = _raises
    __hash__ = int.__hash__


class RaisingStr(str):
    __eq__ = __ne__ = __lt__ = _raises
    __hash__ = str.__hash__


class LyingFloat(float):
    """Says it is in every range."""

    def __le__(self, other: Any) -> bool:
        return True

    __ge__ = __le__


class RaisingClass:
    """``isinstance`` reads ``__class__``."""

    @property  # type: ignore[misc]
    def __class__(self) -> Any:
        return 1 / 0


@pytest.mark.parametrize(("trait", "value", "field", "used"), [
    ("interval", RaisingFloat(1.5), "interval_s", 1.5),
    ("interval", RaisingInt(2), "interval_s", 2.0),
    ("device", RaisingInt(0), "device", 0),
    ("threshold", RaisingInt(2**20), "threshold_bytes", 2**20),
    ("threshold", RaisingStr("1GiB"), "threshold_bytes", 2**30),
    ("peak", RaisingStr("reset"), "peak", "reset"),
])
def test_a_number_or_text_whose_comparison_raises_loads_as_its_plain_value(
        shell, fake_gpu, capsys, caplog, ipython_config, trait, value, field, used):
    # It stopped the extension from loading with a ZeroDivisionError traceback.
    setattr(ipython_config, trait, value)
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        mon = load(shell, capsys)
    assert mon is not None and gpumem_lines(caplog) == []
    kept = getattr(mon.config, field)
    assert type(kept) is type(used) and kept == used  # the plain value: its methods never run
    assert shell.run_cell("x = 1", store_history=True).success


def test_a_number_whose_comparison_raises_set_by_config_gpumemnb_is_used_plainly(
        shell, no_gpu, capsys):
    mon = load(shell, capsys)
    shell.user_ns["value"] = RaisingFloat(1.5)
    shell.run_line_magic("config", "GpumemNb.interval = value")
    assert type(mon.config.interval_s) is float and mon.config.interval_s == 1.5
    assert "Traceback" not in capsys.readouterr().err


def test_a_number_whose_comparison_lies_is_checked_by_its_plain_value(
        shell, no_gpu, capsys, caplog, ipython_config):
    ipython_config.interval = LyingFloat(1e9)
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        mon = load(shell, capsys)
    assert gpumem_lines(caplog) == [
        'gpumem_nb: IPython configuration (c.GpumemNb): "interval" must be between 0.05 and 60 '
        'seconds, not 1000000000.0; using the default (0.5 s).']
    assert mon.config.interval_s == 0.5


def test_a_value_whose_class_raises_is_refused_in_a_sentence_and_the_next_source_used(
        shell, no_gpu, capsys, caplog, ipython_config, private_settings):
    ipython_config.interval = RaisingClass()
    private_settings.write_text(json.dumps({"interval_s": 2.0}))
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        mon = load(shell, capsys)
    assert gpumem_lines(caplog) == [
        'gpumem_nb: IPython configuration (c.GpumemNb): "interval" must be a number of seconds, '
        f'not a RaisingClass; using 2 s from {private_settings}.']
    assert mon.config.interval_s == 2.0


# A refused value from ipython_config.py or %config came back whole: 100,149 characters.
LONG = "\x1b[2J" + "x" * 100_000


def test_a_long_refused_ipython_config_value_is_echoed_cut_and_escaped(
        shell, no_gpu, capsys, caplog, ipython_config):
    ipython_config.threshold = LONG
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        mon = load(shell, capsys)
    lines = [r.getMessage() for r in caplog.records if r.name == "gpumem_nb"]
    assert len(lines) == 1 and len(lines[0]) <= 250, len(lines[0])
    assert "'\\x1b[2J" + "x" * 72 + "…" in lines[0] and "\x1b" not in lines[0]
    assert mon.config.threshold_bytes == DEFAULT_THRESHOLD_BYTES


@pytest.mark.parametrize("value", [LONG, [0] * 100_000], ids=["text", "list"])
@pytest.mark.parametrize("trait", ["threshold", "interval", "device", "peak", "auto_show"])
def test_a_long_refused_config_gpumemnb_value_is_echoed_cut_and_escaped(shell, no_gpu, capsys,
                                                                        caplog, trait, value):
    mon = load(shell, capsys)
    before = mon.config
    shell.user_ns["LONG"] = value
    with caplog.at_level(logging.ERROR):
        shell.run_line_magic("config", f"GpumemNb.{trait} = LONG")
    said = caplog.text + capsys.readouterr().err
    assert f"GpumemNb.{trait}: " in said and "\x1b" not in said
    assert max(len(line) for line in said.splitlines()) <= 250
    assert mon.config == before


def test_a_ten_million_item_config_value_is_refused_without_serialising_it(
        shell, no_gpu, capsys, caplog):
    # The refusal quoted the value as JSON cut to 40 characters, after writing all of it:
    # ``%config GpumemNb.interval = [0.5]*10**7`` took 11-13 s.
    import time

    mon = load(shell, capsys)
    before = mon.config
    shell.user_ns["HUGE"] = [0.5] * 10**7
    t0 = time.thread_time()  # this thread's CPU: other processes' load does not count
    with caplog.at_level(logging.ERROR):
        shell.run_line_magic("config", "GpumemNb.interval = HUGE")
    took_s = time.thread_time() - t0
    said = caplog.text + capsys.readouterr().err
    assert "GpumemNb.interval: " in said and "[0.5, 0.5, 0.5" in said
    assert took_s < 0.5, took_s
    assert mon.config == before


# -- GPUMEM_NB_CONFIG that names no file ---------------------------------------------------------
@pytest.mark.parametrize(("value", "what"), [
    ("/", "names a directory"), (" ", "is blank"), ("~", "names a directory"),
    ("somewhere/", "names a directory"),
])
def test_a_config_path_that_names_no_file_is_one_line_and_writes_nothing(
        shell, no_gpu, capsys, caplog, monkeypatch, tmp_path, value, what):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPUMEM_NB_CONFIG", value)
    with caplog.at_level(logging.WARNING, logger="gpumem_nb"):
        mon = load(shell, capsys)
    assert [r.getMessage() for r in caplog.records if r.name == "gpumem_nb"] == [
        f"gpumem_nb: GPUMEM_NB_CONFIG {what} ({json.dumps(value)}): it must name a settings "
        "file, for example ~/gpumem_nb.json; using none."]
    with pytest.raises(UsageError) as e:
        shell.run_line_magic("gpumem", "config --interval 2 --save")
    assert str(e.value) == (f"GPUMEM_NB_CONFIG: {what} ({json.dumps(value)}): it must name a "
                            "settings file, for example ~/gpumem_nb.json")
    assert mon.config.interval_s == 0.5  # nothing changed
    assert sorted(os.listdir(tmp_path)) == ["home"] and os.listdir(home) == []


def test_a_config_path_under_tilde_is_the_home_directory(shell, no_gpu, capsys, monkeypatch,
                                                         tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    os.mkdir("elsewhere")
    monkeypatch.chdir("elsewhere")
    monkeypatch.setenv("GPUMEM_NB_CONFIG", "~/gpumem.json")
    load(shell, capsys)
    shell.run_line_magic("gpumem", "config --interval 2 --save")
    assert json.loads((tmp_path / "gpumem.json").read_text()) == {"interval_s": 2.0}
    assert os.listdir(".") == []  # no directory named "~" here


# -- a real kernel -------------------------------------------------------------------------------
@pytest.mark.kernel
@pytest.mark.slow
def test_a_kernel_takes_gpumemnb_from_ipython_config_py(tmp_path):
    from jupyter_client.manager import start_new_kernel

    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_config.py").write_text(
        "c.GpumemNb.interval = 1.25\nc.GpumemNb.threshold = '128MiB'\n")
    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython"),
           "GPUMEM_NB_CONFIG": str(tmp_path / "none.json"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path), env=env)
    try:
        said: list[str] = []

        def keep(msg: Any) -> None:
            if msg["msg_type"] == "stream":
                said.append(msg["content"]["text"])
            elif msg["msg_type"] in ("execute_result", "display_data"):
                said.append(msg["content"]["data"].get("text/plain", ""))

        for code in ("%load_ext gpumem_nb", "%config GpumemNb",
                     "%config GpumemNb.interval = 2", "%gpumem config"):
            reply = kc.execute_interactive(code, timeout=60, output_hook=keep)
            assert reply["content"]["status"] == "ok", reply["content"]
        text = "".join(said)
        assert "Current: 1.25" in text and "Current: 134217728" in text
        assert re.search(r"interval +2 s", text) and re.search(r"threshold +128.00 MiB", text)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


@pytest.mark.kernel
@pytest.mark.slow
def test_a_kernel_answers_a_misspelt_subcommand_with_the_one_meant(tmp_path):
    from jupyter_client.manager import start_new_kernel

    env = {**os.environ, "GPUMEM_NB_CONFIG": str(tmp_path / "none.json"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path), env=env)
    try:
        kc.execute_interactive("%load_ext gpumem_nb", timeout=60, output_hook=lambda m: None)
        reply = kc.execute_interactive("%gpumem histroy", timeout=60,
                                       output_hook=lambda m: None)
        content = reply["content"]
        assert content["status"] == "error" and content["ename"] == "UsageError"
        assert content["evalue"] == ("%gpumem has no subcommand 'histroy'; "
                                     "did you mean 'history'?")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
