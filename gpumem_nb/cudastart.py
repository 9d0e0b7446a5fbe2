"""Where CUDA started: the cell, and the line in it, that first initialised CUDA.

Forking launchers (accelerate's ``notebook_launcher``, Lightning's ``ddp_notebook``) fail once
the kernel has initialised CUDA: some refuse up front, most now fork anyway and re-raise what
each worker hit ("Cannot re-initialize CUDA in forked subprocess"), and the user is left to hunt
for the cell that started CUDA. Which launcher forked is read from the frames the error passed
through. Two ways to know where CUDA started, the exact one first:

1. **torch's own start-up queue.** ``torch.cuda._lazy_call`` keeps calls until CUDA
   initialises, then runs them inside ``_lazy_init``, on the thread and in the stack that
   caused the start. A hook queued there reads that stack: the outermost frame of a cell's code
   is the line the user ran; an inner one, when it differs, says which function of which cell
   (or which library file) made the first CUDA call. The hook is queued only once torch is
   imported (checked in ``sys.modules``: this module imports nothing) and never initialises
   anything itself.
2. **A cell's two ends.** When the hook could not be queued in time (torch imported and CUDA
   started in the same cell), the first cell whose end finds CUDA up when its start did not.

The cell numbers come from IPython's compiler, which maps each cell's code name (the
``<ipython-input-N-...>`` or ipykernel's temporary file name) to its execution count.

Nothing here imports torch or IPython.
"""

from __future__ import annotations

import contextlib
import linecache
import re
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from . import userexc
from .sources.torch import TorchSource

HOW_HOOK = "torch's CUDA start-up"  # exact: the stack at initialisation
HOW_CELL = "the cell's end"  # the first cell that ended with CUDA up
HOW_BEFORE = "before gpumem_nb was loaded"

_INPUT_NAME = re.compile(r"<ipython-input-(\d+)-")
MAX_FRAMES = 200

_LAUNCH_REMEDY = ("Restart the kernel, move that CUDA call into the function you launch (or "
                  "after the launch), and run the launch before any cell touches the GPU.")


@dataclass(frozen=True)
class Forker:
    """Who forked the process that could not use CUDA, and what to do instead."""

    name: str  # "accelerate's notebook_launcher"
    did: str  # the message's first clause
    remedy: str
    modules: tuple[str, ...] = ()  # prefixes of the module names its frames carry


ACCELERATE = Forker("accelerate's notebook_launcher",
                    "accelerate's notebook_launcher forks its workers", _LAUNCH_REMEDY,
                    ("accelerate.",))
LIGHTNING = Forker("Lightning's ddp_notebook", "Lightning's ddp_notebook forks its workers",
                   _LAUNCH_REMEDY, ("lightning.", "lightning_fabric.", "pytorch_lightning."))
DATALOADER = Forker("the DataLoader", "the DataLoader forks its workers",
                    "Keep CUDA out of the dataset and collate_fn (move each batch to the GPU in "
                    "the loop), or pass multiprocessing_context='spawn' to the DataLoader.",
                    ("torch.utils.data.",))
ELASTIC = Forker("torch's elastic launch", "torch's elastic launch forks its workers",
                 _LAUNCH_REMEDY, ("torch.distributed.",))
TORCH_MP = Forker("torch.multiprocessing", "torch.multiprocessing forked its workers",
                  "Pass start_method='spawn' (the function must then come from an importable "
                  "module), or restart the kernel and start them before any cell touches "
                  "the GPU.", ("torch.multiprocessing.",))
MULTIPROCESSING = Forker("multiprocessing", "multiprocessing forked its workers",
                         "Use multiprocessing.get_context('spawn') (the function must then come "
                         "from an importable module), or restart the kernel and start them "
                         "before any cell touches the GPU.",
                         ("multiprocessing.", "concurrent.futures."))
FORKED = Forker("a forked process", "a process forked from this kernel used CUDA",
                "Start such processes with the 'spawn' start method, or restart the kernel and "
                "start them before any cell touches the GPU.")

# The launcher nearest the user's cell names the fork: Lightning's and accelerate's frames come
# before torch's own, which come before the standard library's.
FORKERS = (ACCELERATE, LIGHTNING, DATALOADER, ELASTIC, TORCH_MP, MULTIPROCESSING)

# What forking launchers say when CUDA is already up in the kernel (told by the words alone),
# and what PyTorch says in a forked child that touches CUDA: the launcher then re-raises it in
# the kernel (accelerate 1.15's elastic launch as a ChildFailedError, Lightning 2.6.4 and
# later, which no longer refuse up front, as torch's ProcessRaisedException), and who forked
# is told by the frames the error passed through.
LAUNCHER_REFUSALS: tuple[tuple[Forker | None, str], ...] = (
    (ACCELERATE, "CUDA has been initialized before the `notebook_launcher` could create a "
                 "forked subprocess"),
    (ACCELERATE, "To launch a multi-GPU training from your notebook, you need to avoid running "
                 "any instruction using `torch.cuda` in any cell"),
    (LIGHTNING, "Lightning can't create new processes if CUDA is already initialized"),
    (None, "Cannot re-initialize CUDA in forked subprocess"),
)


@dataclass(frozen=True)
class CudaStart:
    """The cell and line that first initialised CUDA in this kernel, as far as known."""

    how: str  # HOW_*
    execution_count: int | None = None
    line: int | None = None  # 1-based, within the cell
    code: str = ""  # that line's text
    via: str = ""  # the innermost frame when it is elsewhere: "f() in cell [2], line 4"
    thread: str = ""

    def sentence(self) -> str:
        """"CUDA started in cell [3], line 2: `x = torch.zeros(1).cuda()`"."""
        if self.how == HOW_BEFORE:
            return ("CUDA was already initialised when gpumem_nb was loaded, so the cell that "
                    "started it is not known (load the extension first to find out).")
        if self.execution_count is None:
            return "CUDA started outside any cell (in code the kernel ran on its own)."
        text = f"CUDA started in cell [{self.execution_count}]"
        if self.line is not None:
            text += f", line {self.line}" + (f": `{self.code}`" if self.code else "")
        else:
            text += " (seen at the cell's end: torch was imported in that same cell)"
        if self.via:
            text += f", through {self.via}"
        if self.thread and self.thread != "MainThread":
            text += f", on thread {self.thread}"
        return text + "."


class _InitHook:
    """What torch's queue holds: forwards to whichever load of gpumem_nb is current. Kept
    trivial (an old copy of this class must keep working after a reload) and never raising:
    an exception here would become torch's ``DeferredCudaCallError`` and break the user's
    CUDA start."""

    def __init__(self) -> None:
        self.handler: Any = None
        self.registering = False

    def __call__(self) -> None:
        handler = self.handler
        if handler is None or self.registering:
            return
        with contextlib.suppress(BaseException):
            handler(sys._getframe(1))


class CudaStartWatch:
    """One loaded extension's record of where CUDA started."""

    def __init__(self, torch: TorchSource, shell: Any) -> None:
        self.torch = torch
        self.shell = shell
        self.started: CudaStart | None = None
        self.status = "waiting for torch to be imported"
        self._hook: Any = None
        self._up_at_start = False
        self._count_at_start: int | None = None
        self._lock = threading.Lock()

    # -- the hook ----------------------------------------------------------------------------
    def arm(self) -> None:
        """Queue the start-up hook once torch is imported; a dict lookup otherwise. Called
        from the cell hooks until CUDA has started."""
        if self._hook is not None or self.started is not None or "torch" not in sys.modules:
            return
        if self.torch.initialized:
            return
        hook, why = self.torch.on_cuda_init(_InitHook)
        if hook is None:
            self.status = f"not queued: {why}"
            return
        hook.handler = self._on_init
        self._hook = hook
        self.status = "queued on torch.cuda's start-up"

    def close(self) -> None:
        hook, self._hook = self._hook, None
        if hook is not None and getattr(hook, "handler", None) == self._on_init:
            hook.handler = None

    def _on_init(self, frame: FrameType | None) -> None:
        """Inside torch's ``_lazy_init``: read the stack that started CUDA, nothing else."""
        frames: list[tuple[str, int, str]] = []
        while frame is not None and len(frames) < MAX_FRAMES:
            code = frame.f_code
            frames.append((code.co_filename, frame.f_lineno, code.co_name))
            frame = frame.f_back
        start = locate(frames, self._cell_number, threading.current_thread().name)
        with self._lock:
            if self.started is None:
                self.started = start

    def _cell_number(self, filename: str) -> int | None:
        table = getattr(getattr(self.shell, "compile", None), "_filename_map", None)
        if isinstance(table, dict) and filename in table:
            number = table[filename]
            return number if isinstance(number, int) else None
        m = _INPUT_NAME.match(filename)
        return int(m.group(1)) if m else None

    # -- the fallback: a cell's two ends ---------------------------------------------------------
    def on_load(self) -> None:
        if self.torch.initialized:
            self.started = CudaStart(HOW_BEFORE)
            self.status = "CUDA was up before gpumem_nb was loaded"

    def cell_started(self, execution_count: int | None) -> None:
        if self.started is not None:
            return
        self.arm()
        self._up_at_start = self.torch.initialized
        self._count_at_start = execution_count

    def cell_ended(self, execution_count: int | None) -> None:
        if self.started is not None:
            return
        if not self._up_at_start and self.torch.initialized:
            with self._lock:
                if self.started is None:  # the hook did not see it
                    self.started = CudaStart(HOW_CELL, execution_count=execution_count)
            return
        self.arm()  # torch was imported by this cell: queue for the next ones

    def line(self) -> str:
        return self.started.sentence() if self.started is not None else ""


def locate(frames: Iterable[tuple[str, int, str]], cell_number: Any,
           thread: str = "") -> CudaStart:
    """The start, from the stack at CUDA's initialisation (innermost frame first): the
    outermost frame of a cell's code is the line the user ran."""
    stack = list(frames)
    cells = [(f, n, name, cell_number(f)) for f, n, name in stack]
    in_cells = [c for c in cells if c[3] is not None]
    if not in_cells:
        return CudaStart(HOW_HOOK, thread=thread)
    filename, lineno, _name, number = in_cells[-1]
    code = linecache.getline(filename, lineno).strip()
    via = ""
    # The innermost cell frame, when it is not that line: a function of some cell made the
    # first CUDA call ("f() in cell [2], line 4").
    f, n, name, c = in_cells[0]
    if (f, n) != (filename, lineno):
        via = f"{name}() in cell [{c}], line {n}" if name != "<module>" else \
            f"cell [{c}], line {n}"
    return CudaStart(HOW_HOOK, execution_count=number, line=lineno, code=code[:120], via=via,
                     thread=thread)


def launcher_refusal(exc: BaseException | None,
                     text_of: userexc.TextOf = userexc.text) -> Forker | None:
    """Which fork could not use CUDA because the kernel had initialised it, read from a cell's
    exception or what it chains to; None when it is not such an error. ``text_of`` gives an
    exception's text (a cell's hooks share one ``userexc.Texts``)."""
    chain = userexc.chain(exc, 8)
    for e in chain:
        text = text_of(e)  # "" from a __str__ that raises: no launcher's refusal
        for who, words in LAUNCHER_REFUSALS:
            if words in text:
                return who if who is not None else forker_of(chain)
    return None


def forker_of(chain: Iterable[BaseException]) -> Forker:
    """The launcher whose frames the error passed through, nearest the user's cell first."""
    for e in chain:
        tb = userexc.traceback_of(e)
        for _ in range(MAX_FRAMES):
            if tb is None:
                break
            module = tb.tb_frame.f_globals.get("__name__")
            if isinstance(module, str):
                for f in FORKERS:
                    if module.startswith(f.modules):
                        return f
            tb = tb.tb_next
    return FORKED


def refusal_advice(who: Forker, start: CudaStart | None) -> str:
    """The message printed under a cell whose fork could not use CUDA: where CUDA started, and
    what to do about it."""
    where = start.sentence() if start is not None else (
        "gpumem_nb did not see where CUDA started (torch was imported after the extension "
        "was loaded, and no cell has ended with CUDA up).")
    return (f"gpumem: {who.did}: a forked process cannot use CUDA once this kernel has "
            f"initialised it. {where} {who.remedy}")
