"""Allocator what-if: replay a recorded allocation history under other ``PYTORCH_ALLOC_CONF``
settings and predict reserved memory, stranded bytes, ``cudaMalloc`` calls and OOMs.

Pure: no torch, no GPU. ``rules.py`` and ``allocator.py`` (with its parts: ``allocstate``,
``blocks``, ``expandable``, ``release``, ``seeding``) model the native caching allocator;
``config.py`` reads settings as PyTorch does; ``snapshot.py`` reads snapshots; ``replay.py``
drives the model; ``report.py`` shows the result; ``api.py`` ties them together.
``docs/whatif.md`` says what the model leaves out and how well it matched the real allocator.
``cudaMallocAsync`` lives inside the driver: it cannot be modelled, and is never guessed.

This module stays small because ``import gpumem_nb`` imports it (see there): the rest loads
on first use.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import WhatIf

_LAZY = {name: ".api" for name in (
    "DEFAULT_ALTERNATIVES", "SettingError", "SnapshotError", "WhatIfChart", "WhatIfRow",
    "expandable_oom_line", "load", "parse_settings", "parse_settings_or_none", "run",
    "same_rules", "trace_input", "views", "with_setting")}
_LAZY["WhatIf"] = ".api"
_LAZY["Limits"] = ".allocator"


def whatif(snapshot: Mapping[str, Any] | str | os.PathLike[str], settings: Sequence[str],
           capacity_bytes: int | None = None, *, device: int | None = None,
           fit: bool | float = False, total_bytes: int | None = None) -> WhatIf:
    """Replay ``snapshot``'s allocation history under each of ``settings`` (one
    ``PYTORCH_ALLOC_CONF`` string each, ``""`` for the defaults) and return one row per
    setting, in the order given: ``peak_reserved_bytes``, ``end_reserved_bytes``,
    ``inactive_split_bytes`` (free bytes ``empty_cache`` could not give back, at the peak),
    ``segment_allocs`` and ``segment_frees`` (``cudaMalloc``/``cudaFree`` calls; page maps and
    unmaps under expandable segments) and ``oom`` (at ``capacity_bytes``; by default what was
    free to PyTorch when the history began, when the snapshot says; else None).

    ``snapshot`` is ``torch.cuda.memory._snapshot()``'s dict or a path to its pickle (ours
    from ``%%gpumem --trace --save`` or ``torch.cuda.memory._dump_snapshot``'s). Needs neither
    a GPU nor torch. Raises ``ValueError`` (``SettingError``, ``SnapshotError``) with a plain
    sentence for a setting PyTorch would refuse, a capacity no GPU has or a file that is not
    a snapshot, and ``TypeError`` for settings that are not a list or a device that is not a
    GPU number. Fields of the snapshot that hold junk are skipped and counted, never raised on.

    ``fit=True`` also finds, per setting, the smallest memory in which the history runs
    without an OOM (``result.fit``: its rows' ``min_bytes``, a yes/no per common GPU size,
    and ``result.fit.sentence(40)`` naming the cheapest setting that fits a 40 GB GPU);
    ``fit=40`` says that sentence for 40 GB. ``total_bytes``: the GPU's memory, for a
    snapshot that does not say it (``_dump_snapshot``'s), so that a
    ``per_process_memory_fraction`` and ``garbage_collection_threshold`` are modelled.
    """
    from .api import whatif as _whatif

    return _whatif(snapshot, settings, capacity_bytes, device=device, fit=fit,
                   total_bytes=total_bytes)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


__all__ = sorted([*_LAZY, "whatif"])
