"""Settings: defaults, a user file, and environment variables.

``%gpumem config ... --save`` writes ``~/.config/gpumem_nb/config.json`` (or the file named by
``GPUMEM_NB_CONFIG``); loading the extension reads it. ``GPUMEM_NB_AUTO_SHOW=1`` shows the
chart on load whatever the file says. A file that cannot be read is ignored with one warning:
settings must never stop the extension from loading.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .analysis import DEFAULT_THRESHOLD_BYTES
from .sampler import DEFAULT_INTERVAL_S, check_interval

log = logging.getLogger("gpumem_nb")

PEAK_PRESERVE = "preserve"
PEAK_RESET = "reset"
CONFIG_ENV = "GPUMEM_NB_CONFIG"
AUTO_SHOW_ENV = "GPUMEM_NB_AUTO_SHOW"


@dataclass
class Config:
    interval_s: float = DEFAULT_INTERVAL_S
    device: int | None = None  # None: every visible GPU
    threshold_bytes: int = DEFAULT_THRESHOLD_BYTES
    # Default: leave the process-wide peak counters alone (users read them too).
    peak: str = PEAK_PRESERVE
    auto_show: bool = False


def config_path() -> Path:
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "gpumem_nb" / "config.json"


def load_config() -> Config:
    cfg = Config()
    path = config_path()
    if path.exists():
        try:
            data = json.loads(path.read_text())
            known = {f.name for f in fields(Config)}
            cfg = Config(**{k: v for k, v in data.items() if k in known})
            check_interval(cfg.interval_s)
            if cfg.peak not in (PEAK_PRESERVE, PEAK_RESET):
                raise ValueError(f"peak must be {PEAK_PRESERVE} or {PEAK_RESET}")
        except (OSError, ValueError, TypeError) as e:
            log.warning("gpumem_nb ignored %s: %s", path, e)
            cfg = Config()
    if os.environ.get(AUTO_SHOW_ENV) == "1":
        cfg.auto_show = True
    return cfg


def save_config(cfg: Config) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = asdict(cfg)
    data.pop("device")  # which GPU to watch belongs to a session, not to every notebook
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
