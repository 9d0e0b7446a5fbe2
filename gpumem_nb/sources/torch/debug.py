"""``TorchDebug``: the allocator's debugging hooks, which only the OOM explainer and the cell
trace use: the OOM observer, allocation history, snapshots.
"""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Iterator, Mapping
from typing import Any

from .source import (
    TORCH_INITIALIZED,
    TORCH_NOT_IMPORTED,
    TORCH_NOT_INITIALIZED,
    TorchSource,
    _first_line,
)
from .stats import backend_from_env

__all__ = ["OOM_OBSERVER_ATTR", "OOM_QUEUED_ATTR", "TorchDebug", "inductor_lookup_skipped"]

# Each hook is a private torch API that moved between releases, so each is feature-detected;
# and each can initialise CUDA when called too early, so each sits behind ``_cuda()``'s guard.
OOM_OBSERVER_ATTR = "_gpumem_nb_oom_observer"
# The attachment queued on torch's CUDA start-up, kept on ``torch._C`` beside the attached
# observer: a reload finds it there and queues no second one (torch's queue cannot be emptied).
OOM_QUEUED_ATTR = "_gpumem_nb_oom_observer_queued"
# Both ways of attaching (queued, run as CUDA starts; direct, once it is up) check, attach and
# record under this lock: one registration per process, whichever thread gets there first.
_ATTACH_LOCK = threading.Lock()


@contextlib.contextmanager
def inductor_lookup_skipped(modules: Mapping[str, types.ModuleType]) -> Iterator[None]:
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
