"""Settings: defaults, IPython's configuration, a user file, and environment variables, each
value checked.

``%gpumem config ... --save`` writes ``~/.config/gpumem_nb/config.json`` (or the file named by
``GPUMEM_NB_CONFIG``); loading the extension reads it. ``GPUMEM_NB_AUTO_SHOW=1`` shows the
chart on load whatever the file says.

The same settings are the traits of the ``GpumemNb`` configurable: ``c.GpumemNb.interval =
1.0`` in ``ipython_config.py``, ``%config GpumemNb`` to show them and ``%config
GpumemNb.interval = 2`` to set one. Order of precedence, lowest first: the defaults,
``ipython_config.py``, the saved file, ``GPUMEM_NB_AUTO_SHOW``; then whatever the session sets
(``%gpumem config``, ``%config GpumemNb``, the chart's controls) until the kernel ends. There is
one source of truth, the monitor's ``Config``: ``Monitor.configure`` is its one writer, and the
configurable's traits (configurable.py) mirror it (a trait set by ``%config`` goes through
``configure``).

Settings must never stop the extension from loading, and a wrong value must never be used
quietly: each source is checked key by key (``Layer``), then merged by precedence. Each bad
value is reported once, in one line naming its source and the key, and the value in force
instead with the source that set it (another source's, or the default); the good keys are
kept. A file that cannot be read or is not a JSON object is reported in one line and ignored
whole.

The same ``check_*`` functions guard ``Monitor.configure``, so a value the magic or the widget
refuses is exactly a value the file may not hold. Whether a device index names a GPU this
process sees is known only once the sources are up: the monitor checks that, going down the
sources' choices (``Loaded.devices``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeGuard, TypeVar

from . import safeio, userexc
from .analysis import DEFAULT_THRESHOLD_BYTES
from .jsontext import json_prefix
from .sampler import DEFAULT_INTERVAL_S, MAX_INTERVAL_S, MIN_INTERVAL_S
from .units import echo_cut, format_bytes, parse_size, printable

__all__ = [
    "AUTO_SHOW_ENV",
    "CHECKS",
    "CONFIG_ENV",
    "IPYTHON_ORIGIN",
    "MAX_SETTINGS_BYTES",
    "MAX_THRESHOLD_BYTES",
    "PEAK_PRESERVE",
    "PEAK_RESET",
    "TRAIT_FIELDS",
    "BadConfigPath",
    "Config",
    "DeviceChoice",
    "Layer",
    "Loaded",
    "Saved",
    "SettingsError",
    "bad_setting_line",
    "check_auto_show",
    "check_device",
    "check_interval_s",
    "check_peak",
    "check_threshold_bytes",
    "check_trait",
    "checked_config_path",
    "config_path",
    "describe_default",
    "describe_value",
    "from_ipython_config",
    "instead_words",
    "load_config",
    "load_settings",
    "lock_path",
    "merge",
    "parse_config",
    "parse_layer",
    "plain",
    "read_config",
    "read_layers",
    "replace_config",
    "save_config",
    "show_value",
]

log = logging.getLogger("gpumem_nb")

PEAK_PRESERVE = "preserve"
PEAK_RESET = "reset"
CONFIG_ENV = "GPUMEM_NB_CONFIG"
AUTO_SHOW_ENV = "GPUMEM_NB_AUTO_SHOW"
# A settings file is a few lines; anything larger is not one (and is not read into memory).
MAX_SETTINGS_BYTES = 64 * 1024
# No GPU holds a petabyte: a larger threshold is a typo, not a wish to never be told.
MAX_THRESHOLD_BYTES = 1 << 50


@dataclass
class Config:
    interval_s: float = DEFAULT_INTERVAL_S
    device: int | None = None  # None: every visible GPU
    threshold_bytes: int = DEFAULT_THRESHOLD_BYTES
    # Default: leave the process-wide peak counters alone (users read them too).
    peak: str = PEAK_PRESERVE
    auto_show: bool = False


class SettingsError(ValueError):
    """A setting's value refused, in words: ``key`` and the plain reason ``why``."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key = key
        self.why = why


def show_value(value: object) -> str:
    """A value as JSON would spell it, short, from only the items shown (a list of ten
    million took 11-13 s to serialise whole); never raises (a 5000-digit int cannot be
    turned into text at all under Python's default limits)."""
    try:
        return json_prefix(value, 40)
    except Exception:
        return f"a {echo_cut(printable(userexc.class_name(type(value))), 40)}"


def plain(value: Any) -> object:
    """A number's or a text's own value as its base type (``int.__int__`` copies a subclass
    without calling any of its methods); anything else as it is. The checks then compare
    exact values: a subclass's own comparison could raise (``float`` with an ``__le__`` that
    divides by zero stopped the extension from loading) or lie, and the settings keep nothing
    whose methods a later cell would run."""
    kind = type(value)
    # ``is``, not ``in``: a metaclass's own ``__eq__`` would run. ``issubclass`` against a
    # builtin reads the real MRO, never ``__class__`` or ``__subclasscheck__`` of the value's.
    if kind is int or kind is float or kind is str or kind is bool or value is None:
        return value
    if issubclass(kind, int):
        return int.__int__(value)
    if issubclass(kind, float):
        return float.__float__(value)
    if issubclass(kind, str):
        return str.__str__(value)
    return value


_Checked = TypeVar("_Checked")


def _of_plain(check: Callable[[object], _Checked]) -> Callable[[object], _Checked]:
    """``check`` run on ``plain(value)``: no code of the value's own runs while it is
    checked, so nothing a check does can raise but ``SettingsError``."""

    @functools.wraps(check)
    def checked(value: object) -> _Checked:
        return check(plain(value))

    return checked


# Each check receives a plain value (``_of_plain``): exact types are tested with ``type``, so
# that an object's ``__class__`` can neither pass for a number nor raise (``isinstance``
# reads it).
def _is_number(value: object) -> TypeGuard[int | float]:
    return type(value) is int or type(value) is float


@_of_plain
def check_interval_s(value: object) -> float:
    if not _is_number(value):
        raise SettingsError("interval_s", f"must be a number of seconds, not {show_value(value)}")
    # Compared before float(): an int too large for a float still compares exactly.
    if not (MIN_INTERVAL_S <= value <= MAX_INTERVAL_S):
        raise SettingsError("interval_s", f"must be between {MIN_INTERVAL_S} and "
                                          f"{MAX_INTERVAL_S:g} seconds, not {show_value(value)}")
    return float(value)


@_of_plain
def check_threshold_bytes(value: object) -> int:
    if type(value) is float and math.isfinite(value) and value.is_integer():
        value = int(value)  # 1e9 in JSON is a float
    if type(value) is not int:
        raise SettingsError("threshold_bytes",
                            f"must be a whole number of bytes, not {show_value(value)}")
    if not 0 <= value <= MAX_THRESHOLD_BYTES:
        raise SettingsError("threshold_bytes", f"must be between 0 B and "
                            f"{format_bytes(MAX_THRESHOLD_BYTES)}, not {show_value(value)}")
    return value


@_of_plain
def check_device(value: object) -> int | None:
    """A device index (or None for every GPU), by type only; the monitor checks the range."""
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise SettingsError("device", "must be a GPU number (0, 1, ...) or null for every "
                                      f"GPU, not {show_value(value)}")
    return value


@_of_plain
def check_peak(value: object) -> str:
    if type(value) is not str or value not in (PEAK_PRESERVE, PEAK_RESET):
        raise SettingsError("peak", f"must be \"{PEAK_PRESERVE}\" or \"{PEAK_RESET}\", "
                                    f"not {show_value(value)}")
    return value


@_of_plain
def check_auto_show(value: object) -> bool:
    if type(value) is not bool:
        raise SettingsError("auto_show", f"must be true or false, not {show_value(value)}")
    return value


CHECKS = {
    "interval_s": check_interval_s,
    "device": check_device,
    "threshold_bytes": check_threshold_bytes,
    "peak": check_peak,
    "auto_show": check_auto_show,
}
assert set(CHECKS) == {f.name for f in fields(Config)}


def describe_value(key: str, value: Any) -> str:
    if key == "threshold_bytes":
        return format_bytes(value)
    if key == "interval_s":
        return f"{value:g} s"
    if key == "device":
        return "every GPU" if value is None else f"GPU {value}"
    return show_value(value)


def describe_default(key: str) -> str:
    return describe_value(key, getattr(Config(), key))


def instead_words(key: str, value: object, origin: str | None) -> str:
    """What a refused value gives way to: the value in force, and the source that set it."""
    if origin is None:
        return f"using the default ({describe_default(key)})"
    return f"using {describe_value(key, value)} from {origin}"


def bad_setting_line(origin: str, e: SettingsError, instead: str = "") -> str:
    """The one line that reports a refused value from ``origin`` (a file name), and what is
    used instead (by default, the default)."""
    instead = instead or instead_words(e.key, None, None)
    return f"gpumem_nb: {origin}: \"{e.key}\" {e.why}; {instead}."


# ------------------------------------------------------------------------------------------
# The sources, each read on its own, then merged by precedence
# ------------------------------------------------------------------------------------------
@dataclass
class Layer:
    """What one source (ipython_config.py, the settings file, the environment) sets, checked
    key by key. Its refusals are worded only once every source is read: a refused value gives
    way to whatever is in force then, which another source may have set."""

    origin: str
    values: dict[str, Any] = field(default_factory=dict)  # field name: a checked value
    refused: list[tuple[str, SettingsError]] = field(default_factory=list)  # field name, why
    notes: list[str] = field(default_factory=list)  # whole lines (an unknown key)
    ignored: str = ""  # why the whole source was not read, if it was not


@dataclass(frozen=True)
class DeviceChoice:
    """A GPU a source asked to watch. Whether it exists is known only once NVML answers: the
    monitor checks, and a refused one gives way to the next source's, then to every GPU."""

    index: int
    origin: str


@dataclass
class Loaded:
    """The settings a load starts from, and what reading them found."""

    config: Config
    origins: dict[str, str] = field(default_factory=dict)  # field name: the source that set it
    devices: tuple[DeviceChoice, ...] = ()  # every device asked for, the one in force first
    problems: list[str] = field(default_factory=list)  # one line each


def merge(layers: list[Layer]) -> Loaded:
    """The sources by precedence, lowest first, over the defaults; each refusal in words that
    name the value in force instead and where it came from (a bad value in the file gives way
    to ipython_config.py's, not to the default)."""
    loaded = Loaded(Config())
    for layer in layers:
        for key, value in layer.values.items():
            setattr(loaded.config, key, value)
            loaded.origins[key] = layer.origin
    devices: list[DeviceChoice] = []
    for layer in reversed(layers):
        if "device" in layer.values:
            if layer.values["device"] is None:  # every GPU: nothing below it applies
                break
            devices.append(DeviceChoice(layer.values["device"], layer.origin))
    loaded.devices = tuple(devices)
    for layer in layers:
        if layer.ignored:
            others = sorted({o for o in loaded.origins.values() if o != layer.origin})
            rest = (f"using the settings from {' and '.join(others)}, and the defaults"
                    if others else "using the default settings")
            loaded.problems.append(f"gpumem_nb: {layer.origin}: ignored: {layer.ignored}; "
                                   f"{rest}.")
        loaded.problems += layer.notes
        for key, e in layer.refused:
            instead = instead_words(key, getattr(loaded.config, key), loaded.origins.get(key))
            loaded.problems.append(bad_setting_line(layer.origin, e, instead))
    return loaded


def parse_config(data: object, origin: str) -> tuple[Config, list[str]]:
    """A valid ``Config`` from parsed JSON over the defaults, whatever it holds, and one line
    per problem."""
    loaded = merge([parse_layer(data, origin)])
    return loaded.config, loaded.problems


def parse_layer(data: object, origin: str) -> Layer:
    """What parsed JSON sets, whatever it holds: a valid value per key, one refusal per bad
    key, one note per unknown key."""
    layer = Layer(origin)
    if not isinstance(data, dict):
        kind = {list: "a list", str: "a string", type(None): "null", bool: "true or false"}.get(
            type(data), "a number")
        layer.ignored = f"it holds {kind}, not an object of settings"
        return layer
    for key, value in data.items():
        check = CHECKS.get(key)
        if check is None:
            layer.notes.append(f"gpumem_nb: {origin}: unknown setting {show_value(key)} "
                               "ignored.")
            continue
        try:
            layer.values[key] = check(value)
        except SettingsError as e:
            layer.refused.append((key, e))
    return layer


def replace_config(cfg: Config) -> Config:
    return Config(**{f.name: getattr(cfg, f.name) for f in fields(Config)})


class BadConfigPath(SettingsError):
    """``GPUMEM_NB_CONFIG`` names no file a setting could be saved in (a directory, blanks)."""


def config_path() -> Path:
    """The settings file: ``GPUMEM_NB_CONFIG`` (``~`` expanded, as every path the magic takes
    is), else ``$XDG_CONFIG_HOME/gpumem_nb/config.json``. Never raises: ``checked_config_path``
    says whether it names a file."""
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(os.path.expanduser(env))
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "gpumem_nb" / "config.json"


def checked_config_path() -> Path:
    """``config_path``, or ``BadConfigPath`` when ``GPUMEM_NB_CONFIG`` cannot name a settings
    file: blanks (``' '`` was a file of that name in the working directory), a directory (``/``,
    ``~``) or a name ending in a separator."""
    env = os.environ.get(CONFIG_ENV)
    path = config_path()
    if not env:
        return path
    what = "is blank" if not env.strip() else "names a directory" if (
        env.endswith(("/", os.sep)) or path.is_dir()) else ""
    if what:
        shown = json.dumps(env) if len(env) <= 200 else json.dumps(env[:200]) + "..."
        raise BadConfigPath(CONFIG_ENV, f"{what} ({shown}): it must name a settings file, "
                                        "for example ~/gpumem_nb.json")
    return path


def read_layers() -> list[Layer]:
    """The settings file's layer, then the environment's; no file at all sets nothing."""
    try:
        path = checked_config_path()
    except BadConfigPath as e:
        layers = [Layer(CONFIG_ENV, notes=[f"gpumem_nb: {e.key} {e.why}; using none."])]
    else:
        layers = [_read_file(path)]
    if os.environ.get(AUTO_SHOW_ENV) == "1":
        layers.append(Layer(AUTO_SHOW_ENV, values={"auto_show": True}))
    return layers


def read_config() -> tuple[Config, list[str]]:
    """The settings file's ``Config`` over the defaults, and its problems."""
    loaded = merge(read_layers())
    return loaded.config, loaded.problems


def _read_file(path: Path) -> Layer:
    origin = safeio.shown(path)
    try:
        text = safeio.read_text(path, max_bytes=MAX_SETTINGS_BYTES, follow_symlinks=False)
    except FileNotFoundError:
        return Layer(origin)
    except OSError as e:
        return Layer(origin, ignored=safeio.reason(e))
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: "[[[[..." nested deep
        where = f" ({e.msg}, line {e.lineno})" if isinstance(e, json.JSONDecodeError) else ""
        return Layer(origin, ignored=f"it is not valid JSON{where}")
    return parse_layer(data, origin)


def load_settings(ipython_config: object = None) -> Loaded:
    """The settings a load starts from, by precedence: the defaults, then the ``GpumemNb``
    section of IPython's configuration (``ipython_config``, the shell's ``config``), then the
    settings file, then the environment. Each problem is logged once (a load calls this once)."""
    loaded = merge([from_ipython_config(ipython_config), *read_layers()])
    for line in loaded.problems:
        log.warning("%s", line)
    return loaded


def load_config(ipython_config: object = None) -> Config:
    return load_settings(ipython_config).config


# ------------------------------------------------------------------------------------------
# IPython's configuration: the GpumemNb configurable
# ------------------------------------------------------------------------------------------
# Trait names are %gpumem config's flags; the saved file keeps the fields' names (units in
# them), as it always has.
TRAIT_FIELDS = {"interval": "interval_s", "device": "device", "threshold": "threshold_bytes",
                "peak": "peak", "auto_show": "auto_show"}
IPYTHON_ORIGIN = "IPython configuration (c.GpumemNb)"


def check_trait(trait: str, value: object) -> object:
    """A trait's value checked as the file's and the magic's are (``SettingsError`` naming
    the trait); a threshold may be a size in words ("64MiB") as the magic's flag takes."""
    value = plain(value)
    if trait == "threshold" and type(value) is str:
        try:
            value = parse_size(value)
        except ValueError as e:
            raise SettingsError("threshold", str(e)) from None
    try:
        return CHECKS[TRAIT_FIELDS[trait]](value)
    except SettingsError as e:
        raise SettingsError(trait, e.why) from None


def from_ipython_config(ipython_config: object) -> Layer:
    """What ``c.GpumemNb`` sets, checked key by key as the file is (a bad value is one line,
    and gives way). Read here, not by traitlets at construction: a bad value there would
    raise and stop the extension from loading."""
    layer = Layer(IPYTHON_ORIGIN)
    # No shell, or one without a configuration, sets nothing.
    section = ipython_config.get("GpumemNb") if isinstance(ipython_config, Mapping) else None
    for trait, value in (dict(section) if isinstance(section, Mapping) else {}).items():
        if trait not in TRAIT_FIELDS:
            layer.notes.append(f"gpumem_nb: {IPYTHON_ORIGIN}: unknown setting "
                               f"{show_value(trait)} ignored; GpumemNb has "
                               f"{', '.join(TRAIT_FIELDS)}.")
            continue
        try:
            layer.values[TRAIT_FIELDS[trait]] = check_trait(trait, value)
        except SettingsError as e:
            layer.refused.append((TRAIT_FIELDS[trait], e))
    return layer


def lock_path(path: Path) -> Path:
    """The lock file that saves of ``path`` take turns on (kept; removing it would race).
    Named after the settings file, shortened when that name plus ".lock" would be longer
    than a file name may be."""
    name = path.name + ".lock"
    if len(os.fsencode(name)) > 255:
        name = "." + hashlib.sha1(os.fsencode(path.name)).hexdigest()[:16] + ".lock"
    return path.with_name(name)


@dataclass(frozen=True)
class Saved:
    """Where a save wrote, and a note when it had to go without the lock."""

    path: Path
    note: str = ""


def save_config(changes: Mapping[str, object]) -> Saved:
    """Write the settings in ``changes`` into the file, keeping everything else it holds.

    The file is read as it is on disk at save time, under a lock (``safeio.locked``), so two
    kernels saving different keys both keep theirs; a kernel never writes back values it
    merely loaded. Where the file system cannot lock, the save goes ahead unlocked and says
    so (the atomic replace still keeps the file whole). Atomic: an ``OSError`` (a link, a
    file that is not a JSON object of settings, a lock held too long) means the old file is
    untouched. Which GPU to watch belongs to a session, not to every notebook: ``device`` is
    never saved.
    """
    path = checked_config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with safeio.locked(lock_path(path)) as lock:
        try:
            text = safeio.read_text(path, max_bytes=MAX_SETTINGS_BYTES, follow_symlinks=False)
        except FileNotFoundError:
            data: dict[str, object] = {}
        else:
            loaded: object = None
            with contextlib.suppress(ValueError, RecursionError):
                loaded = json.loads(text)
            if not isinstance(loaded, dict):
                raise safeio.RefusedPath(
                    safeio.shown(path), "does not hold a JSON object of settings; fix or "
                    "remove it before saving")
            data = loaded
        data.update((k, v) for k, v in changes.items() if k != "device")
        written = safeio.write_text_atomic(path, json.dumps(data, indent=2) + "\n")
    note = "" if lock.held else (
        f"saved without a lock: {lock.why}; another kernel saving at the same moment could "
        "lose this change or its own")
    return Saved(written, note)
