"""What runs inside a cluster worker: gpumem_nb's own sources, read once, as plain data.

The engine ships ``report`` by reference (``gpumem_nb.cluster.worker.report``), so a worker
without gpumem_nb fails to load it and its row says so. Inside the worker the same guarantees
hold as in the kernel: torch is read only if that worker has already imported it and started
CUDA (``sys.modules``; nothing is imported), and NVML never creates a CUDA context. The source
is kept per worker process, so NVML is initialised once, not on every collection.

The answer is built from ints and strings only: any engine can serialise it.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

from .._version import __version__
from ..model import STATUS_OK

__all__ = ["report"]

_LOCK = threading.Lock()
_SOURCE: Any = None


def _source() -> Any:
    global _SOURCE
    with _LOCK:
        if _SOURCE is None:
            from ..sources.live import LiveSource

            _SOURCE = LiveSource()
            _SOURCE.start()
        return _SOURCE


def report(dask_worker: Any = None) -> dict[str, Any]:
    """This worker's GPUs: NVML's view of each device, this process's own NVML share and its
    allocator's figures. ``dask_worker`` is filled in by Dask's ``Client.run``."""
    src = _source()
    status = src.status()
    sample = src.read(processes=True)
    devices = []
    for d in sample.devices:
        nv, al = d.nvml, d.allocator
        devices.append({
            "index": d.index,
            "uuid": nv.uuid if nv else "",
            "name": nv.name if nv else "",
            "used_bytes": nv.used_bytes if nv else None,
            "total_bytes": nv.total_bytes if nv else None,
            "process_bytes": nv.process_bytes if nv else None,
            "status": nv.status if nv else STATUS_OK,
            "detail": nv.detail if nv else "",
            "allocated_bytes": al.allocated_bytes if al else None,
            "reserved_bytes": al.reserved_bytes if al else None,
            "peak_allocated_bytes": al.peak_allocated_bytes if al else None,
        })
    return {
        "gpumem_nb": __version__,  # the kernel says when its workers run another version
        "pid": os.getpid(),
        "name": "" if getattr(dask_worker, "name", None) is None else str(dask_worker.name),
        "host": socket.gethostname(),
        "nvml": status.nvml,
        "torch": status.torch,
        "devices": devices,
    }
