"""PyTorch's caching allocator, read without changing anything.

This module never imports torch (but for ``import_torch``, which the user asks for by name)
and never initialises CUDA: it looks torch up in
``sys.modules`` and reads only once ``torch.cuda.is_initialized()`` is true, the same guard
PyTorch's own ``torch/cuda/memory.py`` applies. ``memory_stats``, ``memory_allocated`` and
friends each build the whole flattened stats dict (65–125 µs apiece on an H200), so one sample
makes exactly one call, ``memory_stats_as_nested_dict(index)``, which skips the flattening, and
takes every key from it. The device index is always explicit because the current device is per
thread and the sampler runs on its own thread.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import threading
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..model import AllocatorInfo, AllocatorReading

ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
INIT_HOOK_ATTR = "_gpumem_nb_init_hook"

TORCH_NOT_IMPORTED = "torch is not imported"
TORCH_NOT_INITIALIZED = "torch is imported; CUDA not initialized yet"
TORCH_NO_CUDA = "torch has no CUDA support in this build"
TORCH_INITIALIZED = "CUDA initialized"


def _stat(stats: Mapping[str, Any], name: str, which: str) -> int:
    try:
        return int(stats[name]["all"][which])
    except (KeyError, TypeError, ValueError, OverflowError):
        return 0


def parse_stats(stats: Mapping[str, Any]) -> AllocatorReading:
    """Pick the fields we need out of one nested stats dict."""
    return AllocatorReading(
        allocated_bytes=_stat(stats, "allocated_bytes", "current"),
        reserved_bytes=_stat(stats, "reserved_bytes", "current"),
        active_bytes=_stat(stats, "active_bytes", "current"),
        inactive_split_bytes=_stat(stats, "inactive_split_bytes", "current"),
        peak_allocated_bytes=_stat(stats, "allocated_bytes", "peak"),
        peak_reserved_bytes=_stat(stats, "reserved_bytes", "peak"),
        num_alloc_retries=_count(stats, "num_alloc_retries"),
        num_ooms=_count(stats, "num_ooms"),
        allocations=_stat(stats, "allocation", "allocated"),
        frees=_stat(stats, "allocation", "freed"),
    )


def _count(stats: Mapping[str, Any], name: str) -> int:
    # Junk in a stats dict (a patched allocator, a future format) reads as 0, never raises.
    try:
        return int(stats.get(name, 0) or 0)
    except (TypeError, ValueError, OverflowError):
        return 0




# The reading of a device this process has no context on: it has never allocated there.
ZERO_READING = AllocatorReading(0, 0, 0, 0, 0, 0, 0, 0)


def alloc_conf(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The allocator configuration in effect and the variable it came from.

    ``PYTORCH_ALLOC_CONF`` is the current name; torch still honours the older one.
    """
    env = os.environ if env is None else env
    for var in ALLOC_CONF_VARS:
        if env.get(var):
            return env[var], var
    return "", ""


@contextlib.contextmanager
def inductor_lookup_skipped(modules: Mapping[str, Any]) -> Any:
    """Where a process's first traced snapshot spent its seconds: torch symbolizes the Python
    frames in ``combined_traceback.cpp`` (``PythonTraceback::appendSymbolized``), which first
    asks ``hasattr(torch, "_inductor")`` to add the frames of inductor-generated code. torch's
    module ``__getattr__`` answers that by importing ``torch._inductor``: seconds, once per
    process, whatever the history's length. When nobody has imported ``torch._inductor``,
    no frame can be its generated code, so the answer is known: for the length of the call,
    ``torch._inductor`` reads as a module without ``codecache``, and torch skips the lookup.
    Left as it was afterwards; when inductor is already imported, nothing is touched."""
    torch = modules.get("torch")
    ns = getattr(torch, "__dict__", None)
    if not isinstance(ns, dict) or "torch._inductor" in modules or "_inductor" in ns:
        yield
        return
    stand_in = types.ModuleType("torch._inductor", "gpumem_nb: skip the lookup of inductor's "
                                "generated code during one snapshot")
    ns["_inductor"] = stand_in
    try:
        yield
    finally:
        # An import of the real module meanwhile replaced the stand-in: keep that one.
        if ns.get("_inductor") is stand_in:
            del ns["_inductor"]


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

    def __init__(self, modules: Mapping[str, Any] | None = None) -> None:
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


def _unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Turn ``memory_stats``' dotted keys back into the nested shape (old torch fallback)."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


# ------------------------------------------------------------------------------------------
# The allocator's debugging hooks (issue 10): OOM observer, allocation history, snapshots.
# Each is a private torch API that moved between releases, so each is feature-detected; and
# each can initialise CUDA when called too early, so each sits behind ``_cuda()``'s guard.
# ------------------------------------------------------------------------------------------
OOM_OBSERVER_ATTR = "_gpumem_nb_oom_observer"
# The attachment queued on torch's CUDA start-up, kept on ``torch._C`` beside the attached
# observer: a reload finds it there and queues no second one (torch's queue cannot be emptied).
OOM_QUEUED_ATTR = "_gpumem_nb_oom_observer_queued"
# Both ways of attaching (queued, run as CUDA starts; direct, once it is up) check, attach and
# record under this lock: one registration per process, whichever thread gets there first.
_ATTACH_LOCK = threading.Lock()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def backend_from_env(env: Mapping[str, str] | None = None) -> str:
    """The allocator backend torch picks from the environment as it is imported: c10's
    ``CUDAAllocatorConfig::instance()`` reads ``PYTORCH_CUDA_ALLOC_CONF`` when it is set (even
    empty) and only otherwise ``PYTORCH_ALLOC_CONF``, so the older name wins when both are
    set. Only a stand-in for ``torch._C._cuda_getAllocatorBackend``, for builds without it:
    the environment can have changed since the import, the allocator chosen then cannot."""
    env = os.environ if env is None else env
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF")
    if conf is None:
        conf = env.get("PYTORCH_ALLOC_CONF", "")
    for option in re.split(r"[\s,]+", conf):
        key, _, value = option.partition(":")
        if key.strip() == "backend" and value.strip():
            return value.strip()
    return "native"


def _attach_once(c: Any, observer: Any) -> bool:
    """Register ``observer`` with the allocator unless one of ours already is; True when one
    is registered afterwards. Never raises. Run as CUDA starts (queued) or once it is up."""
    with _ATTACH_LOCK:
        if getattr(c, OOM_OBSERVER_ATTR, None) is not None:
            return True
        try:
            # Re-read at the start: ``change_current_allocator`` may have swapped the
            # allocator since the attachment was queued (a pluggable one refuses it too).
            backend = getattr(c, "_cuda_getAllocatorBackend", None)
            if backend is not None and str(backend()) != "native":
                return False
            c._cuda_attach_out_of_memory_observer(observer)
        except Exception:
            return False
        setattr(c, OOM_OBSERVER_ATTR, observer)
        return True


class _AttachAtStart:
    """What torch's CUDA start-up queue holds: attaches ``observer`` (the process's one
    trampoline) while ``torch.cuda._lazy_init`` runs, before the call that started CUDA
    allocates anything, so an OOM in the cell that first uses the GPU is seen.

    Kept trivial (torch keeps it for the life of the process, whatever copy of gpumem_nb made
    it) and never raising: an exception here becomes torch's ``DeferredCudaCallError`` and
    the user's CUDA start fails. torch runs its queue again after a failed start, and may run
    this at once if CUDA came up meanwhile: attaching is idempotent (``_attach_once``)."""

    def __init__(self, c: Any, observer: Any) -> None:
        self.c = c
        self.observer = observer

    def __call__(self) -> None:
        with contextlib.suppress(BaseException):
            _attach_once(self.c, self.observer)


class TorchDebug(TorchSource):
    """TorchSource plus the calls only the OOM explainer and the cell trace make."""

    def _torch_c(self) -> Any | None:
        torch = self._modules.get("torch")
        return getattr(torch, "_C", None) if torch is not None else None

    def oom_observer(self, factory: Any) -> tuple[Any | None, str]:
        """The process's one OOM observer: the one registered before (by any load or reload
        of gpumem_nb) or ``factory()``'s, registered now; ``(None, why not)`` otherwise.

        PyTorch cannot detach an observer, so the registered object is kept on ``torch._C``
        itself: it lives exactly as long as the allocator it is registered with, and a
        reloaded gpumem_nb finds it there instead of registering a second one. Registering
        runs ``lazyInitCUDA``, hence the initialised guard.
        """
        if self._cuda() is None:
            return None, TORCH_NOT_INITIALIZED
        c = self._torch_c()
        existing = getattr(c, OOM_OBSERVER_ATTR, None)
        if existing is not None:
            return existing, ""
        attach = getattr(c, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            return None, "this torch build has no OOM observer"
        # The trampoline queued on CUDA's start, if that attachment did not happen: the same
        # object, so that the process never holds two.
        queued = getattr(c, OOM_QUEUED_ATTR, None)
        observer = getattr(queued, "observer", None) or factory()
        with _ATTACH_LOCK:
            existing = getattr(c, OOM_OBSERVER_ATTR, None)
            if existing is not None:
                return existing, ""
            try:
                attach(observer)
            except Exception as e:  # cudaMallocAsync: "does not yet support ...Observer"
                return None, _first_line(e)
            setattr(c, OOM_OBSERVER_ATTR, observer)
        return observer, ""

    def import_backend(self) -> str | None:
        """The allocator backend torch chose when it was imported, read without starting
        CUDA; None without torch or when this build cannot say.

        ``torch._C._cuda_getAllocatorBackend`` (what ``torch.cuda.get_allocator_backend``
        returns) is ``CUDACachingAllocator::name()``, that is ``get()->name()``: a load of the
        allocator pointer c10's ``BackendStaticInitializer`` stored while torch's libraries
        loaded, from the environment of that moment. It calls no ``lazyInitCUDA``. Without
        it (a build older than the backend switch), the environment is read as torch reads it.
        """
        torch = self._modules.get("torch")
        if torch is None:
            return None
        fn = getattr(getattr(torch, "_C", None), "_cuda_getAllocatorBackend", None)
        if fn is None:
            return backend_from_env()
        try:
            return str(fn())
        except Exception:
            return None

    def queue_oom_observer(self, factory: Any) -> tuple[Any | None, str]:
        """The process's one OOM observer, queued to attach while CUDA starts: the one queued
        or attached before (by any load or reload of gpumem_nb), or ``factory()``'s, queued
        now through ``torch.cuda._lazy_call``; ``(None, why not)`` otherwise.

        torch runs its queue inside ``_lazy_init``, after ``_cuda_init`` and before the call
        that caused the start goes on to allocate. Queueing starts nothing and imports
        nothing. Only under the native allocator: under cudaMallocAsync the attachment raises,
        and a queued call that raises makes CUDA's start fail (``DeferredCudaCallError``).
        ``(None, TORCH_INITIALIZED)`` when CUDA is up already: attach with ``oom_observer``.
        """
        torch = self._modules.get("torch")
        c = getattr(torch, "_C", None)
        cuda = getattr(torch, "cuda", None)
        if c is None or cuda is None:  # not imported, or still being imported: next cell
            return None, TORCH_NOT_IMPORTED
        existing = getattr(c, OOM_OBSERVER_ATTR, None)
        if existing is not None:
            return existing, ""
        queued = getattr(c, OOM_QUEUED_ATTR, None)
        if queued is not None:
            return queued.observer, ""
        try:
            if cuda.is_initialized():
                return None, TORCH_INITIALIZED
        except Exception as e:
            return None, _first_line(e)
        if getattr(c, "_cuda_attach_out_of_memory_observer", None) is None:
            return None, "this torch build has no OOM observer"
        lazy = getattr(cuda, "_lazy_call", None)
        if lazy is None:
            return None, "this torch build has no lazy-init queue"
        backend = self.import_backend()
        if backend != "native":
            return None, (f"the {backend} allocator has no OOM observer" if backend
                          else "the allocator backend is unknown before CUDA starts")
        hook = _AttachAtStart(c, factory())
        try:
            lazy(hook)  # run at once instead if CUDA came up meanwhile: attached then
        except Exception as e:
            return None, _first_line(e)
        setattr(c, OOM_QUEUED_ATTR, hook)
        return hook.observer, ""

    def oom_observer_attached(self) -> bool:
        """Whether the process's OOM observer is registered with the allocator now."""
        return getattr(self._torch_c(), OOM_OBSERVER_ATTR, None) is not None

    def allocator_backend(self) -> str | None:
        """"native" or "cudaMallocAsync"; None before CUDA is up or when torch cannot say."""
        fn = getattr(self._cuda(), "get_allocator_backend", None)
        if fn is None:
            return None
        try:
            return str(fn())
        except Exception:
            return None

    def grad_enabled(self) -> bool | None:
        """``torch.is_grad_enabled()`` on the calling thread (a thread-local flag: reading it
        starts nothing); None without torch."""
        fn = getattr(self._modules.get("torch"), "is_grad_enabled", None)
        if fn is None:
            return None
        try:
            return bool(fn())
        except Exception:
            return None

    def device_total_bytes(self, index: int) -> int | None:
        """The device's memory as CUDA counts it (the OOM message's "total capacity")."""
        cuda = self._cuda()
        if cuda is None:
            return None
        try:
            total = getattr(cuda.get_device_properties(index), "total_memory", None)
        except Exception:
            return None
        return int(total) if total is not None else None

    def memory_fraction(self, index: int) -> float | None:
        """``set_per_process_memory_fraction``'s value (1.0 when unset); None if unknown."""
        fn = getattr(self._cuda(), "get_per_process_memory_fraction", None)
        if fn is None:
            return None
        try:
            return float(fn(index))
        except Exception:
            return None

    def history_enabled(self) -> bool | None:
        """Whether allocation history is recorded now; None when this build cannot say."""
        if self._cuda() is None:
            return False
        fn = getattr(self._torch_c(), "_cuda_isHistoryEnabled", None)
        if fn is None:
            return None
        try:
            return bool(fn())
        except Exception:
            return None

    def record_history(self, enabled: bool, *, max_entries: int = 100_000) -> str:
        """Switch allocation history on (Python stacks, frames on allocations) or off.

        "" on success, else why not. The keyword form arrived in torch 2.1; older builds
        take the legacy boolean form, tried when the keywords are refused.
        """
        cuda = self._cuda()
        if cuda is None:
            return TORCH_NOT_INITIALIZED
        record = getattr(getattr(cuda, "memory", None), "_record_memory_history", None)
        if record is None:
            return "this torch build cannot record allocation history"
        try:
            if not enabled:
                record(None)
            else:
                try:
                    record("all", context="alloc", stacks="python", max_entries=max_entries)
                except TypeError:
                    record(True, trace_alloc_max_entries=max_entries,
                           trace_alloc_record_context=True)
        except Exception as e:  # cudaMallocAsync: "does not yet support recordHistory"
            return _first_line(e)
        return ""

    def memory_snapshot(self) -> tuple[dict[str, Any] | None, str]:
        """``torch.cuda.memory._snapshot()`` (segments, blocks, traces), or (None, why not).
        Its cost grows with the recorded history (about 0.7 s for 100k entries)."""
        cuda = self._cuda()
        if cuda is None:
            return None, TORCH_NOT_INITIALIZED
        snap = getattr(getattr(cuda, "memory", None), "_snapshot", None)
        if snap is None:
            return None, "this torch build has no memory snapshot"
        try:
            # With history on, each block's frames are symbolized: a process's first such
            # read imported torch._inductor (5.2 s in an OOM explanation of a traced cell).
            with inductor_lookup_skipped(self._modules):
                result = snap()
        except Exception as e:  # cudaMallocAsync: "Calling snapshot ... is not meaningful"
            return None, _first_line(e)
        return (dict(result) if isinstance(result, Mapping) else None), ""

    def segments_snapshot(self) -> tuple[list[dict[str, Any]] | None, str]:
        """The allocator's segments alone, no history: cheap (about 0.06 ms on the H200), so
        taken when a trace begins, as the what-if's start state. ``memory_snapshot(
        include_traces=False)`` where this torch has it; with history off, ``_snapshot()``
        carries no traces and costs the same."""
        cuda = self._cuda()
        if cuda is None:
            return None, TORCH_NOT_INITIALIZED
        fn = getattr(getattr(cuda, "memory", None), "memory_snapshot", None)
        if fn is not None:
            try:
                with inductor_lookup_skipped(self._modules):
                    return [dict(s) for s in fn(include_traces=False)], ""
            except TypeError:  # a torch without include_traces
                pass
            except Exception as e:  # cudaMallocAsync: "not meaningful"
                return None, _first_line(e)
        if self.history_enabled() is False:
            snap, why = self.memory_snapshot()
            return ([dict(s) for s in snap.get("segments") or ()] if snap is not None
                    else None), why
        return None, ("this torch lists segments only with the whole history, which is on; "
                      "the segments at the trace's start are not recorded")

    def mem_info(self, index: int) -> tuple[int, int] | None:
        """(free, total) bytes from ``cudaMemGetInfo``, only for a device this process
        already has a context on (the call would create one otherwise)."""
        cuda = self._cuda()
        has_ctx = getattr(self._torch_c(), "_cuda_hasPrimaryContext", None)
        fn = getattr(cuda, "mem_get_info", None)
        if cuda is None or has_ctx is None or fn is None:
            return None
        try:
            if not has_ctx(index):
                return None
            free, total = fn(index)
            return int(free), int(total)
        except Exception:
            return None
