"""The allocator's nested stats dict read into an ``AllocatorReading`` (junk reads as 0, never
raises), and the allocator configuration the environment gives torch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from ...model import AllocatorReading

__all__ = ["ALLOC_CONF_VARS", "ZERO_READING", "alloc_conf", "backend_from_env", "parse_stats"]

ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def _stat(stats: Mapping[str, Any], name: str, which: str) -> int:
    try:
        return int(stats[name]["all"][which])
    except (KeyError, TypeError, ValueError, OverflowError):
        return 0


def parse_stats(stats: Mapping[str, Any]) -> AllocatorReading:
    """Pick the fields we need out of one nested stats dict."""
    return AllocatorReading(
        allocated_bytes=_stat(stats, "allocated_bytes", "current"),
        reserved_bytes=_stat(stats, "reserved_bytes", "current"),
        active_bytes=_stat(stats, "active_bytes", "current"),
        inactive_split_bytes=_stat(stats, "inactive_split_bytes", "current"),
        peak_allocated_bytes=_stat(stats, "allocated_bytes", "peak"),
        peak_reserved_bytes=_stat(stats, "reserved_bytes", "peak"),
        num_alloc_retries=_count(stats, "num_alloc_retries"),
        num_ooms=_count(stats, "num_ooms"),
        allocations=_stat(stats, "allocation", "allocated"),
        frees=_stat(stats, "allocation", "freed"),
    )


def _count(stats: Mapping[str, Any], name: str) -> int:
    # Junk in a stats dict (a patched allocator, a future format) reads as 0, never raises.
    try:
        return int(stats.get(name, 0) or 0)
    except (TypeError, ValueError, OverflowError):
        return 0


# The reading of a device this process has no context on: it has never allocated there.
ZERO_READING = AllocatorReading(0, 0, 0, 0, 0, 0, 0, 0)


def alloc_conf(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The allocator configuration in effect and the variable it came from.

    ``PYTORCH_ALLOC_CONF`` is the current name; torch still honours the older one.
    """
    env = os.environ if env is None else env
    for var in ALLOC_CONF_VARS:
        if env.get(var):
            return env[var], var
    return "", ""


def _unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Turn ``memory_stats``' dotted keys back into the nested shape (old torch fallback)."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def backend_from_env(env: Mapping[str, str] | None = None) -> str:
    """The allocator backend torch picks from the environment as it is imported: c10's
    ``CUDAAllocatorConfig::instance()`` reads ``PYTORCH_CUDA_ALLOC_CONF`` when it is set (even
    empty) and only otherwise ``PYTORCH_ALLOC_CONF``, so the older name wins when both are
    set. Only a stand-in for ``torch._C._cuda_getAllocatorBackend``, for builds without it:
    the environment can have changed since the import, the allocator chosen then cannot."""
    env = os.environ if env is None else env
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF")
    if conf is None:
        conf = env.get("PYTORCH_ALLOC_CONF", "")
    for option in re.split(r"[\s,]+", conf):
        key, _, value = option.partition(":")
        if key.strip() == "backend" and value.strip():
            return value.strip()
    return "native"
