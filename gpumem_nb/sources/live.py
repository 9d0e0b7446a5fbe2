"""The live source: NVML, the PyTorch allocator and host RSS combined into one ``Sample``.

Devices are numbered as CUDA (and torch) number them. Before torch has initialised CUDA the
mapping to NVML comes from ``CUDA_VISIBLE_DEVICES``; afterwards it is rebuilt once from the
UUIDs torch reports, which is exact even with MIG or a reordered device list.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..model import (
    STATUS_NO_NVML,
    STATUS_OK,
    ChildProcess,
    DeviceSample,
    NvmlReading,
    Sample,
    SourceStatus,
)
from .devices import DeviceId, match_by_identity, torch_only_device
from .host import HostSource
from .nvml import NvmlSource
from .processes import ProcessTree, split_children
from .torch.source import TorchSource
from .torch.stats import ZERO_READING

__all__ = ["STARTING", "LiveSource"]

STARTING = "NVML has not answered its start yet"


class LiveSource:
    def __init__(
        self,
        nvml: NvmlSource | None = None,
        torch: TorchSource | None = None,
        host: HostSource | None = None,
        clock: Callable[[], float] = time.monotonic,
        processes: ProcessTree | None = None,
    ) -> None:
        self.nvml = nvml if nvml is not None else NvmlSource()
        self.torch = torch if torch is not None else TorchSource()
        self.host = host if host is not None else HostSource()
        self.processes = processes if processes is not None else ProcessTree()
        # Per NVML device: this kernel's children in the last listing, their bytes, and the
        # other processes' bytes without them (reused by readings that list nothing).
        self._children: dict[int, tuple[tuple[ChildProcess, ...], int | None, int | None]] = {}
        self._clock = clock
        self._lock = threading.Lock()
        self._mapping: list[DeviceId] = []
        self._mapped_with_torch = False
        self._started = False
        # A start is under way on another thread (``Monitor`` starts NVML off the main
        # thread: a wedged driver's nvmlInit may never return): readings and status then
        # wait for nothing, their NVML figures unknown until it ends.
        self._start_pending = False
        # Closed (the extension unloaded): a reading still asked of it (a %%gpumem cell that
        # ran %unload_ext takes its closing reading after the unload) must not start NVML
        # again, or that nvmlInit is never balanced.
        self._closed = False
        self.selected: Sequence[int] | None = None  # None: every visible device
        # Processes are listed on every sampler tick: the hooks no longer read NVML, so the
        # listing (about 145 µs per GPU) is off the cell's path, and this process's share is
        # always the listed figure, never one derived between listings.
        self.process_refresh_s = 0.0
        self._listed_at_s = float("-inf")
        # Per CUDA device: the least NVML has listed for this process while PyTorch's cache
        # held nothing there. That is the CUDA context (518-610 MiB on the H200), with
        # whatever another library held at that moment; the explanations quote it as measured.
        self.idle_process_bytes: dict[int, int] = {}

    def begin_start(self) -> None:
        """Say that ``start()`` is about to run on another thread: until it returns, no
        reading or status call starts NVML itself (on the caller's thread, where it could
        hang)."""
        self._start_pending = True

    @property
    def starting(self) -> bool:
        return self._start_pending and not self._started

    def start(self) -> bool:
        self._closed = False
        self._start_pending = True
        try:
            ok = self.nvml.start()
            with self._lock:
                self._mapping = self.nvml.cuda_order() if ok else []
                self._mapped_with_torch = False
                self._started = True
        finally:
            self._start_pending = False
        return ok

    def close(self) -> None:
        self._closed = True
        self._start_pending = False
        self.nvml.close()
        # Its /proc/self/statm descriptor: closed now, not whenever the collector gets to it
        # (a reload's old source may live on in a reference cycle; 20 reloads were 20 fds).
        self.host.close()
        self._started = False
        with self._lock:
            self._mapping = []

    def _refresh_mapping(self) -> None:
        """Once CUDA is up, map by UUID/bus id; torch's numbering is then authoritative."""
        count = self.torch.device_count()
        mapped: list[DeviceId] = []
        if self.nvml.status != STATUS_OK:
            # No NVML (ROCm, a container without libnvidia-ml, a driver too old): torch's
            # devices, with their allocator columns and NVML's unknown. Asked only once
            # torch is up, so counting them initialises nothing.
            mapped = [torch_only_device(i, *self.torch.identity(i)) for i in range(count)]
            with self._lock:
                self._mapping = mapped
                self._mapped_with_torch = True
            return
        for i in range(count):
            uuid, bus = self.torch.identity(i)
            found = match_by_identity(uuid, bus, self.nvml.devices)
            if found is None:
                found = self._mapping[i] if i < len(self._mapping) else None
            if found is None:
                break
            mapped.append(found)
        with self._lock:
            if mapped:
                self._mapping = mapped
            self._mapped_with_torch = True

    def device_ids(self) -> list[DeviceId]:
        """NVML identities of CUDA devices 0, 1, ..."""
        return list(self._mapping)

    def indices(self) -> list[int]:
        n = len(self._mapping)
        if self.selected is None:
            return list(range(n))
        return [i for i in self.selected if 0 <= i < n]

    def read(self, *, processes: bool | None = None) -> Sample:
        """One sample.

        ``processes``: True lists NVML's processes (about 145 µs per GPU on an H200), False
        never does (the cell hooks), None (the sampler) does so at most every
        ``process_refresh_s``; between listings this process's share is derived from the
        last one (see ``NvmlSource.read``).
        """
        if not self._started and not self._start_pending and not self._closed:
            self.start()
        now = self._clock()
        if processes is None:
            processes = now - self._listed_at_s >= self.process_refresh_s
        if processes:
            self._listed_at_s = now
        torch_up = self.torch.initialized
        if torch_up and not self._mapped_with_torch and self._started \
                and (self._mapping or self.nvml.status != STATUS_OK):
            self._refresh_mapping()
        mapping = self._mapping
        devices = []
        for i in self.indices():
            allocator = self.torch.read(i) if torch_up else None
            # Reserved memory proves a context on this device; its absence from NVML's list
            # would then mean NVML cannot see us, not that we use nothing.
            has_context = allocator is not None and allocator.reserved_bytes > 0
            if mapping[i].torch_only:
                devices.append(DeviceSample(index=i, nvml=self._no_nvml(mapping[i]),
                                            allocator=allocator))
                continue
            nv = self.nvml.read(mapping[i], context_expected=has_context, processes=processes)
            if processes and allocator is not None and not allocator.reserved_bytes:
                self._note_idle(i, nv.process_bytes)
            devices.append(DeviceSample(index=i, nvml=self._with_children(mapping[i], nv,
                                                                           processes),
                                        allocator=allocator))
        return Sample(
            t_s=now,
            wall_s=time.time(),
            rss_bytes=self.host.rss_bytes(),
            devices=tuple(devices),
        )

    def _no_nvml(self, dev: DeviceId) -> NvmlReading:
        """NVML's columns for a device NVML cannot read: unknown, and why."""
        return NvmlReading(nvml_index=dev.nvml_index, name="", uuid=dev.uuid,
                           pci_bus_id=dev.pci_bus_id, total_bytes=None, used_bytes=None,
                           status=STATUS_NO_NVML, detail=self.nvml.status)

    def _note_idle(self, index: int, process_bytes: int | None) -> None:
        if process_bytes:
            known = self.idle_process_bytes.get(index)
            self.idle_process_bytes[index] = min(known or process_bytes, process_bytes)

    def _with_children(self, dev: DeviceId, nv: NvmlReading, listed: bool) -> NvmlReading:
        """``nv`` with this kernel's descendants split out of "other processes". Only after a
        listing (the sampler's pace) is the process tree read; other readings reuse the last
        split."""
        if listed:
            if nv.process_bytes is None:  # no listing, or PIDs of another namespace
                self._children.pop(dev.nvml_index, None)
            else:
                others = self.nvml.others_listing(dev)
                self._children[dev.nvml_index] = split_children(
                    self.processes, others) if others else ((), 0, nv.other_processes_bytes)
        split = self._children.get(dev.nvml_index)
        if split is None or nv.process_bytes is None:
            return nv
        children, children_bytes, rest_bytes = split
        return replace(nv, children=children, children_bytes=children_bytes,
                       other_processes_bytes=rest_bytes)

    def read_hot(self, nvml_from: Sample | None) -> Sample:
        """The cell hooks' reading: exact allocator stats and RSS, no NVML call.

        NVML can be slow when idle (115–158 µs for a first query on an H200) and can hang, so
        the hooks take its figures from ``nvml_from``, the sampler's latest reading; the
        record then says how old they are.
        """
        now = self._clock()
        indices = self.indices()
        allocators = self.torch.read_active(indices)  # {} before CUDA is up
        used = [i for i in indices if allocators.get(i) is not ZERO_READING]
        if allocators and used:
            # Only devices this process has a context on: the cost stays flat in the GPUs
            # it does not use (their rows would be all zeros anyway).
            indices = used
        devices = []
        for i in indices:
            nv = None
            if nvml_from is not None:
                d = nvml_from.device(i)
                nv = d.nvml if d is not None else None
            devices.append(DeviceSample(index=i, nvml=nv, allocator=allocators.get(i)))
        return Sample(t_s=now, wall_s=time.time(), rss_bytes=self.host.rss_bytes(),
                      devices=tuple(devices), nvml_t_s=nvml_from.t_s if nvml_from else None)

    def status(self) -> SourceStatus:
        if self.starting:
            return SourceStatus(nvml=STARTING, torch=self.torch.state(), gpu_count=0,
                                allocator=self.torch.allocator_info())
        if not self._started and not self._closed:
            self.start()
        if self.torch.initialized and not self._mapped_with_torch \
                and self.nvml.status != STATUS_OK:
            self._refresh_mapping()  # torch's devices stand in for NVML's
        notes: list[str] = []
        if self.nvml.status == STATUS_OK and not self._mapping:
            notes.append("CUDA_VISIBLE_DEVICES hides every GPU from this process")
        if any(d.torch_only for d in self._mapping):
            notes.append(f"NVML is unavailable ({self.nvml.status}): the GPUs are those "
                         "torch's CUDA reports, with PyTorch's allocator figures; NVML's "
                         "columns (device used, this process, outside PyTorch, other "
                         "processes) are unknown")
        return SourceStatus(
            nvml=self.nvml.status,
            torch=self.torch.state(),
            gpu_count=len(self._mapping),
            allocator=self.torch.allocator_info(),
            notes=tuple(notes),
        )
