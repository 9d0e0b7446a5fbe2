"""Typed records shared by every layer.

Memory is always an ``int`` number of bytes, times are ``float`` seconds. ``None`` means
"not known" (a field NVML does not support, a process NVML cannot see), never zero: a zero
would be a claim, and the product promises to be honest about what it cannot see.

This module depends on nothing but the standard library, so every other module can use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Status words a device reading can carry. Plain strings keep the records JSON-friendly.
STATUS_OK = "ok"
STATUS_LOST = "lost"
STATUS_ERROR = "error"


@dataclass(frozen=True)
class NvmlReading:
    """One device as NVML sees it, at one instant."""

    nvml_index: int
    name: str
    uuid: str
    pci_bus_id: str
    total_bytes: int | None
    used_bytes: int | None
    # Memory the driver keeps for itself; only the v2 memory call reports it separately.
    driver_reserved_bytes: int | None = None
    # This process's usage: None when NVML cannot attribute it (PID not visible).
    process_bytes: int | None = None
    # Sum of the other processes NVML lists, None when unknown.
    other_processes_bytes: int | None = None
    status: str = STATUS_OK
    detail: str = ""


@dataclass(frozen=True)
class AllocatorReading:
    """PyTorch's caching allocator for one device, from a single stats read."""

    allocated_bytes: int
    reserved_bytes: int
    active_bytes: int
    inactive_split_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    num_alloc_retries: int
    num_ooms: int


@dataclass(frozen=True)
class DeviceSample:
    """Everything known about one CUDA device (numbered as torch numbers it) at one instant."""

    index: int
    nvml: NvmlReading | None
    allocator: AllocatorReading | None

    @property
    def outside_pytorch_bytes(self) -> int | None:
        """This process's device memory that PyTorch's cache does not account for.

        The CUDA context, cuBLAS/cuDNN workspaces and other allocators (CuPy, JAX, NCCL) live
        here. Known only when NVML attributes memory to this process.
        """
        if self.nvml is None or self.nvml.process_bytes is None:
            return None
        reserved = self.allocator.reserved_bytes if self.allocator else 0
        return max(self.nvml.process_bytes - reserved, 0)


@dataclass(frozen=True)
class Sample:
    """One reading of every source."""

    t_s: float  # monotonic clock, for arithmetic
    wall_s: float  # wall clock, for display only
    rss_bytes: int | None
    devices: tuple[DeviceSample, ...] = ()

    def device(self, index: int) -> DeviceSample | None:
        for d in self.devices:
            if d.index == index:
                return d
        return None


@dataclass(frozen=True)
class AllocatorInfo:
    """How the allocator is configured; read once torch has initialized CUDA."""

    backend: str  # "native" or "cudaMallocAsync"
    conf: str  # the effective PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF, "" when unset
    conf_var: str  # which environment variable held it


@dataclass(frozen=True)
class SourceStatus:
    """One plain line per source, for status displays."""

    nvml: str
    torch: str
    gpu_count: int
    allocator: AllocatorInfo | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def has_gpu(self) -> bool:
        return self.gpu_count > 0
