"""NVML: what the driver says about device memory. The only module that imports ``pynvml``.

Failures come in three tiers, as in nvitop's ``libnvml`` and gpustat's ``safenvml``:

1. library or driver missing (Binder, CI, a laptop): one clear status line, no devices;
2. a field the device does not support: that field is ``None``;
3. a device that is lost (``GPU_IS_LOST``) or fails a call: a placeholder reading for it while
   the other devices keep reporting.

``pynvml`` is imported lazily and ``nvmlInit`` runs once under a lock, so importing this module
costs nothing and never touches the driver. NVML never creates a CUDA context.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypedDict

from ..model import STATUS_ERROR, STATUS_LOST, STATUS_OK, NvmlReading
from .devices import DeviceId, visible_devices

__all__ = ["CLOSE_WAIT_S", "NvmlSource"]

# How long close() waits for a start in progress (a healthy one takes milliseconds).
CLOSE_WAIT_S = 0.2


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)



class _Identity(TypedDict):
    """What every reading of a device says of which device it is."""

    nvml_index: int
    name: str
    uuid: str
    pci_bus_id: str


class NvmlSource:
    """Safe, lazily initialised NVML reads.

    ``module`` injects a fake ``pynvml`` for tests; by default the real one is imported on
    first use.
    """

    def __init__(self, module: ModuleType | None = None) -> None:
        self._mod: Any = module
        self._lock = threading.Lock()
        self._inited = False
        # nvmlInit returned: one nvmlShutdown is owed, whatever the status says later (a
        # device count that fails turns the status into that error, and close() used to
        # skip the shutdown then: one nvmlInit more per load or reload).
        self._init_done = False
        self._status = "not started"
        self._devices: list[DeviceId] = []
        self._names: dict[int, str] = {}
        self._handles: dict[int, object] = {}  # NVML's opaque device handles
        self._v2_memory = True
        self._v3_procs = True
        # close() asked while start() was inside the driver: start() balances its own
        # nvmlInit when (if ever) the driver answers, so an unload never waits on a hang.
        self._close_requested = False
        self._pid = os.getpid()
        # Per device: did the last process listing attribute memory to us, and what did the
        # other processes use then.
        self._last_others: dict[int, tuple[bool, int | None]] = {}
        # Per device: the other processes of the last listing, as (pid, bytes), when their
        # PIDs are known to be of this PID namespace (for naming this kernel's children).
        self._last_listing: dict[int, tuple[tuple[int, int | None], ...]] = {}

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> bool:
        """Initialise NVML once; True when devices can be read."""
        with self._lock:
            if self._inited:
                return bool(self._devices) or self._status == STATUS_OK
            self._inited = True
            try:
                if self._mod is None:
                    import pynvml

                    self._mod = pynvml
            except ImportError:
                self._status = "nvidia-ml-py is not installed"
                return False
            try:
                self._mod.nvmlInit()
            except Exception as e:  # any failure here means "no NVML", never a crash
                self._status = self._describe_init_error(e)
                return False
            self._init_done = True
            self._status = STATUS_OK
            self._devices = self._enumerate()
            if self._close_requested:  # unloaded while the driver kept us waiting
                self._close_locked()
                return False
            return True

    def close(self) -> None:
        """Balance our ``nvmlInit``; NVML reference-counts init and shutdown.

        Never waits on a start that hangs in the driver: that start closes itself on return.
        """
        self._close_requested = True
        if not self._lock.acquire(timeout=CLOSE_WAIT_S):
            return
        try:
            self._close_locked()
        finally:
            self._lock.release()

    def _close_locked(self) -> None:
        if self._init_done:
            with contextlib.suppress(Exception):
                self._mod.nvmlShutdown()
        self._init_done = False
        self._inited = False
        self._close_requested = False
        self._status = "stopped"
        self._handles.clear()
        self._devices = []

    @property
    def status(self) -> str:
        return self._status

    @property
    def devices(self) -> list[DeviceId]:
        """Physical GPUs in NVML order, then MIG instances."""
        return list(self._devices)

    def name(self, nvml_index: int) -> str:
        return self._names.get(nvml_index, "")

    def _describe_init_error(self, e: Exception) -> str:
        m = self._mod
        code = getattr(e, "value", None)
        if code == getattr(m, "NVML_ERROR_LIBRARY_NOT_FOUND", object()):
            return "no NVIDIA driver on this machine (libnvidia-ml not found)"
        if code == getattr(m, "NVML_ERROR_DRIVER_NOT_LOADED", object()):
            return "the NVIDIA driver is not loaded"
        if code == getattr(m, "NVML_ERROR_NO_PERMISSION", object()):
            return "no permission to query the NVIDIA driver"
        if code == getattr(m, "NVML_ERROR_FUNCTION_NOT_FOUND", object()):
            return ("the NVIDIA driver is too old for nvidia-ml-py (libnvidia-ml lacks its "
                    "init call)")
        return f"NVML failed to start: {e}"

    def _is(self, e: BaseException, name: str) -> bool:
        return getattr(e, "value", None) == getattr(self._mod, name, object())

    # -- enumeration -------------------------------------------------------------------------
    def _enumerate(self) -> list[DeviceId]:
        m = self._mod
        out: list[DeviceId] = []
        migs: list[DeviceId] = []
        try:
            count = int(m.nvmlDeviceGetCount())
        except Exception as e:
            self._status = f"NVML could not count devices: {e}"
            return []
        for i in range(count):
            try:
                h = m.nvmlDeviceGetHandleByIndex(i)
            except Exception:
                # A lost device still occupies its index, so the others keep theirs.
                out.append(DeviceId(nvml_index=i, uuid=f"GPU-unavailable-{i}"))
                continue
            self._handles[i] = h
            uuid = self._safe(m.nvmlDeviceGetUUID, h, f"GPU-unknown-{i}")
            bus = self._safe(lambda handle: m.nvmlDeviceGetPciInfo(handle).busId, h, "")
            self._names[i] = self._safe(m.nvmlDeviceGetName, h, "")
            out.append(DeviceId(nvml_index=i, uuid=uuid, pci_bus_id=bus))
            migs.extend(self._enumerate_mig(i, h, bus))
        return out + migs

    def _enumerate_mig(self, parent: int, h: object, bus: str) -> list[DeviceId]:
        m = self._mod
        if not hasattr(m, "nvmlDeviceGetMaxMigDeviceCount"):
            return []
        try:
            current, _pending = m.nvmlDeviceGetMigMode(h)
            if not current:
                return []
            n = int(m.nvmlDeviceGetMaxMigDeviceCount(h))
        except Exception:
            return []
        out: list[DeviceId] = []
        for j in range(n):
            try:
                mh = m.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                uuid = _text(m.nvmlDeviceGetUUID(mh))
            except Exception:
                continue  # empty MIG slot
            # MIG instances get synthetic indices above the physical range.
            idx = 1000 * (parent + 1) + j
            self._handles[idx] = mh
            self._names[idx] = f"{self._names.get(parent, '')} MIG {j}".strip()
            out.append(DeviceId(nvml_index=idx, uuid=uuid, pci_bus_id=bus, is_mig=True))
        return out

    def _safe(self, fn: Callable[[object], object], handle: object, default: str) -> str:
        """A device's text property; its default when the driver does not support it."""
        try:
            return _text(fn(handle))
        except Exception:
            return default

    def cuda_order(self, env: dict[str, str] | None = None) -> list[DeviceId]:
        """The NVML devices in the order CUDA will number them, before torch can tell us.

        With ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` this is exact. CUDA's default, FASTEST_FIRST,
        only differs from PCI order on machines with mixed GPU models; there we order by
        compute capability, and ``torch.py`` corrects the mapping by UUID once CUDA is up.
        """
        env = dict(os.environ) if env is None else env
        devices = self.devices
        if env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") != "PCI_BUS_ID":
            physical = [d for d in devices if not d.is_mig]
            if len({self._names.get(d.nvml_index, "") for d in physical}) > 1:
                physical.sort(key=self._capability_key)
                devices = physical + [d for d in devices if d.is_mig]
        return visible_devices(env.get("CUDA_VISIBLE_DEVICES"), devices)

    def _capability_key(self, d: DeviceId) -> tuple[int, int]:
        h = self._handles.get(d.nvml_index)
        try:
            major, minor = self._mod.nvmlDeviceGetCudaComputeCapability(h)
            return (-int(major), -int(minor))
        except Exception:
            return (0, 0)

    # -- reading -----------------------------------------------------------------------------
    def read(
        self, dev: DeviceId, *, context_expected: bool = False, processes: bool = True
    ) -> NvmlReading:
        """One device's memory and process usage. Never raises.

        ``context_expected`` says this process is known to hold a CUDA context on some device,
        so an absent PID means "NVML cannot see us", not "we use nothing".

        ``processes=False`` is the hot path (cell hooks): listing processes costs about
        145 µs on an H200, ten times the memory call. Device "used" is the sum of every
        process's usage (checked on the H200), so this process's share is derived as used
        minus the other processes' usage from the last full listing, which the sampler
        refreshes every tick. It is None unless that listing showed our PID.
        """
        name = self._names.get(dev.nvml_index, "")
        base: _Identity = {
            "nvml_index": dev.nvml_index,
            "name": name,
            "uuid": dev.uuid,
            "pci_bus_id": dev.pci_bus_id,
        }
        h = self._handles.get(dev.nvml_index)
        if h is None:
            return NvmlReading(**base, total_bytes=None, used_bytes=None,
                               status=STATUS_LOST, detail="no handle for this device")
        try:
            total, used, driver_reserved = self._memory(h)
        except Exception as e:
            lost = self._is(e, "NVML_ERROR_GPU_IS_LOST")
            return NvmlReading(**base, total_bytes=None, used_bytes=None,
                               status=STATUS_LOST if lost else STATUS_ERROR, detail=str(e))
        if processes:
            ours, others, rest = self._processes(h, context_expected)
            self._last_others[dev.nvml_index] = (ours is not None, others)
            self._last_listing[dev.nvml_index] = rest if ours is not None else ()
        else:
            seen, others = self._last_others.get(dev.nvml_index, (False, None))
            ours = max(used - others, 0) if seen and used is not None and others is not None \
                else None
        return NvmlReading(**base, total_bytes=total, used_bytes=used,
                           driver_reserved_bytes=driver_reserved, process_bytes=ours,
                           other_processes_bytes=others)

    def _memory(self, h: object) -> tuple[int | None, int | None, int | None]:
        m = self._mod
        if self._v2_memory:
            try:
                mem = m.nvmlDeviceGetMemoryInfo(h, version=m.nvmlMemory_v2)
                return int(mem.total), int(mem.used), int(mem.reserved)
            except (AttributeError, TypeError):
                self._v2_memory = False  # an nvidia-ml-py without the v2 struct
            except Exception as e:
                if not (self._is(e, "NVML_ERROR_FUNCTION_NOT_FOUND")
                        or self._is(e, "NVML_ERROR_NOT_SUPPORTED")
                        or self._is(e, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH")):
                    raise
                self._v2_memory = False  # an old driver: v1 from now on
        mem = m.nvmlDeviceGetMemoryInfo(h)
        # v1 counts the driver's own reservation as used; there is no way to split it out.
        return int(mem.total), int(mem.used), None

    def _list_processes(self, h: object) -> Sequence[Any] | None:
        m = self._mod
        if self._v3_procs:
            # Call v3 by name: the unversioned wrapper turns "not found" into a generic
            # NVMLLibraryMismatchError that carries no error code.
            fn3 = getattr(m, "nvmlDeviceGetComputeRunningProcesses_v3", None)
            try:
                if fn3 is None:
                    raise AttributeError("no v3 process call")
                return list(fn3(h))
            except Exception as e:
                if not (isinstance(e, AttributeError)
                        or self._is(e, "NVML_ERROR_FUNCTION_NOT_FOUND")
                        or self._is(e, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH")):
                    return None
                self._v3_procs = False
        fn = getattr(m, "nvmlDeviceGetComputeRunningProcesses_v2", None)
        if fn is None:
            return None
        try:
            return list(fn(h))
        except Exception:
            return None

    def _processes(self, h: object, context_expected: bool,
                   ) -> tuple[int | None, int | None, tuple[tuple[int, int | None], ...]]:
        """(this process's bytes, the others' sum, the others as (pid, bytes))."""
        procs = self._list_processes(h)
        if procs is None:
            return None, None, ()
        ours = [p for p in procs if p.pid == self._pid]
        rest = [p for p in procs if p.pid != self._pid]
        listing = tuple((int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
                        for p in rest)
        others: int | None = None
        if all(p.usedGpuMemory is not None for p in rest):
            others = sum(int(p.usedGpuMemory) for p in rest)
        if ours:
            used = [p.usedGpuMemory for p in ours]
            return (None if None in used else sum(int(u) for u in used)), others, listing
        # Our PID is absent. That means "no context here" only if NVML shows PIDs from our
        # own namespace and nothing in this process is known to hold a context; in a
        # container NVML reports host PIDs and we cannot tell which one is us.
        if context_expected or any(not os.path.exists(f"/proc/{p.pid}") for p in rest):
            return None, None, ()
        return 0, others, listing

    def others_listing(self, dev: DeviceId) -> tuple[tuple[int, int | None], ...]:
        """The other processes of ``dev``'s last listing, as (pid, bytes): () when there were
        none, or when their PIDs may be another namespace's (a container)."""
        return self._last_listing.get(dev.nvml_index, ())

    def processes(self, dev: DeviceId) -> list[tuple[int, int | None]] | None:
        """Every compute process NVML lists on ``dev`` as (pid, bytes or None), for the OOM
        explainer, which names each one; None when NVML cannot list them. On demand only:
        one listing costs about 145 µs."""
        h = self._handles.get(dev.nvml_index)
        if h is None:
            return None
        procs = self._list_processes(h)
        if procs is None:
            return None
        return [(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
                for p in procs]
