"""The settings' one writer: every change is checked, saved, applied, then announced.

``LiveSettings.configure`` is the only code that changes a loaded extension's ``Config``: the
magic, ``%config GpumemNb`` and the chart's device selector all go through it, so a refused
value or a failed save changes nothing, and every listener sees the same settings.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from typing import Any

from ..settings import (
    CHECKS,
    Config,
    DeviceChoice,
    SettingsError,
    bad_setting_line,
    check_auto_show,
    check_device,
    check_interval_s,
    check_peak,
    check_threshold_bytes,
    instead_words,
    save_config,
    show_value,
)
from .contain import FailureLog, log

__all__ = ["UNCHANGED", "LiveSettings", "SettingsListener", "repair"]


class _Keep(enum.Enum):
    UNCHANGED = "unchanged"


# ``configure(device=...)``'s default: None already means "every GPU".
UNCHANGED = _Keep.UNCHANGED

SettingsListener = Callable[[Config], None]


class LiveSettings:
    """The settings in force (``config``, kept in place across ``%reload_ext``) and their
    one writer."""

    def __init__(self, config: Config, failures: FailureLog, *,
                 gpu_count: Callable[[], int],
                 apply: Callable[[Config, Config], None],
                 session_keys: set[str] | None = None,
                 starting_devices: Sequence[DeviceChoice] = ()) -> None:
        self.config = config
        repair(self.config)
        self.failures = failures
        self._gpu_count = gpu_count
        self._apply_to_engine = apply  # the engine's parts take (new, old) settings
        # Where the starting device was set, and the sources' next choices (settings.merge):
        # checked once NVML answers.
        self._starting_devices = tuple(starting_devices)
        self.listeners: list[SettingsListener] = []
        self._lock = threading.Lock()
        # The settings configure() changed in this session: since the kernel started, not
        # since this load (the shell keeps the set across %reload_ext, as it keeps the
        # config). A bare save writes them: after ``config --threshold 1GB`` and a reload,
        # the 1 GB in force is what the user means to keep.
        self.session_keys: set[str] = session_keys if session_keys is not None else set()
        self.saved_keys: tuple[str, ...] = ()  # what the latest save wrote
        self.save_note = ""  # a note on the latest save (it went without the lock)

    def check_device(self, index: object) -> int | None:
        """``index`` if it names a GPU this process sees (None: every GPU); else
        ``SettingsError``."""
        index = check_device(index)
        if index is None:
            return None
        try:
            n = self._gpu_count()
        except Exception as e:  # a failing source sees no GPU
            self.failures.contain("status", e)
            n = 0
        if index >= n:
            seen = f"GPUs 0-{n - 1}" if n > 1 else ("GPU 0" if n == 1 else "no GPU")
            raise SettingsError("device", f"there is no GPU {show_value(index)}: "
                                          f"this process sees {seen}")
        return index

    def configure(
        self,
        *,
        interval_s: float | None = None,
        threshold_bytes: int | None = None,
        device: int | _Keep | None = UNCHANGED,
        peak: str | None = None,
        auto_show: bool | None = None,
        save: bool = False,
    ) -> Config:
        """Change settings: all checked first, saved first, then applied, then announced.

        A value that is refused raises ``SettingsError`` (a ``ValueError``) and changes
        nothing. ``save=True`` writes the settings file before anything is applied, so a write
        that fails (``OSError``) changes nothing either. ``device=None`` watches every GPU;
        leave it out to keep the current choice. Each of ``listeners`` is then called with a
        copy of the settings; a listener that raises is reported once and never stops the
        others or this call. Returns a copy of the settings now in force.
        """
        changes: dict[str, Any] = {}
        if interval_s is not None:
            changes["interval_s"] = check_interval_s(interval_s)
        if threshold_bytes is not None:
            changes["threshold_bytes"] = check_threshold_bytes(threshold_bytes)
        if device is not UNCHANGED:
            changes["device"] = self.check_device(device)
        if peak is not None:
            changes["peak"] = check_peak(peak)
        if auto_show is not None:
            changes["auto_show"] = check_auto_show(auto_show)
        with self._lock:
            new = replace(self.config, **changes)
            if save:
                # Only what this call sets (or, for a bare save, what this session set):
                # another kernel may have saved other keys since this one loaded the file.
                keys = set(changes) or self.session_keys
                saved = save_config({k: getattr(new, k) for k in sorted(keys)})
                self.saved_keys = tuple(sorted(keys - {"device"}))
                self.save_note = saved.note
            self._apply(new)
            self.session_keys |= set(changes)
            now = replace(self.config)
        self._announce(now)
        return now

    def _apply(self, new: Config) -> None:
        old = replace(self.config)
        # In place: the shell keeps this object across %reload_ext.
        for f in fields(Config):
            setattr(self.config, f.name, getattr(new, f.name))
        self._apply_to_engine(new, old)

    def _announce(self, cfg: Config) -> None:
        for fn in list(self.listeners):
            try:
                fn(replace(cfg))  # a copy each: a listener cannot change the settings behind us
            except Exception as e:
                name = getattr(fn, "__qualname__", type(fn).__name__)
                self.failures.contain(f"settings listener {name}", e)

    def check_starting_device(self) -> int | _Keep | None:
        """A starting device this process does not see is reported once, naming the source
        that set it, and gives way to the next source's, then to every GPU: only once the
        sources are up is the GPU count known. The device now chosen, or ``UNCHANGED``."""
        if self.config.device is None:
            return UNCHANGED
        choices = self._starting_devices
        if not choices or choices[0].index != self.config.device:  # a reload: this session's
            choices = (DeviceChoice(self.config.device, "settings"),)
        refused: list[tuple[DeviceChoice, SettingsError]] = []
        chosen: DeviceChoice | None = None
        for choice in choices:
            try:
                self.check_device(choice.index)
            except SettingsError as e:
                refused.append((choice, e))
            else:
                chosen = choice
                break
        index = None if chosen is None else chosen.index
        instead = instead_words("device", index, None if chosen is None else chosen.origin)
        for choice, why in refused:
            log.warning("%s", bad_setting_line(choice.origin, why, instead))
        if not refused:
            return UNCHANGED
        self.config.device = index
        return index


def repair(cfg: Config) -> None:
    """Every field of a ``Config`` handed in checked; a bad one is reported and reset, so the
    monitor never runs on a value ``configure`` would refuse."""
    for key, check in CHECKS.items():
        try:
            setattr(cfg, key, check(getattr(cfg, key)))
        except SettingsError as e:
            log.warning("%s", bad_setting_line("settings", e))
            setattr(cfg, key, getattr(Config(), key))
