"""The settings as IPython's configuration: the ``GpumemNb`` configurable, for
``c.GpumemNb.interval = 1.0`` in ipython_config.py and ``%config GpumemNb``. Apart from
settings.py so that reading the settings (``python -m gpumem_nb``, ``snapshot()``) does not
import traitlets.config; the magics make one per load (settings.py says the precedence).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import traitlets
from traitlets import HasTraits, TraitError, TraitType, observe, validate
from traitlets.config import Configurable
from traitlets.config.loader import DeferredConfig, LazyConfigValue

from .analysis import DEFAULT_THRESHOLD_BYTES
from .sampler import DEFAULT_INTERVAL_S, MAX_INTERVAL_S, MIN_INTERVAL_S
from .settings import (
    PEAK_PRESERVE,
    PEAK_RESET,
    TRAIT_FIELDS,
    Config,
    SettingsError,
    check_trait,
    plain,
)

__all__ = [
    "Bool",
    "Float",
    "GpumemNb",
    "Int",
    "Unicode",
    "Union",
]


class _Refusal(TraitType[Any, Any]):
    """A trait that refuses a value of the wrong type in the settings' own words, cut
    (traitlets' message echoes the whole value: 100,000 characters for a long string)."""

    def validate(self, obj: Any, value: Any) -> Any:
        # The plain value (settings.plain): traitlets' own bounds compare it, and a float
        # subclass whose comparison raises was refused with "ERROR division by zero". The
        # validate called is the traitlets type's, next in the MRO (TraitType has none).
        return super().validate(obj, plain(value))  # type: ignore[misc]

    def error(self, obj: HasTraits | None, value: Any, error: Exception | None = None,
              info: str | None = None) -> NoReturn:
        name = self.name
        if name in TRAIT_FIELDS:
            try:
                check_trait(name, value)
            except SettingsError as e:
                raise TraitError(f"GpumemNb.{name}: {e.why}") from None
        super().error(obj, value, error, info)


# Named as traitlets' own: %config GpumemNb shows each trait's class name.
class Float(_Refusal, traitlets.Float):
    pass


class Int(_Refusal, traitlets.Int):
    pass


class Bool(_Refusal, traitlets.Bool):
    pass


class Unicode(_Refusal, traitlets.Unicode):
    pass


class Union(_Refusal, traitlets.Union):
    pass


class GpumemNb(Configurable):
    """gpumem_nb's settings, the same as %gpumem config's. Precedence, lowest first: the
    defaults, ipython_config.py (c.GpumemNb.interval = 1.0), the file %gpumem config --save
    writes, GPUMEM_NB_AUTO_SHOW; then what the session sets (%gpumem config, %config GpumemNb)."""

    interval = Float(DEFAULT_INTERVAL_S, help="sampling interval in seconds, "
                     f"{MIN_INTERVAL_S:g}-{MAX_INTERVAL_S:g} (%gpumem config --interval)"
                     ).tag(config=True)
    device = Int(None, allow_none=True, help="which GPU to record; None for every GPU "
                 "(%gpumem config --device); never saved to the file").tag(config=True)
    threshold = Union([Int(), Unicode()], default_value=DEFAULT_THRESHOLD_BYTES,
                      help="re-run growth to flag: bytes, or a size such as '64MiB' "
                      "(%gpumem config --threshold)").tag(config=True)
    peak = Unicode(PEAK_PRESERVE, help=f"'{PEAK_PRESERVE}': never reset PyTorch's peak "
                   f"counters; '{PEAK_RESET}': reset them before each cell (%gpumem config "
                   "--peak)").tag(config=True)
    auto_show = Bool(False, help="show the live chart when the extension loads (%gpumem "
                     "config --auto-show)").tag(config=True)

    def __init__(self, current: Config, configure: Callable[..., object],
                 check_device: Callable[[object], object]) -> None:
        super().__init__()
        self._configure = configure
        self._check_device = check_device
        self._mirroring = False
        self.mirror(current)

    def update_config(self, config: traitlets.config.Config) -> None:
        """``%config GpumemNb.x = bad``: IPython's %config logs a refused value as
        "ERROR:root:…", which reads as a crash; every other refusal of ours is one
        "UsageError: …" line, the form IPython prints it in. The value stays unchanged."""
        try:
            self._refuse_early(config)
            super().update_config(config)
        except TraitError as e:
            print(f"UsageError: {e}", file=sys.stderr)

    @staticmethod
    def _refuse_early(config: object) -> None:
        """traitlets deep-copies a value before the validator sees it (1.4 s for a list of
        ten million): each plain value of our section is checked first, as it is."""
        if not isinstance(config, traitlets.config.Config) or "GpumemNb" not in config:
            return
        for name, value in dict.items(config["GpumemNb"]):
            if name not in TRAIT_FIELDS or isinstance(value, (LazyConfigValue, DeferredConfig)):
                continue  # traitlets resolves these first; the validator checks the result
            try:
                check_trait(name, value)
            except SettingsError as e:
                raise TraitError(f"GpumemNb.{name}: {e.why}") from None

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        self._mirroring = True
        try:
            yield
        finally:
            self._mirroring = False

    def mirror(self, cfg: Config) -> None:
        """Show ``cfg`` in the traits without applying anything (the monitor's listener)."""
        with self._quiet():
            for trait, field in TRAIT_FIELDS.items():
                setattr(self, trait, getattr(cfg, field))

    @validate(*TRAIT_FIELDS)
    def _check(self, proposal: Any) -> object:
        name = proposal["trait"].name
        if self._mirroring:
            return proposal["value"]
        try:
            value = check_trait(name, proposal["value"])
            if name == "device":
                value = self._check_device(value)
        except SettingsError as e:
            raise TraitError(f"GpumemNb.{name}: {e.why}") from None
        return value

    @observe(*TRAIT_FIELDS)
    def _changed(self, change: Any) -> None:
        if self._mirroring:
            return
        try:
            self._configure(**{TRAIT_FIELDS[change["name"]]: change["new"]})
        except Exception:
            with self._quiet():  # the monitor refused it: show what is in force
                setattr(self, change["name"], change["old"])
            raise
