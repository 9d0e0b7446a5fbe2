"""A Dask worker preload giving each worker the project's fake GPUs (tests only).

``GPUMEM_TEST_CLUSTER`` holds JSON: worker name -> scenario. A scenario is one of
``{"gpus": [...], "torch": {...}}`` (fake NVML devices, each
``{"uuid", "share", "others"}`` with this worker's own share of the device and the other
processes' bytes; ``hang_s`` makes NVML's memory call hang that long (while the file
``hang_when`` exists, if given); an optional fake torch with CUDA up and
``allocated``/``reserved``/``peak`` bytes), ``{"nvml": "missing"}`` (no driver) or
``{"gpumem_nb": "missing"}`` (the package cannot be imported there).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.fakes import (
    FakeCuda,
    FakeCudaDevice,
    FakeGpu,
    FakePynvml,
    fake_torch,
)

GiB = 1 << 30


class HangingPynvml(FakePynvml):
    """A driver call that takes ``hang_s`` to answer (a wedged GPU), or, with ``hang_when``,
    until that file is removed, whichever comes first: a test ends the hang when it is done
    with it instead of sleeping it out."""

    hang_s = 0.0
    hang_when = ""  # a file: hang only while it exists

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        if self.hang_s and (not self.hang_when or os.path.exists(self.hang_when)):
            deadline = time.monotonic() + self.hang_s
            while time.monotonic() < deadline and (
                    not self.hang_when or os.path.exists(self.hang_when)):
                time.sleep(0.02)
        return super().nvmlDeviceGetMemoryInfo(handle, version)


def dask_setup(worker: Any) -> None:
    scenarios = json.loads(os.environ.get("GPUMEM_TEST_CLUSTER", "{}"))
    sc = scenarios.get(str(worker.name), scenarios.get("*", {}))
    if sc.get("gpumem_nb") == "missing":
        for name in [m for m in sys.modules if m == "gpumem_nb" or m.startswith("gpumem_nb.")]:
            del sys.modules[name]
        sys.modules["gpumem_nb"] = None  # type: ignore[assignment]  # import now fails
        return
    if sc.get("nvml") == "missing":
        sys.modules["pynvml"] = FakePynvml(library_not_found=True)  # type: ignore[assignment]
        return
    gpus, devices = [], []
    for i, g in enumerate(sc.get("gpus", [])):
        gpus.append(FakeGpu(g["uuid"], bus_id=f"00000000:{0x18 + i:02X}:00.0"))
        devices.append(FakeCudaDevice(g["uuid"].removeprefix("GPU-")))
    nvml = HangingPynvml(gpus)
    nvml.hang_s = float(sc.get("hang_s", 0))
    nvml.hang_when = str(sc.get("hang_when", ""))
    sys.modules["pynvml"] = nvml  # type: ignore[assignment]
    t = sc.get("torch")
    cuda = FakeCuda(devices, initialized=bool(t))
    cuda.context_bytes = 0
    for i, g in enumerate(sc.get("gpus", [])):
        # Another process on the device: the parent (it exists in this PID namespace).
        cuda.others[i] = [(os.getppid(), int(g.get("others", 0)))] if g.get("others") else []
        devices[i].outside = int(g.get("share", 0))
        devices[i].context = bool(g.get("share", 0))
    if t:
        for d in devices:
            d.allocated, d.reserved = int(t["allocated"]), int(t["reserved"])
            d.peak_allocated = int(t.get("peak", t["allocated"]))
            d.outside = max(d.outside - d.reserved, 0)
        sys.modules["torch"] = fake_torch(cuda)
    cuda.link(gpus)
