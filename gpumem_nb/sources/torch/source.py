"""``TorchSource``: the allocator's readings, behind the guard that never starts CUDA; and
``CudaStartHook``, what torch's start-up queue holds for us.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

from ...model import AllocatorInfo, AllocatorReading
from .stats import ZERO_READING, _unflatten, alloc_conf, parse_stats

__all__ = [
    "INIT_HOOK_ATTR",
    "TORCH_INITIALIZED",
    "TORCH_NOT_IMPORTED",
    "TORCH_NOT_INITIALIZED",
    "TORCH_NO_CUDA",
    "CudaStartHook",
    "TorchSource",
]

INIT_HOOK_ATTR = "_gpumem_nb_init_hook"

TORCH_NOT_IMPORTED = "torch is not imported"
TORCH_NOT_INITIALIZED = "torch is imported; CUDA not initialized yet"
TORCH_NO_CUDA = "torch has no CUDA support in this build"
TORCH_INITIALIZED = "CUDA initialized"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


class CudaStartHook:
    """What torch's start-up queue holds (``TorchSource.on_cuda_init``): forwards to
    whichever load of gpumem_nb set ``handler`` last, with the frame that called it (the
    stack that started CUDA). Kept trivial (an old copy of this class must keep working after
    a reload) and never raising: an exception here would become torch's
    ``DeferredCudaCallError`` and fail the user's CUDA start. Each use queues a subclass of
    its own, so that a queue can be read for who queued what."""

    def __init__(self) -> None:
        self.handler: Any = None
        self.registering = False

    def __call__(self) -> None:
        handler = self.handler
        if handler is None or self.registering:
            return
        with contextlib.suppress(BaseException):
            handler(sys._getframe(1))


class TorchSource:
    """Allocator reads guarded so that observing never changes the user's process.

    ``modules`` is injectable so tests can put a fake ``torch`` in place of ``sys.modules``.
    """

    def __init__(self, modules: Mapping[str, ModuleType] | None = None) -> None:
        self._modules = sys.modules if modules is None else modules
        self._identity: dict[int, tuple[str | None, str | None]] = {}
        self._with_context: set[int] = set()
        self.last_error = ""
        self._starting = threading.local()

    @contextlib.contextmanager
    def while_cuda_starts(self) -> Iterator[None]:
        """For a call queued on CUDA's start-up (``on_cuda_init``), on its thread: torch's
        ``is_initialized()`` is still False while ``_lazy_init`` runs its queue, though the
        allocator is up; here ``torch.cuda`` is used as if CUDA were up."""
        self._starting.on = True
        try:
            yield
        finally:
            self._starting.on = False

    def _cuda(self) -> Any | None:
        """``torch.cuda`` when torch is imported and CUDA is up, else None. Never raises."""
        torch = self._modules.get("torch")
        if torch is None:
            return None
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and getattr(self._starting, "on", False):
            return cuda
        try:
            if cuda is None or not cuda.is_initialized():
                return None
        except Exception:
            return None
        return cuda

    @property
    def initialized(self) -> bool:
        return self._cuda() is not None

    @property
    def modules(self) -> Mapping[str, Any]:
        """Where torch is looked up: ``sys.modules`` itself, unless a test gave another."""
        return self._modules

    def state(self) -> str:
        torch = self._modules.get("torch")
        if torch is None:
            return TORCH_NOT_IMPORTED
        if self._cuda() is not None:
            return TORCH_INITIALIZED
        # `torch.version.cuda` is a plain attribute: reading it initialises nothing.
        version = getattr(torch, "version", None)
        if version is not None and getattr(version, "cuda", "present") is None:
            return TORCH_NO_CUDA
        return TORCH_NOT_INITIALIZED

    def device_count(self) -> int:
        cuda = self._cuda()
        if cuda is None:
            return 0
        try:
            return int(cuda.device_count())
        except Exception:
            return 0

    def read(self, index: int) -> AllocatorReading | None:
        """One stats read for device ``index``; None before CUDA is initialised."""
        cuda = self._cuda()
        if cuda is None:
            return None
        nested = getattr(getattr(cuda, "memory", None), "memory_stats_as_nested_dict", None)
        try:
            stats = nested(index) if nested is not None else _unflatten(cuda.memory_stats(index))
        except Exception as e:  # a lost device or a bad index must not take NVML down too
            self.last_error = f"{type(e).__name__}: {e}"
            return None
        if not stats:
            return None
        return parse_stats(stats)

    def read_active(self, indices: list[int]) -> dict[int, AllocatorReading | None]:
        """The cell hooks' read: exact stats for each device this process has a context on.

        A device without a primary context has never allocated, so its reading is all zeros
        and needs no stats call: the cost stays flat in the number of GPUs this process does
        not use. Once a context is seen it is remembered (PyTorch never releases one).
        """
        cuda = self._cuda()
        if cuda is None:
            return {}
        torch_c = getattr(self._modules.get("torch"), "_C", None)
        stats_fn = getattr(torch_c, "_cuda_memoryStats", None)
        has_ctx = getattr(torch_c, "_cuda_hasPrimaryContext", None)
        out: dict[int, AllocatorReading | None] = {}
        for i in indices:
            if i not in self._with_context and has_ctx is not None:
                try:
                    if not has_ctx(i):
                        out[i] = ZERO_READING  # never allocated on: nothing to read
                        continue
                except Exception:
                    pass
                self._with_context.add(i)
            if stats_fn is None:
                out[i] = self.read(i)
                continue
            try:
                stats = stats_fn(i)
            except Exception as e:
                self.last_error = f"{type(e).__name__}: {e}"
                out[i] = None
                continue
            out[i] = parse_stats(stats) if stats else None
        return out

    def identity(self, index: int) -> tuple[str | None, str | None]:
        """(uuid, pci bus id) of CUDA device ``index``, cached; (None, None) before init.

        ``get_device_properties`` would initialise CUDA, so it is only called once CUDA is
        already up, when it merely queries the driver.
        """
        if index in self._identity:
            return self._identity[index]
        cuda = self._cuda()
        if cuda is None:
            return None, None
        try:
            props = cuda.get_device_properties(index)
        except Exception:
            return None, None
        uuid = getattr(props, "uuid", None)
        bus: str | None = None
        if hasattr(props, "pci_bus_id"):
            bus = "{:04x}:{:02x}:{:02x}.0".format(
                int(getattr(props, "pci_domain_id", 0)),
                int(props.pci_bus_id),
                int(getattr(props, "pci_device_id", 0)),
            )
        result = (str(uuid) if uuid is not None else None, bus)
        self._identity[index] = result
        return result

    # The only two calls that change the allocator. Callers reach them only on the user's
    # request (%gpumem cleanup, --peak reset); both are no-ops before CUDA is up, because
    # reset_peak_memory_stats would initialise it.
    def empty_cache(self) -> bool:
        cuda = self._cuda()
        if cuda is None:
            return False
        cuda.empty_cache()
        return True

    def reset_peaks(self, device: int | None) -> bool:
        """Reset peak counters on ``device`` (every device when None)."""
        cuda = self._cuda()
        if cuda is None:
            return False
        for i in range(cuda.device_count()):
            if device is None or device == i:
                cuda.reset_peak_memory_stats(i)
        return True

    def memory_summary(self, index: int) -> str:
        """``torch.cuda.memory_summary``, which would initialise CUDA: only once it is up."""
        cuda = self._cuda()
        if cuda is None:
            return ""
        try:
            return str(cuda.memory_summary(index))
        except Exception as e:
            return f"memory_summary failed: {e}"

    def import_torch(self) -> str:
        """Import torch, only when the user asked for it (``%gpumem record on --start-cuda``):
        "" once imported, else why not."""
        if self._modules.get("torch") is not None:
            return ""
        try:
            importlib.import_module("torch")
        except BaseException as e:  # a broken install: said, never raised into the cell
            return f"torch could not be imported ({type(e).__name__}: {_first_line(e)})"
        return "" if self._modules.get("torch") is not None else TORCH_NOT_IMPORTED

    def on_cuda_init(self, factory: Callable[[], Any], attr: str = "") -> tuple[Any | None, str]:
        """The process's one CUDA start-up hook: ``factory()``'s object, queued through
        ``torch.cuda._lazy_call`` so that torch calls it while it initialises CUDA, on the
        thread and inside the stack that caused it. ``(None, why not)`` when torch is not
        imported, CUDA is already up, or the build has no such queue.

        Queueing initialises nothing and imports nothing; the queue cannot be emptied, so
        the object is kept on ``torch.cuda`` (as ``attr``, one per use) and a reloaded
        gpumem_nb finds it there (only its ``handler`` changes). While queueing,
        ``registering`` is set: a CUDA start that races this call makes ``_lazy_call`` run
        it at once, here, where its stack means nothing.
        """
        torch = self._modules.get("torch")
        cuda = getattr(torch, "cuda", None) if torch is not None else None
        if cuda is None:
            return None, TORCH_NOT_IMPORTED
        attr = attr or INIT_HOOK_ATTR
        existing = getattr(cuda, attr, None)
        if existing is not None:
            return existing, ""
        try:
            if cuda.is_initialized():
                return None, TORCH_INITIALIZED
        except Exception as e:
            return None, _first_line(e)
        lazy = getattr(cuda, "_lazy_call", None)
        if lazy is None:
            return None, "this torch build has no lazy-init queue"
        hook = factory()
        hook.registering = True
        try:
            lazy(hook)
        except Exception as e:
            return None, _first_line(e)
        finally:
            hook.registering = False
        setattr(cuda, attr, hook)
        return hook, ""

    def allocator_info(self) -> AllocatorInfo | None:
        cuda = self._cuda()
        conf, var = alloc_conf()
        if cuda is None:
            return None
        try:
            backend = str(cuda.get_allocator_backend())
        except Exception:
            backend = "unknown"
        return AllocatorInfo(backend=backend, conf=conf, conf_var=var)
