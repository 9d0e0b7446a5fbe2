"""PyTorch's caching allocator, read without changing anything.

This module never imports torch (but for ``import_torch``, which the user asks for by name)
and never initialises CUDA: it looks torch up in
``sys.modules`` and reads only once ``torch.cuda.is_initialized()`` is true, the same guard
PyTorch's own ``torch/cuda/memory.py`` applies. ``memory_stats``, ``memory_allocated`` and
friends each build the whole flattened stats dict (65–125 µs apiece on an H200), so one sample
makes exactly one call, ``memory_stats_as_nested_dict(index)``, which skips the flattening, and
takes every key from it. The device index is always explicit because the current device is per
thread and the sampler runs on its own thread.

One job to a file: ``stats`` reads the stats dict and the allocator's configuration;
``source`` is ``TorchSource``, the readings behind that guard; ``debug`` is ``TorchDebug``, the
debugging hooks (OOM observer, allocation history, snapshots) the explainer and the trace use.
"""

from __future__ import annotations

from .debug import OOM_OBSERVER_ATTR, OOM_QUEUED_ATTR, TorchDebug, inductor_lookup_skipped
from .source import (
    INIT_HOOK_ATTR,
    TORCH_INITIALIZED,
    TORCH_NO_CUDA,
    TORCH_NOT_IMPORTED,
    TORCH_NOT_INITIALIZED,
    CudaStartHook,
    TorchSource,
)
from .stats import ALLOC_CONF_VARS, ZERO_READING, alloc_conf, backend_from_env, parse_stats

__all__ = [
    "ALLOC_CONF_VARS",
    "INIT_HOOK_ATTR",
    "OOM_OBSERVER_ATTR",
    "OOM_QUEUED_ATTR",
    "TORCH_INITIALIZED",
    "TORCH_NOT_IMPORTED",
    "TORCH_NOT_INITIALIZED",
    "TORCH_NO_CUDA",
    "ZERO_READING",
    "CudaStartHook",
    "TorchDebug",
    "TorchSource",
    "alloc_conf",
    "backend_from_env",
    "inductor_lookup_skipped",
    "parse_stats",
]
