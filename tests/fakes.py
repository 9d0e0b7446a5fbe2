"""Fakes at the two boundaries we do not own: the ``pynvml`` module and ``torch.cuda``.

Each is scripted per test and named after a real failure (see the scenarios in test_nvml.py).
They record calls so tests can prove that observing never mutates the user's state.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
import traceback
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
        init_error: int | None = None,
    ) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu("GPU-aaaa-1111")]
        self.library_not_found = library_not_found
        self.v2_missing = v2_missing
        self.v3_missing = v3_missing
        self.processes_unsupported = processes_unsupported
        # nvmlInit's error code, as a driver answers: FUNCTION_NOT_FOUND when the driver is
        # older than nvidia-ml-py's nvmlInit_v2, DRIVER_NOT_LOADED, NO_PERMISSION.
        self.init_error = init_error
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
        if self.init_error is not None:
            raise NVMLError(self.init_error)
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


def _memory_snapshot(self: Any, mempool_id: Any = None, include_traces: bool = True) -> Any:
    """torch >= 2.12's segments-only form (``include_traces=False`` is cheap)."""
    self._cuda.calls.append(f"memory_snapshot(include_traces={include_traces})")
    return self._build_snapshot()["segments"]


class FakeCudaMemory:
    def __init__(self, cuda: FakeCuda) -> None:
        self._cuda = cuda

    def memory_stats_as_nested_dict(self, device: int) -> dict[str, Any]:
        self._cuda.calls.append(f"stats({device})")
        if not self._cuda.initialized:
            return {}
        d = self._cuda.devices[device]
        return nested_stats(d.allocated, d.reserved, d.peak_allocated, d.peak_reserved,
                            d.inactive_split, retries=d.retries, ooms=d.ooms)

    # Allocation history, as torch.cuda.memory's private API behaves (native backend only).
    def _record_memory_history(self, enabled: Any = "all", context: Any = "all",
                               stacks: str = "all", max_entries: int = 2**63) -> None:
        c = self._cuda
        c.calls.append(f"record_memory_history({enabled!r})")
        if not c.initialized:
            raise AssertionError("_record_memory_history would initialise CUDA")
        if c.backend == "cudaMallocAsync":
            raise RuntimeError("cudaMallocAsync does not yet support recordHistory. If you "
                               "need it, please file an issue describing your use case.")
        c.history = enabled if enabled else None
        c.history_max = max_entries
        if not enabled:
            c.traces = [[] for _ in c.devices]  # switching off clears the buffer

    def _snapshot(self) -> dict[str, Any]:
        c = self._cuda
        c.calls.append("snapshot")
        return self._build_snapshot()

    def memory_snapshot(self, mempool_id: Any = None, include_traces: bool = True) -> Any:
        return _memory_snapshot(self, mempool_id, include_traces)

    def _build_snapshot(self) -> dict[str, Any]:
        c = self._cuda
        if c.backend == "cudaMallocAsync":
            raise RuntimeError("Calling snapshot with backend:cudaMallocAsync is not meaningful.")
        if not c.initialized:
            return {"segments": [], "device_traces": []}
        segments = []
        for i, d in enumerate(c.devices):
            # The tensors with the free holes between them (inactive_split) in one segment,
            # and the rest of the cache as a segment with nothing in it.
            pieces = d.pieces()
            if d.allocated or pieces:
                blocks = [{"size": d.allocated, "state": "active_allocated", "frames": []}]
                blocks += [{"size": n, "state": "inactive", "frames": []} for n in pieces]
                segments.append({"device": i, "total_size": d.allocated + sum(pieces),
                                 "allocated_size": d.allocated, "is_expandable": c.expandable,
                                 "blocks": blocks})
            rest = d.reserved - d.allocated - sum(pieces)
            if rest > 0:
                segments.append({"device": i, "total_size": rest, "allocated_size": 0,
                                 "is_expandable": c.expandable,
                                 "blocks": [{"size": rest, "state": "inactive", "frames": []}]})
        return {"segments": segments, "device_traces": [list(t) for t in c.traces],
                "allocator_settings": {"expandable_segments": c.expandable,
                                       "PYTORCH_CUDA_ALLOC_CONF": ""}}


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
    total: int = 141 * GiB  # what CUDA calls the device's total memory
    retries: int = 0
    ooms: int = 0
    free_pieces: list[int] = field(default_factory=list)  # the inactive split blocks' sizes

    def pieces(self) -> list[int]:
        """The free holes inside the segment that holds the tensors."""
        return self.free_pieces or ([self.inactive_split] if self.inactive_split else [])


class FakeCuda:
    """``torch.cuda`` with a scripted allocator. Records every call by name."""

    def __init__(self, devices: list[FakeCudaDevice] | None = None, *,
                 initialized: bool = False, backend: str = "native") -> None:
        self.devices = devices if devices is not None else [FakeCudaDevice("aaaa-1111")]
        self.initialized = initialized
        self.calls: list[str] = []
        self.memory = FakeCudaMemory(self)
        self.nvml_gpus: list[FakeGpu] = []
        self.backend = backend
        self.expandable = False
        self.fraction = 1.0
        self.observers: list[Any] = []  # OOM observers, as the native allocator keeps them
        self.history: str | None = None
        self.history_max = 0
        self.traces: list[list[dict[str, Any]]] = [[] for _ in self.devices]
        self.others: dict[int, list[tuple[int, int]]] = {}  # other processes, per device
        self.queued_calls: list[Any] = []  # torch.cuda._lazy_call's queue

    def _lazy_call(self, fn: Any) -> None:
        """torch.cuda._lazy_call: run now if CUDA is up, else queue until it starts."""
        if self.initialized:
            fn()
        else:
            self.queued_calls.append(fn)

    def _lazy_init(self) -> None:
        """What any first CUDA call does: start CUDA, then run the queued calls (on the
        calling thread, inside the user's stack)."""
        if self.initialized:
            return
        self.initialized = True
        for fn in self.queued_calls:
            fn()

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self) -> None:
        """torch.cuda.init(): start CUDA (what %gpumem record on --start-cuda asks for)."""
        self.calls.append("init")
        self._lazy_init()

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return len(self.devices)

    def get_device_properties(self, i: int) -> Any:
        self.calls.append(f"get_device_properties({i})")
        if not self.initialized:
            raise AssertionError("get_device_properties would initialise CUDA")
        d = self.devices[i]
        return SimpleNamespace(uuid=d.uuid, pci_bus_id=d.bus, pci_domain_id=0, pci_device_id=0,
                               total_memory=d.total)

    def get_allocator_backend(self) -> str:
        return self.backend

    def get_per_process_memory_fraction(self, i: int) -> float:
        return self.fraction

    def mem_get_info(self, i: int) -> tuple[int, int]:
        self.calls.append(f"mem_get_info({i})")
        if not self.initialized or not self.devices[i].context:
            raise AssertionError("mem_get_info would create a CUDA context")
        return self.device_free(i), self.devices[i].total

    # The driver's view: a context plus whatever the cache holds, like the real thing.
    context_bytes = 500 * MiB

    def link(self, gpus: list[FakeGpu]) -> None:
        """Make NVML's numbers follow this allocator's reserved bytes."""
        self.nvml_gpus = gpus
        self._sync()

    def _sync(self) -> None:
        for i, (d, g) in enumerate(zip(self.devices, self.nvml_gpus, strict=False)):
            # A device gets a context once this process puts something on it.
            d.context = d.context or bool(self.initialized and (d.reserved or d.outside))
            used = (self.context_bytes if d.context else 0) + d.reserved + d.outside
            others = self.others.get(i, [])
            g.used_bytes = used + sum(n for _, n in others)
            g.procs = ([(os.getpid(), used)] if d.context else []) + list(others)

    def device_free(self, i: int) -> int:
        """cudaMemGetInfo's free: what the driver could still hand out on device ``i``."""
        if i < len(self.nvml_gpus):
            g = self.nvml_gpus[i]
            return g.total_bytes - g.reserved_bytes - g.used_bytes
        d = self.devices[i]
        return d.total - d.reserved - d.outside

    def _record(self, i: int, action: str, **fields: Any) -> None:
        """A history entry with the Python stack, innermost frame first, as torch records it
        (the fake's own frames stand for torch's C++ and are left out)."""
        if self.history is None:
            return
        frames = [{"filename": f.filename, "line": f.lineno, "name": f.name}
                  for f in reversed(traceback.extract_stack())
                  if os.path.basename(f.filename) != "fakes.py"]
        entry = {"action": action, "frames": frames, "time_us": time.time() * 1e6,
                 "stream": 0, **fields}
        trace = self.traces[i]
        trace.append(entry)
        del trace[: max(len(trace) - self.history_max, 0)]  # a ring buffer

    def allocate(self, i: int, nbytes: int, addr: int | None = None) -> None:
        d = self.devices[i]
        d.allocated += nbytes
        d.reserved = max(d.reserved, d.allocated + d.inactive_split)
        d.peak_allocated = max(d.peak_allocated, d.allocated)
        d.peak_reserved = max(d.peak_reserved, d.reserved)
        self._record(i, "alloc", addr=addr if addr is not None else -nbytes, size=nbytes)
        self._sync()

    def free(self, i: int, nbytes: int, addr: int | None = None) -> None:
        self.devices[i].allocated -= nbytes
        if addr is not None:
            self._record(i, "free_requested", addr=addr, size=nbytes)
            self._record(i, "free_completed", addr=addr, size=nbytes)
        self._sync()

    def _fit(self, i: int, nbytes: int) -> None:
        """The native allocator's order, simplified: a cached block, then the driver, then the
        driver again after releasing unsplit cached blocks; else an OOM. Split blocks
        (``inactive_split``) can never be used for a larger request."""
        if not self.nvml_gpus:
            return  # no device model to run out of
        d = self.devices[i]
        cached = d.reserved - d.allocated - d.inactive_split
        if nbytes <= cached or nbytes <= self.device_free(i):
            return
        d.retries += 1
        d.reserved -= cached
        self._sync()
        if nbytes <= self.device_free(i):
            return
        self.raise_oom(i, nbytes)

    def raise_oom(self, i: int, nbytes: int) -> None:
        d = self.devices[i]
        free = self.device_free(i)
        if self.backend == "cudaMallocAsync":
            raise OutOfMemoryError(async_oom_message(i, d.allocated, nbytes, d.total, free))
        d.ooms += 1
        self._record(i, "oom", size=nbytes, device_free=free)
        for obs in list(self.observers):
            obs(i, nbytes, int(d.total * self.fraction), free)
        procs = self.nvml_gpus[i].procs if i < len(self.nvml_gpus) else []
        raise OutOfMemoryError(native_oom_message(i, nbytes, d.total, free, d.allocated,
                                                  d.reserved, procs))

    def tensor(self, nbytes: int, device: int = 0, grad_fn: Any = None) -> FakeTensor:
        self._lazy_init()
        self._fit(device, nbytes)
        t = FakeTensor(nbytes, f"cuda:{device}", grad_fn=grad_fn)
        self.allocate(device, nbytes, addr=id(t))
        t._owner = self
        return t

    # Mutations a monitor must never make on its own.
    def empty_cache(self) -> None:
        """As the native allocator's release_cached_blocks: wholly free segments go, holes
        inside the segment that still holds tensors stay (expandable segments unmap them,
        taken here as whole pages)."""
        self.calls.append("empty_cache")
        for d in self.devices:
            if not d.allocated or self.expandable or self.backend == "cudaMallocAsync":
                d.inactive_split, d.free_pieces = 0, []
            d.reserved = d.allocated + d.inactive_split
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
                 owner: Any = None, base: FakeTensor | None = None) -> None:
        self._nbytes = nbytes
        self._owner = owner
        self._base = base  # a view: it shares its base's storage (and keeps it alive)
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
            with contextlib.suppress(Exception):  # interpreter shutdown
                self._owner.free(self.device.index or 0, self._nbytes, addr=id(self))

    def untyped_storage(self) -> Any:
        if self._base is not None:
            return self._base.untyped_storage()
        return SimpleNamespace(nbytes=lambda: self._nbytes, data_ptr=lambda: id(self))

    def view(self) -> FakeTensor:
        """A view: another tensor object over the same storage."""
        return FakeTensor(self._nbytes, f"{self.device.type}:{self.device.index}",
                          base=self._base or self)

    def element_size(self) -> int:
        return 4

    def nelement(self) -> int:
        return self._nbytes // 4


class FakeStorage:
    """Duck-types ``torch._C.StorageBase``: a bare storage object (``t.untyped_storage()``),
    which keeps its memory with no tensor anywhere. Its facts are C descriptors on the real
    base class; here a property and plain methods on the class (what the reader reads). Its
    Python object refers to nothing the collector can see, as a real one does."""

    __slots__ = ("__weakref__", "_device", "_nbytes", "_owner", "_ptr")

    def __init__(self, nbytes: int, device: str = "cuda:0", owner: Any = None,
                 of: FakeTensor | None = None) -> None:
        self._nbytes = nbytes
        # ``of``: the tensor whose storage this is (the same data pointer: FakeTensor's is its id).
        self._ptr = id(of) if of is not None else id(self)
        self._device = SimpleNamespace(type=device.split(":")[0],
                                       index=int(device.split(":")[1]) if ":" in device
                                       else None)
        self._owner = owner
        if owner is not None:
            owner.allocate(self._device.index or 0, nbytes, addr=id(self))

    @property
    def device(self) -> Any:
        return self._device

    def nbytes(self) -> int:
        return self._nbytes

    def data_ptr(self) -> int:
        return self._ptr

    def __del__(self) -> None:
        if self._owner is not None:
            with contextlib.suppress(Exception):  # interpreter shutdown
                self._owner.free(self._device.index or 0, self._nbytes, addr=id(self))


def fake_torch(cuda: FakeCuda | None = None) -> Any:
    cuda = cuda if cuda is not None else FakeCuda()
    mod = SimpleNamespace(
        cuda=cuda,
        version=SimpleNamespace(cuda="13.0"),
        Tensor=FakeTensor,
        OutOfMemoryError=OutOfMemoryError,
        _C=FakeTorchC(cuda),
        __name__="torch",
    )
    return mod


class OutOfMemoryError(RuntimeError):
    """``torch.OutOfMemoryError``: a RuntimeError subclass from the torch package."""


OutOfMemoryError.__module__ = "torch"


# ``torch._C._functions``: torch's generated node classes, each under its own name (the last
# made of a name, as the fakes make one class per set of saved inputs).
NODE_CLASSES = SimpleNamespace()


class FakeTorchC:
    """The two ``torch._C`` calls the OOM explainer and the trace make, and where torch keeps
    its autograd node classes (``_functions``: each ``node_type`` made here)."""

    StorageBase = FakeStorage
    _functions = NODE_CLASSES

    def __init__(self, cuda: FakeCuda) -> None:
        self._cuda = cuda
        self.attach_calls = 0

    def _cuda_attach_out_of_memory_observer(self, fn: Any) -> None:
        self.attach_calls += 1
        if not self._cuda.initialized:
            raise AssertionError("attaching an OOM observer would initialise CUDA")
        if self._cuda.backend == "cudaMallocAsync":
            raise RuntimeError("cudaMallocAsync does not yet support attachOutOfMemoryObserver."
                               " If you need it, please file an issue describing your use case.")
        self._cuda.observers.append(fn)

    def _cuda_getAllocatorBackend(self) -> str:
        """What ``torch.cuda.get_allocator_backend()`` returns: the allocator c10 chose as
        torch's libraries loaded. Reading it starts nothing, as in torch (a pointer load)."""
        return self._cuda.backend

    def _cuda_isHistoryEnabled(self) -> bool:
        return self._cuda.history is not None

    # The hot path's two calls: whether a device has a context, and its stats.
    def _cuda_hasPrimaryContext(self, i: int) -> bool:
        return bool(self._cuda.devices[i].context)

    def _cuda_memoryStats(self, i: int) -> dict[str, Any]:
        return self._cuda.memory.memory_stats_as_nested_dict(i)


def format_size(n: int) -> str:
    """c10's format_size: how every figure in torch's OOM messages is printed."""
    if n <= 1024:
        return f"{n} bytes"
    if n <= 1 << 20:
        return f"{n / 1024:.2f} KiB"
    if n <= 1 << 30:
        return f"{n / (1 << 20):.2f} MiB"
    return f"{n / (1 << 30):.2f} GiB"


def native_oom_message(device: int, requested: int, total: int, free: int, allocated: int,
                       reserved: int, procs: list[tuple[int, int | None]]) -> str:
    """The torch >= 2.2 native allocator's message, built from the same numbers."""
    proc_text = "".join(
        ("Including non-PyTorch memory, this process" if pid == os.getpid()
         else f"Process {pid}") + f" has {format_size(used or 0)} memory in use. "
        for pid, used in procs
    )
    return (
        f"CUDA out of memory. Tried to allocate {format_size(requested)}. GPU {device} has a "
        f"total capacity of {format_size(total)} of which {format_size(free)} is free. "
        f"{proc_text}Of the allocated memory {format_size(allocated)} is allocated by "
        f"PyTorch, and {format_size(reserved - allocated)} is reserved by PyTorch but "
        "unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def async_oom_message(device: int, allocated: int, requested: int, total: int,
                      free: int) -> str:
    """The cudaMallocAsync backend's message (no memory fraction set: the limit is 2**64)."""
    return (
        f"Allocation on device {device} would exceed allowed memory. (out of memory)"
        f"\nCurrently allocated     : {format_size(allocated)}"
        f"\nRequested               : {format_size(requested)}"
        f"\nDevice limit            : {format_size(total)}"
        f"\nFree (according to CUDA): {format_size(free)}"
        "\nPyTorch limit (set by user-supplied memory fraction)"
        "\n                        : 17179869184.00 GiB"
    )


def our_pid() -> int:
    return os.getpid()


# --------------------------------------------------------------------------------------------
# autograd graphs
# --------------------------------------------------------------------------------------------
class FakeSaved:
    """``torch._C._autograd.SavedTensor``: ``data`` is the saved tensor, or with saved-tensor
    hooks whatever the pack hook returned; ``None`` once a backward pass released it. Only
    ``unpack()`` (what reading ``node._saved_x`` does) runs the unpack hook."""

    def __init__(self, tensor: Any, unpack_hook: Any = None, packed: Any = None) -> None:
        self._tensor = tensor
        self.unpack_hook = unpack_hook
        self._packed = packed
        self.unpacks = 0

    @property
    def data(self) -> Any:
        return self._packed if self.unpack_hook is not None else self._tensor

    def unpack(self) -> Any:
        self.unpacks += 1
        return self.unpack_hook(self._packed) if self.unpack_hook else self._tensor

    def release(self) -> None:
        self._tensor = self._packed = None


_NODE_TYPES: dict[tuple[str, tuple[str, ...]], type] = {}


def node_type(kind: str, *saved: str) -> type:
    """An autograd node class, like torch's generated ones: ``next_functions`` and one
    ``_raw_saved_<name>`` per saved input, and no ``__dict__``."""
    key = (kind, saved)
    if key not in _NODE_TYPES:
        slots = ("next_functions", *(f"_raw_saved_{n}" for n in saved))
        if kind == "AccumulateGrad":
            slots += ("variable",)

        def init(obj: Any, *inputs: Any, **values: Any) -> None:
            obj.next_functions = tuple((n, 0) for n in inputs)
            for n in saved:
                v = values[n]
                if isinstance(v, tuple):
                    v = tuple(FakeSaved(x) if isinstance(x, FakeTensor) else x for x in v)
                elif isinstance(v, FakeTensor):
                    v = FakeSaved(v)
                setattr(obj, f"_raw_saved_{n}", v)
            if kind == "AccumulateGrad":
                obj.variable = values.get("variable")

        _NODE_TYPES[key] = type(kind, (), {"__slots__": slots, "__init__": init})
    setattr(NODE_CLASSES, kind, _NODE_TYPES[key])
    return _NODE_TYPES[key]


def node(kind: str, *inputs: Any, **saved: Any) -> Any:
    """``node("MulBackward0", prev, self=a, other=b)``: a node saving ``a`` and ``b``."""
    variable = saved.pop("variable", None) if kind == "AccumulateGrad" else None
    return node_type(kind, *saved)(*inputs, variable=variable, **saved)


class CppHeld:
    """A strong reference from where the garbage collector cannot see, as a tensor's C++
    object holds its Python object under PyObject preservation: ``get()`` returns a new
    reference, as ``AccumulateGrad.variable`` does. ``release()`` gives it back."""

    def __init__(self, obj: Any) -> None:
        self._addr = id(obj)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))

    def get(self) -> Any:
        return ctypes.cast(self._addr, ctypes.py_object).value

    def release(self) -> None:
        ctypes.pythonapi.Py_DecRef(ctypes.py_object(self.get()))


class AccumulateGrad:
    """torch's leaf node as PyTorch 2.11 builds it: ``variable`` is a getter over a
    reference the collector's traversal does not show (C++'s)."""

    __slots__ = ("_cpp", "next_functions")

    def __init__(self, held: CppHeld) -> None:
        self.next_functions = ()
        self._cpp = held

    @property
    def variable(self) -> Any:
        return self._cpp.get()


class DeferredCudaCallError(Exception):
    """``torch.cuda.DeferredCudaCallError``: a call queued on CUDA's start-up raised."""


class TorchLikeCuda(FakeCuda):
    """``FakeCuda`` whose start runs the queue as ``torch.cuda._lazy_init`` does: a queued
    call that raises fails the start with ``DeferredCudaCallError`` and leaves CUDA "not
    initialized"; the queue is never emptied, so the next start runs every call again. (The
    C side is up while the queue runs, so the calls may use it: ``initialized`` is set first.)
    ``starts`` counts the attempts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.starts = 0
        self._initializing = False

    def _lazy_init(self) -> None:
        if self.initialized or self._initializing:
            return
        self.starts += 1
        self.initialized = True
        self._initializing = True
        try:
            for fn in list(self.queued_calls):
                try:
                    fn()
                except Exception as e:
                    self.initialized = False
                    raise DeferredCudaCallError(
                        f"CUDA call failed lazily at initialization with error: {e}") from e
        finally:
            self._initializing = False


# --------------------------------------------------------------------------------------------
# the collector as PyTorch's traversal shows tensors
# --------------------------------------------------------------------------------------------
class TorchTraverseGc:
    """The ``gc`` module as it sees tensors whose ``tp_traverse`` visits nothing.

    PyTorch's ``THPVariable_subclass_traverse`` returns at once for a tensor whose C++ object
    has another owner (``isResurrectable``; PyObject preservation): the collector's
    ``get_referents`` of such a tensor is empty and ``get_referrers`` never names it, although
    its ``__dict__`` still refers to what the user set on it. Our fakes are Python classes, whose
    traversal shows everything: this stands in for torch's, for the tensors ``hides`` says."""

    def __init__(self, hides: Any) -> None:
        import gc as real

        self._gc = real
        self._hides = hides

    def get_referents(self, *objs: Any) -> list[Any]:
        out: list[Any] = []
        for o in objs:
            if not self._hides(o):
                out.extend(self._gc.get_referents(o))
        return out

    def get_referrers(self, *objs: Any) -> list[Any]:
        # The C call never names the tuple of its own arguments; a Python function's ``*objs``
        # is a copy, and the caller's ``f(*frontier)`` tuple lives through the call: neither
        # is a referrer.
        return [r for r in self._gc.get_referrers(*objs)
                if not self._hides(r) and not _same_items(r, objs)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gc, name)


def _same_items(r: Any, objs: tuple[Any, ...]) -> bool:
    return type(r) is tuple and len(r) == len(objs) and all(
        a is b for a, b in zip(r, objs, strict=True))


class CountingLazyCuda(TorchLikeCuda):
    """``TorchLikeCuda`` closer still to torch: ``is_initialized()`` stays False while the
    start-up queue runs (torch sets ``_initialized`` only after it), and ``memory_stats``
    carries the allocator's counters (allocations, frees), as ``torch.cuda.memory_stats``
    does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counts = [[0, 0] for _ in self.devices]  # allocations, frees

    def is_initialized(self) -> bool:
        return self.initialized and not self._initializing

    def allocate(self, i: int, nbytes: int, addr: int | None = None) -> None:
        self.counts[i][0] += 1
        super().allocate(i, nbytes, addr)

    def free(self, i: int, nbytes: int, addr: int | None = None) -> None:
        self.counts[i][1] += 1
        super().free(i, nbytes, addr)

    def memory_stats(self, i: int) -> dict[str, Any]:
        self.calls.append(f"memory_stats({i})")
        if not self.is_initialized():
            return {}
        return {"allocation.all.allocated": self.counts[i][0],
                "allocation.all.freed": self.counts[i][1],
                "segment.all.allocated": 0, "segment.all.freed": 0}


# What an importable fake ``torch`` package (tests/test_record_armed.py writes one) exports:
# set before its import.
NEXT_TORCH: Any = None
