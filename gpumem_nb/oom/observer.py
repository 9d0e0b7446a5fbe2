"""PyTorch's OOM observer, attached once per process: the trampoline PyTorch holds, queued on
torch's CUDA start-up as soon as torch is imported (so that it sees an OOM in the very cell
that starts CUDA), attached directly once CUDA is up, and, where none can be attached, the
collections measured while an OOM is handled instead. ``OomWatch`` mixes it in."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from ..errtext import error_str
from ..sources.torch import TORCH_INITIALIZED, TORCH_NOT_IMPORTED, TorchDebug
from .gcwindow import WhileHandled
from .message import find_cuda_oom, parse_oom_message

__all__ = ["ObserverAttachment"]


class _Trampoline:
    """What PyTorch holds as the OOM observer: forwards to whichever handler the current load
    of gpumem_nb installed. PyTorch cannot detach observers, so this one object is registered
    once per process and only its ``handler`` changes across loads and reloads. Kept trivial
    on purpose: an instance made by an older copy of this module must keep working."""

    def __init__(self) -> None:
        self.handler: Callable[[int, int, int, int], None] | None = None

    def __call__(self, device: int, alloc: int, limit: int, free: int) -> None:
        handler = self.handler
        if handler is None:
            return
        # Raising here would replace the user's OOM with our error.
        with contextlib.suppress(BaseException):
            handler(device, alloc, limit, free)


class ObserverAttachment:
    """The observer's attachment, for ``OomWatch``: its state lives on the watch, which sets
    it in ``__init__`` and detaches the handler at ``close``."""

    torch: TorchDebug
    observer_status: str
    _observer: Any
    _attach_tried: bool
    _armed: bool
    _modules: Mapping[str, ModuleType]
    _closed: bool
    _handled: WhileHandled | None
    # What the trampoline calls: the watch's reading at the failure.
    _on_oom: Callable[[int, int, int, int], None]

    def arm(self) -> None:
        """At load and at each cell's start: once torch is imported, queue the observer on
        torch's CUDA start-up (``TorchDebug.queue_oom_observer``), so that it is attached
        before the call that starts CUDA allocates, and an OOM in that very cell is seen.
        A dict lookup while torch is not imported, one attribute check once tried. Starts
        nothing and imports nothing."""
        if self._armed or self._closed or "torch" not in self._modules:
            return
        self._arm()

    def _arm(self) -> None:
        self._armed = True  # once: a queue that failed is not tried again every cell
        queue = getattr(self.torch, "queue_oom_observer", None)
        if queue is None:  # a stand-in for TorchDebug: attached once CUDA is up, as before
            self.observer_status = "not attached: CUDA is not initialized yet"
            return
        observer, why = queue(_Trampoline)
        if observer is not None:
            # The process's trampoline, queued or attached: it calls this load from now on,
            # and stops at ``close``.
            observer.handler = self._on_oom
            self._observer = observer
            self.observer_status = "attached" if self.torch.oom_observer_attached() else \
                "queued: attaches when CUDA starts"
        elif why == TORCH_NOT_IMPORTED:
            self._armed = False
        elif why == TORCH_INITIALIZED:
            self._attach_now()  # CUDA was up already: attached as before
        else:
            # cudaMallocAsync (its attachment would make CUDA's start fail), or no queue in
            # this build: tried again, directly, once CUDA is up.
            self.observer_status = f"not queued: {why}"
            self._watch_handling()

    def ensure_attached(self) -> None:
        """At each cell's end: queue the observer if torch was imported meanwhile (``arm``),
        and once CUDA is up, see that it is attached (by the queue, as CUDA started, or now);
        a no-op afterwards (one attribute check).
        Never after ``close``: the process-wide observer would keep an unloaded monitor
        alive (a ``%%gpumem`` cell that ran ``%unload_ext`` explains its own result after)."""
        if self._attach_tried or self._closed:
            return
        if not self._armed:
            if "torch" not in self._modules:
                return
            self._arm()  # attached already if CUDA was up
        if not self._attach_tried and self.torch.initialized:
            self._attach_now()

    def _attach_now(self) -> None:
        self._attach_tried = True
        self._armed = True
        observer, why = self.torch.oom_observer(_Trampoline)
        if observer is None:
            # torch's reason, up to its first sentence ("cudaMallocAsync does not yet
            # support attachOutOfMemoryObserver.")
            self.observer_status = f"not available: {why.split('. ')[0].rstrip('.')}"
            self._watch_handling()
            return
        observer.handler = self._on_oom
        self._observer = observer
        self.observer_status = "attached"

    def _watch_handling(self) -> None:
        """No observer: measure the collections that run while an OOM is being handled
        (IPython's traceback display, before the cell's end explains it)."""
        if self._handled is not None or self._closed:
            return
        devices: dict[int, int] = {}

        def read(exc: BaseException) -> int | None:
            device = devices.get(id(exc))
            if device is None:
                oom = find_cuda_oom(exc)
                msg = parse_oom_message(error_str(oom)) if oom is not None else None
                device = msg.device if msg is not None and msg.device is not None else 0
                devices.clear()
                devices[id(exc)] = device
            r = self.torch.read(device)
            return r.allocated_bytes if r is not None else None

        self._handled = WhileHandled(read, lambda e: find_cuda_oom(e) is not None)
        self._handled.start()
