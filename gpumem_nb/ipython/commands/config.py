"""``config``: show or change the settings, through the monitor, their one writer."""

from __future__ import annotations

import argparse

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.display import display

from ... import safeio
from ...kernel import UNCHANGED, Monitor
from ...settings import PEAK_PRESERVE, PEAK_RESET, SettingsError, config_path
from ...units import format_bytes, parse_size
from ...views import ConfigView
from ..grammar import Parser, Subcommand, device_arg, short_message

__all__ = ["CONFIG", "FLAGS"]

# The magic's flag for each setting, so a refused value is reported in the user's words.
FLAGS = {"interval_s": "--interval", "threshold_bytes": "--threshold", "device": "--device",
         "peak": "--peak", "auto_show": "--auto-show"}


def _flags(g: Parser) -> None:
    g.add_argument("--interval", type=float, metavar="S", help="sampling interval, 0.05-60 s")
    g.add_argument("--device", metavar="N|all", help="which GPU to record")
    g.add_argument("--threshold", metavar="SIZE", help="re-run growth to flag, e.g. 64MB")
    g.add_argument("--peak", choices=(PEAK_PRESERVE, PEAK_RESET),
                   help="preserve: never reset peak counters; reset: reset before each cell")
    g.add_argument("--auto-show", choices=("on", "off"), help="show the widget on load")
    g.add_argument("--save", action="store_true",
                   help="remember these settings for future sessions (a JSON file)")


def config(m: Monitor, shell: InteractiveShell, args: argparse.Namespace) -> None:
    # Only the monitor writes settings: it checks every value, saves, then applies, so a
    # refused value or a failed save changes nothing.
    threshold = None
    if args.threshold is not None:
        try:
            threshold = parse_size(args.threshold)
        except ValueError as e:
            raise UsageError(short_message(f"--threshold: {e}")) from None
    try:
        m.configure(
            interval_s=args.interval, threshold_bytes=threshold,
            device=UNCHANGED if args.device is None else device_arg(args.device),
            peak=args.peak,
            auto_show=None if args.auto_show is None else args.auto_show == "on",
            save=args.save,
        )
    except SettingsError as e:
        raise UsageError(f"{FLAGS.get(e.key, e.key)}: {e.why}") from None
    except OSError as e:
        raise UsageError(f"could not save the settings to {safeio.shown(config_path())}: "
                         f"{safeio.reason(e)}; nothing was changed") from None
    typed = (args.threshold or "").strip()
    if threshold is not None and format_bytes(threshold).replace(" ", "") != typed:
        # 512MB is decimal: say what it came to, beside what was typed.
        print(f"gpumem: threshold {typed} = {format_bytes(threshold)} "
              f"({threshold:,} bytes)")
    if args.save:
        what = ", ".join(m.saved_keys) if m.saved_keys else \
            "nothing (no setting was changed in this session; device is never saved)"
        print(f"gpumem: saved {what} to {safeio.shown(config_path())}")
        if m.save_note:
            print(f"gpumem: {m.save_note}.")
    display(ConfigView(m.config, m.sampling))


CONFIG = Subcommand(
    "config", "show or change the settings; --save remembers them in\n"
              "~/.config/gpumem_nb/config.json (or the file $GPUMEM_NB_CONFIG names)",
    _flags, config)
