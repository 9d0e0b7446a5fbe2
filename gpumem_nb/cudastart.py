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
``<ipython-input-N-...>`` or ipykernel's temporary file name) to its execution count. The stack
is read against the cell running at that moment (its number, its text as typed, its thread):

- a cell magic's body (``%%capture``, ``%%gpumem``, ``%%time``, ``%%timeit``) runs as code of
  its own (a nested cell, numbered one past the running cell, or ``<timed exec>``), whose
  lines count from the body: they are the running cell's lines after the magic's;
- a line's text is the cell's as typed (``%time x = ...``, not ``get_ipython()...``), its number
  as the editor shows it (IPython drops leading blank lines before compiling);
- on another thread, the hook's stack holds only the thread's own functions: the cell is the
  one running then, at the line its thread has reached, and the thread's code is the way in.

Nothing here imports torch or IPython.
"""

from __future__ import annotations

import linecache
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from . import userexc
from .cellnames import CellNames
from .errtext import error_str
from .sources.torch.source import CudaStartHook, TorchSource

__all__ = [
    "ACCELERATE",
    "DATALOADER",
    "ELASTIC",
    "FORKED",
    "FORKERS",
    "HOW_BEFORE",
    "HOW_CELL",
    "HOW_HOOK",
    "LAUNCHER_REFUSALS",
    "LIGHTNING",
    "MAX_FRAMES",
    "MULTIPROCESSING",
    "TORCH_MP",
    "CudaStart",
    "CudaStartWatch",
    "Forker",
    "Frame",
    "RunningCell",
    "forker_of",
    "launcher_refusal",
    "locate",
    "refusal_advice",
]

HOW_HOOK = "torch's CUDA start-up"  # exact: the stack at initialisation
HOW_CELL = "the cell's end"  # the first cell that ended with CUDA up
HOW_BEFORE = "before gpumem_nb was loaded"

MAX_FRAMES = 200
Frame = tuple[str, int, str]  # file name, line, function

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
            text = "CUDA started outside any cell (in code the kernel ran on its own)"
        elif self.line is not None:
            text = f"CUDA started in cell [{self.execution_count}], line {self.line}" + (
                f": `{self.code}`" if self.code else "")
        elif self.how == HOW_CELL:
            text = (f"CUDA started in cell [{self.execution_count}] (seen at the cell's end: "
                    "torch was imported in that same cell)")
        else:
            text = f"CUDA started while cell [{self.execution_count}] ran"
        if self.via:
            text += f", through {self.via}"
        if self.thread and self.thread != "MainThread":
            text += f", on thread {self.thread}"
        return text + "."


class _InitHook(CudaStartHook):
    """The hook that finds where CUDA started (``CudaStartWatch``)."""


@dataclass(frozen=True)
class RunningCell:
    """The top-level cell running now, as the user typed it."""

    execution_count: int | None
    raw: str
    thread_id: int


class CudaStartWatch:
    """One loaded extension's record of where CUDA started."""

    def __init__(self, torch: TorchSource, shell: Any) -> None:
        self.torch = torch
        self.shell = shell
        self.started: CudaStart | None = None
        self.status = "waiting for torch to be imported"
        self._hook: Any = None
        self._up_at_start = False
        self._running: RunningCell | None = None
        self._cell_thread: int | None = threading.main_thread().ident  # where cells run
        self._load_cell = False  # loaded from inside a cell whose end is still to come
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
        running = self._running
        here = threading.get_ident()
        cell_thread = running.thread_id if running is not None else self._cell_thread
        runner = None
        if here != cell_thread and running is not None:
            # Another thread started CUDA: where the cell's own thread is now.
            runner = _frames(sys._current_frames().get(running.thread_id))
        start = locate(_frames(frame), self._cell_number, threading.current_thread().name,
                       running=running, runner=runner, on_cell_thread=here == cell_thread,
                       in_cell=running is not None or self._load_cell)
        with self._lock:
            if self.started is None:
                self.started = start

    def _cell_number(self, filename: str) -> int | None:
        return CellNames.of(self.shell).number(filename)

    # -- the fallback: a cell's two ends ---------------------------------------------------------
    def on_load(self, in_cell: bool = False) -> None:
        """``in_cell``: loaded by a cell (``%load_ext``) whose end is yet to come, and which
        may itself import torch and start CUDA."""
        if self.torch.initialized:
            self.started = CudaStart(HOW_BEFORE)
            self.status = "CUDA was up before gpumem_nb was loaded"
            return
        self._load_cell = in_cell
        self._up_at_start = False

    def cell_started(self, execution_count: int | None, raw: str = "") -> None:
        self._load_cell = False  # a cell began: the load was not inside one still running
        if self.started is not None:
            return
        self.arm()
        self._up_at_start = self.torch.initialized
        self._cell_thread = threading.get_ident()
        self._running = RunningCell(execution_count, raw, self._cell_thread)

    def load_cell_ended(self, execution_count: int | None) -> None:
        """The end of the cell that loaded the extension (no start was seen for it)."""
        if self._load_cell:
            self._load_cell = False
            self.cell_ended(execution_count)

    def cell_ended(self, execution_count: int | None) -> None:
        self._running = None
        if self.started is not None:
            return
        if not self._up_at_start and self.torch.initialized:
            with self._lock:
                if self.started is None:  # the hook did not see it
                    self.started = CudaStart(HOW_CELL, execution_count=execution_count)
                    self.status = "seen at a cell's end"
            return
        self.arm()  # torch was imported by this cell: queue for the next ones

    def line(self) -> str:
        return self.started.sentence() if self.started is not None else ""


def _frames(frame: FrameType | None) -> list[Frame]:
    """A stack as (file, line, function), innermost first, at most ``MAX_FRAMES``."""
    out: list[Frame] = []
    while frame is not None and len(out) < MAX_FRAMES:
        code = frame.f_code
        out.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    return out


def _pseudo(filename: str) -> bool:
    # Code a magic compiled from the cell's text: "<timed exec>", "<magic-timeit>".
    return filename.startswith("<") and filename.endswith(">")


@dataclass(frozen=True)
class _Place:
    """A frame read as a place in a cell: the cell's number, and the line as typed."""

    number: int
    line: int
    name: str
    code: str


def _cell_places(stack: list[Frame], cell_number: Any,
                 running: RunningCell | None) -> list[_Place]:
    """The frames of cells in ``stack`` (innermost first), each at its line as typed. A
    magic's body (a nested cell numbered past the running one, ``<timed exec>``) is read as
    the running cell's lines after that magic's."""
    raw_lines = running.raw.splitlines() if running is not None else []
    lead = next((i for i, ln in enumerate(raw_lines) if ln.strip()), 0)
    count = running.execution_count if running is not None else None
    numbers = [cell_number(filename) for filename, _, _ in stack]
    # The running cell's own code is its outermost frame. IPython 7 compiles a magic's body
    # under the running cell's number (8 and later, one past it), but never its file name.
    own = next((f for (f, _, _), n in zip(reversed(stack), reversed(numbers), strict=True)
                if count is not None and n == count), None)
    places: list[_Place | None] = []
    for (filename, lineno, name), number in zip(stack, numbers, strict=True):
        if number is not None and count is not None \
                and (number > count or (number == count and filename != own)):
            places.append(_Place(-1, lineno, name, ""))  # a body: placed below, if it can be
        elif number is not None:
            line, code = lineno, linecache.getline(filename, lineno).strip()
            if running is not None and number == running.execution_count:
                line = lineno + lead  # as the editor numbers it
                if 0 < line <= len(raw_lines):
                    code = raw_lines[line - 1].strip()
            places.append(_Place(number, line, name, code))
        elif _pseudo(filename) and running is not None:
            places.append(_Place(-1, lineno, name, ""))
        else:
            places.append(None)
    # Outermost first: a body's lines follow its magic's line, and the body's line stands
    # for the magic's (it is the line that ran).
    out: list[_Place] = []
    magic: _Place | None = None
    for place in reversed(places):
        if place is None:
            continue
        if place.number >= 0:
            magic = place if place.code.startswith("%") and running is not None \
                and place.number == running.execution_count else None
            out.append(place)
            continue
        if magic is None:
            continue  # code of unknown origin: not a place in any cell
        line = magic.line + place.line if magic.code.startswith("%%") else magic.line
        if 0 < line <= len(raw_lines):
            if out and out[-1] is magic:
                out.pop()
            out.append(_Place(magic.number, line, "<module>", raw_lines[line - 1].strip()))
        magic = None  # deeper code is the body's own
    out.reverse()
    return out  # innermost first again


def locate(frames: Iterable[Frame], cell_number: Any, thread: str = "", *,
           running: RunningCell | None = None, runner: list[Frame] | None = None,
           on_cell_thread: bool = True, in_cell: bool = True) -> CudaStart:
    """The start, from the stack at CUDA's initialisation (innermost frame first): the
    outermost place in a cell is the line the user ran. ``running``: the cell running then;
    ``runner``: its thread's stack when CUDA started on another thread; ``in_cell``: False
    when no cell was running (a widget's callback, a timer): a cell's function on the stack
    is then the way in, not a line anyone ran."""
    places = _cell_places(list(frames), cell_number, running)
    if not in_cell:
        return CudaStart(HOW_HOOK, via=_via(places[0]) if places else "", thread=thread)
    if not on_cell_thread:
        # This thread's cell frames are functions it runs, not the line the user ran: that is
        # where the cell's own thread is (if one is running), and the thread's code the way in.
        ran = _cell_places(runner or [], cell_number, running)
        ran = [p for p in ran if running is not None and p.number == running.execution_count]
        via = _via(places[0]) if places else ""
        if not ran:
            count = running.execution_count if running is not None else None
            return CudaStart(HOW_HOOK, execution_count=count, via=via, thread=thread)
        top = ran[-1]
        return CudaStart(HOW_HOOK, execution_count=top.number, line=top.line,
                         code=top.code[:120], via=via, thread=thread)
    if not places:
        return CudaStart(HOW_HOOK, thread=thread)
    top, inner = places[-1], places[0]
    # The innermost cell frame, when it is not that line: a function of some cell made the
    # first CUDA call ("f() in cell [2], line 4").
    via = _via(inner) if (inner.number, inner.line) != (top.number, top.line) else ""
    return CudaStart(HOW_HOOK, execution_count=top.number, line=top.line, code=top.code[:120],
                     via=via, thread=thread)


def _via(place: _Place) -> str:
    if place.name in ("<module>", "<lambda>") or place.name.startswith("<"):
        return f"cell [{place.number}], line {place.line}"
    return f"{place.name}() in cell [{place.number}], line {place.line}"


def launcher_refusal(exc: BaseException | None) -> Forker | None:
    """Which fork could not use CUDA because the kernel had initialised it, read from a cell's
    exception or what it chains to; None when it is not such an error."""
    chain = userexc.chain(exc, 8)
    for e in chain:
        if not _may_be_a_launchers(e):
            continue
        text = error_str(e)  # "" for an exception whose __str__ raises: no refusal
        for who, words in LAUNCHER_REFUSALS:
            # A launcher's own refusal begins with its words; torch's re-init error is quoted
            # inside the launcher's (the worker's traceback in its text).
            if text.lstrip().startswith(words) if who is not None else words in text:
                return who if who is not None else forker_of(chain)
    return None


def _may_be_a_launchers(e: BaseException) -> bool:
    """The launchers raise RuntimeError, ValueError or errors of their own (elastic's
    ChildFailedError, torch's ProcessRaisedException); a user's KeyError or AssertionError
    that merely quotes their words is not one."""
    return issubclass(type(e), (RuntimeError, ValueError)) or \
        userexc.class_module(type(e)) != "builtins"  # a metaclass cannot intercept it


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
