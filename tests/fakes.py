"""Fakes at the two boundaries we do not own: the ``pynvml`` module and ``torch.cuda``.

Each is scripted per test and named after a real failure (see the scenarios in test_nvml.py).
They record calls so tests can prove that observing never mutates the user's state.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

GiB = 1 << 30
MiB = 1 << 20


# --------------------------------------------------------------------------------------------
# pynvml
# --------------------------------------------------------------------------------------------
class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H200"
    bus_id: str = "00000000:18:00.0"
    total_bytes: int = 141 * GiB
    used_bytes: int = 0
    reserved_bytes: int = 615 * MiB
    procs: list[tuple[int, int | None]] = field(default_factory=list)
    lost: bool = False
    capability: tuple[int, int] = (9, 0)
    migs: list[FakeGpu] = field(default_factory=list)


class FakePynvml:
    """A stand-in for the ``pynvml`` module with just the calls gpumem_nb makes."""

    NVML_SUCCESS = 0
    NVML_ERROR_UNINITIALIZED = 1
    NVML_ERROR_INVALID_ARGUMENT = 2
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NO_PERMISSION = 4
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_UNKNOWN = 999
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
    nvmlMemory_v2 = 0x02000028
    NVMLError = NVMLError

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        library_not_found: bool = False,
        v2_missing: bool = False,
        v3_missing: bool = False,
        processes_unsupported: bool = False,
    ) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu("GPU-aaaa-1111")]
        self.library_not_found = library_not_found
        self.v2_missing = v2_missing
        self.v3_missing = v3_missing
        self.processes_unsupported = processes_unsupported
        self.calls: list[str] = []
        self.inits = 0
        self.shutdowns = 0

    def _h(self, handle: Any) -> FakeGpu:
        if handle.lost:
            raise NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return handle  # type: ignore[no-any-return]

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.library_not_found:
            raise NVMLError(self.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return h.name

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Any:
        return SimpleNamespace(busId=h.bus_id.encode())

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeGpu) -> tuple[int, int]:
        return h.capability

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> tuple[int, int]:
        return (1, 1) if h.migs else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        return 7 if h.migs else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, j: int) -> FakeGpu:
        if j >= len(h.migs):
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return h.migs[j]

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu, version: int | None = None) -> Any:
        h = self._h(handle)
        self.calls.append(f"memory_v{2 if version else 1}")
        if version:
            if self.v2_missing:
                raise NVMLError(self.NVML_ERROR_FUNCTION_NOT_FOUND)
            return SimpleNamespace(
                total=h.total_bytes, used=h.used_bytes, reserved=h.reserved_bytes,
                free=h.total_bytes - h.used_bytes - h.reserved_bytes,
            )
        # v1 folds the driver's reservation into "used".
        return SimpleNamespace(
            total=h.total_bytes, used=h.used_bytes + h.reserved_bytes,
            free=h.total_bytes - h.used_bytes - h.reserved_bytes,
        )

    def _procs(self, handle: FakeGpu) -> list[Any]:
        h = self._h(handle)
        if self.processes_unsupported:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in h.procs]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: FakeGpu) -> list[Any]:
        if self.v3_missing:
            raise NVMLError(self.NVML_ERROR_FUNCTION_NOT_FOUND)
        self.calls.append("procs_v3")
        return self._procs(handle)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: FakeGpu) -> list[Any]:
        self.calls.append("procs_v2")
        return self._procs(handle)


# --------------------------------------------------------------------------------------------
# torch
# --------------------------------------------------------------------------------------------
def nested_stats(
    allocated: int = 0,
    reserved: int = 0,
    peak_allocated: int | None = None,
    peak_reserved: int | None = None,
    inactive_split: int = 0,
    retries: int = 0,
    ooms: int = 0,
) -> dict[str, Any]:
    def stat(cur: int, peak: int | None) -> dict[str, Any]:
        return {"all": {"current": cur, "peak": cur if peak is None else peak,
                        "allocated": cur, "freed": 0}}

    return {
        "allocated_bytes": stat(allocated, peak_allocated),
        "reserved_bytes": stat(reserved, peak_reserved),
        "active_bytes": stat(allocated, peak_allocated),
        "inactive_split_bytes": stat(inactive_split, None),
        "num_alloc_retries": retries,
        "num_ooms": ooms,
    }


class FakeCudaMemory:
    def __init__(self, cuda: FakeCuda) -> None:
        self._cuda = cuda

    def memory_stats_as_nested_dict(self, device: int) -> dict[str, Any]:
        self._cuda.calls.append(f"stats({device})")
        if not self._cuda.initialized:
            return {}
        d = self._cuda.devices[device]
        return nested_stats(d.allocated, d.reserved, d.peak_allocated, d.peak_reserved,
                            d.inactive_split)


@dataclass
class FakeCudaDevice:
    uuid: str
    bus: int = 0x18
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    inactive_split: int = 0
    outside: int = 0  # memory in this process that PyTorch does not manage (cuBLAS, CuPy)
    context: bool = False


class FakeCuda:
    """``torch.cuda`` with a scripted allocator. Records every call by name."""

    def __init__(self, devices: list[FakeCudaDevice] | None = None, *,
                 initialized: bool = False) -> None:
        self.devices = devices if devices is not None else [FakeCudaDevice("aaaa-1111")]
        self.initialized = initialized
        self.calls: list[str] = []
        self.memory = FakeCudaMemory(self)
        self.nvml_gpus: list[FakeGpu] = []

    def is_initialized(self) -> bool:
        return self.initialized

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return len(self.devices)

    def get_device_properties(self, i: int) -> Any:
        self.calls.append(f"get_device_properties({i})")
        if not self.initialized:
            raise AssertionError("get_device_properties would initialise CUDA")
        d = self.devices[i]
        return SimpleNamespace(uuid=d.uuid, pci_bus_id=d.bus, pci_domain_id=0, pci_device_id=0)

    def get_allocator_backend(self) -> str:
        return "native"

    # The driver's view: a context plus whatever the cache holds, like the real thing.
    context_bytes = 500 * MiB

    def link(self, gpus: list[FakeGpu]) -> None:
        """Make NVML's numbers follow this allocator's reserved bytes."""
        self.nvml_gpus = gpus
        self._sync()

    def _sync(self) -> None:
        for d, g in zip(self.devices, self.nvml_gpus, strict=False):
            # A device gets a context once this process puts something on it.
            d.context = d.context or bool(self.initialized and (d.reserved or d.outside))
            used = (self.context_bytes if d.context else 0) + d.reserved + d.outside
            g.used_bytes = used
            g.procs = [(os.getpid(), used)] if d.context else []

    def allocate(self, i: int, nbytes: int) -> None:
        d = self.devices[i]
        d.allocated += nbytes
        d.reserved = max(d.reserved, d.allocated)
        d.peak_allocated = max(d.peak_allocated, d.allocated)
        d.peak_reserved = max(d.peak_reserved, d.reserved)
        self._sync()

    def free(self, i: int, nbytes: int) -> None:
        self.devices[i].allocated -= nbytes
        self._sync()

    def tensor(self, nbytes: int, device: int = 0, grad_fn: Any = None) -> FakeTensor:
        self.initialized = True
        self.allocate(device, nbytes)
        return FakeTensor(nbytes, f"cuda:{device}", grad_fn=grad_fn, owner=self)

    # Mutations a monitor must never make on its own.
    def empty_cache(self) -> None:
        self.calls.append("empty_cache")
        for d in self.devices:
            d.reserved = d.allocated
        self._sync()

    def reset_peak_memory_stats(self, device: int | None = None) -> None:
        self.calls.append(f"reset_peak_memory_stats({device})")
        if not self.initialized:
            raise AssertionError("reset_peak_memory_stats would initialise CUDA")
        for i, d in enumerate(self.devices):
            if device is None or device == i:
                d.peak_allocated = d.allocated
                d.peak_reserved = d.reserved

    def synchronize(self, device: int | None = None) -> None:
        self.calls.append("synchronize")


class FakeTensor:
    """Duck-types the few ``torch.Tensor`` attributes the holder scan reads.

    Made through ``FakeCuda.tensor`` it owns allocator bytes and frees them when the last
    reference goes, as a real CUDA tensor does, so Out[n] or a traceback keeping it alive shows
    up in the allocator's numbers.
    """

    def __init__(self, nbytes: int, device: str = "cuda:0", grad_fn: Any = None,
                 owner: Any = None) -> None:
        self._nbytes = nbytes
        self._owner = owner
        self.device = SimpleNamespace(type=device.split(":")[0],
                                      index=int(device.split(":")[1]) if ":" in device else None)
        self.is_cuda = device.startswith("cuda")
        self.grad_fn = grad_fn
        self.grad: FakeTensor | None = None
        self.is_leaf = grad_fn is None
        self.shape = (nbytes // 4,)
        self.dtype = "torch.float32"

    def __del__(self) -> None:
        if self._owner is not None:
            self._owner.free(self.device.index or 0, self._nbytes)

    def untyped_storage(self) -> Any:
        return SimpleNamespace(nbytes=lambda: self._nbytes, data_ptr=lambda: id(self))

    def element_size(self) -> int:
        return 4

    def nelement(self) -> int:
        return self._nbytes // 4


def fake_torch(cuda: FakeCuda | None = None) -> Any:
    mod = SimpleNamespace(
        cuda=cuda if cuda is not None else FakeCuda(),
        version=SimpleNamespace(cuda="13.0"),
        Tensor=FakeTensor,
        __name__="torch",
    )
    return mod


def our_pid() -> int:
    return os.getpid()
