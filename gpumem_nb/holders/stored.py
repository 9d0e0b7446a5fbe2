"""The exception a user's cell raised and the shell still stores, and the finished frames its
traceback keeps alive, each read without running the exception's own code (``userexc``).

A stored exception keeps every frame its traceback ran through, and their locals: after an
OOM inside ``train()``, the batch and the activations stay on the GPU until the exception goes.
Live frames (running, or a suspended generator's) are never read: in Python <= 3.12 reading
``f_locals`` stores a snapshot on the frame that keeps its locals alive.
"""

from __future__ import annotations

import gc
import inspect
import sys
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .. import userexc
from ..cellnames import CellNames, is_cell_top
from .reading import running_frame_ids

__all__ = [
    "CellException",
    "StoredException",
    "cell_number",
    "exception_chain",
    "finished_frame_locals",
    "frame_is_live",
    "frames_of",
    "is_function_frame",
    "is_stored",
    "last_exception_objects",
    "last_value",
    "stored_cell_exception",
    "traceback_links",
]

_CHAIN_CAP = 100  # chained exceptions followed
_LINK_CAP = 10_000  # traceback links followed per exception
_GENERATOR_FLAGS = (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
                    | inspect.CO_ITERABLE_COROUTINE)


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception it chains to (cause, context, a group's members), read
    without running the exceptions' own code (``userexc``)."""
    return userexc.chain(exc, _CHAIN_CAP)


def traceback_links(excs: Iterable[BaseException | types.TracebackType | None],
                    ) -> list[types.TracebackType]:
    """Every traceback link of these exceptions (or tracebacks), each once."""
    out: list[types.TracebackType] = []
    seen: set[int] = set()
    for obj in excs:
        tb = userexc.traceback_of(obj) if userexc.is_exception(obj) else obj
        n = 0
        while isinstance(tb, types.TracebackType) and id(tb) not in seen and n < _LINK_CAP:
            seen.add(id(tb))
            out.append(tb)
            tb = tb.tb_next
            n += 1
    return out


def frame_is_live(frame: types.FrameType, running: set[int],
                  links: Iterable[types.TracebackType] | None = None) -> bool:
    """Running, or a suspended generator's or coroutine's: its locals are in use.

    Given the traceback ``links`` through the frame, it answers without searching the heap
    (the OOM explainer's in-cell estimate has tens of milliseconds): a generator's frame that
    the exception unwound stopped where a link says, and is finished; one that caught it and
    ran on may be suspended now, and counts as live. Every cell's traceback starts in IPython's
    ``run_code``, a coroutine that caught it, so the exact answer would cost a heap search on
    every look. Without ``links`` the owning generator is searched for.
    """
    if id(frame) in running:
        return True
    if not frame.f_code.co_flags & _GENERATOR_FLAGS:
        return False
    if links is not None:
        return all(frame.f_lasti != tb.tb_lasti for tb in links)
    for r in gc.get_referrers(frame):
        owner = (getattr(r, "gi_frame", None) if isinstance(r, types.GeneratorType) else
                 getattr(r, "cr_frame", None) if isinstance(r, types.CoroutineType) else
                 getattr(r, "ag_frame", None) if isinstance(r, types.AsyncGeneratorType) else
                 None)
        if owner is frame:
            return True
    return False


def frames_of(links: Iterable[types.TracebackType],
              ) -> dict[int, tuple[types.FrameType, list[types.TracebackType]]]:
    """Each frame of these traceback links once, with the links through it, in order."""
    out: dict[int, tuple[types.FrameType, list[types.TracebackType]]] = {}
    for tb in links:
        out.setdefault(id(tb.tb_frame), (tb.tb_frame, []))[1].append(tb)
    return out


def is_function_frame(frame: types.FrameType) -> bool:
    """A function's frame: a cell's (module-level) frame has the user namespace as its
    locals, and those are attributed to the variables themselves."""
    return bool(frame.f_code.co_flags & inspect.CO_OPTIMIZED)


def finished_frame_locals(
    objs: Iterable[BaseException | types.TracebackType | None],
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each finished frame's locals kept alive by a stored exception, labelled for the user."""
    objs = list(objs)
    excs: list[BaseException | types.TracebackType | None] = []
    for obj in objs:
        excs += exception_chain(obj) if userexc.is_exception(obj) else [obj]
    running = running_frame_ids()
    for frame, links in frames_of(traceback_links(excs)).values():
        if is_function_frame(frame) and not frame_is_live(frame, running, links):
            yield f"traceback: {frame.f_code.co_name}() locals", dict(frame.f_locals)


def last_value() -> Any:
    """The interpreter's last uncaught exception (``sys.last_exc`` from 3.12)."""
    exc = getattr(sys, "last_exc", None)
    return exc if exc is not None else getattr(sys, "last_value", None)


def is_stored(exc: BaseException, shell: Any) -> bool:
    """Whether the interpreter or the shell still keeps ``exc`` (or one of its tracebacks)."""
    links = {id(tb) for tb in traceback_links(exception_chain(exc))}
    result = getattr(shell, "last_execution_result", None)
    itb = getattr(shell, "InteractiveTB", None)
    return (getattr(sys, "last_value", None) is exc or getattr(sys, "last_exc", None) is exc
            or id(getattr(sys, "last_traceback", None)) in links
            or getattr(result, "error_in_exec", None) is exc
            or id(getattr(itb, "tb", None)) in links)


def cell_number(exc: BaseException, shell: Any) -> int | None:
    """The cell whose top-level code ``exc`` propagated through, by the file name IPython's
    compiler gave that cell; None for an exception no cell raised (a widget's message
    handler, run by the kernel between cells)."""
    names = CellNames.of(shell)
    for tb in traceback_links([exc]):
        code = tb.tb_frame.f_code
        if is_cell_top(code.co_name):
            number = names.number(code.co_filename)
            if number is not None:
                return number
    return None


class CellException:
    """The exception the user's latest failing cell raised, while the shell still keeps it.

    The monitor notes each top-level cell's ``error_in_exec``. A later cell that raised nothing
    keeps the note only while the shell still stores that exception, so the note never keeps
    an exception alive more than one cell longer than IPython would.
    """

    def __init__(self) -> None:
        self.execution_count: int | None = None
        self.error: BaseException | None = None

    def note(self, execution_count: int | None, result: Any, shell: Any) -> None:
        err = getattr(result, "error_in_exec", None)
        if isinstance(err, BaseException):
            self.execution_count, self.error = execution_count, err
        elif self.error is not None and not is_stored(self.error, shell):
            self.release()

    def release(self) -> None:
        self.execution_count, self.error = None, None


@dataclass(frozen=True)
class StoredException:
    error: BaseException
    execution_count: int | None


def stored_cell_exception(shell: Any, noted: CellException | None = None,
                          ) -> StoredException | None:
    """The exception a user's cell raised that the shell still stores, if any.

    ``sys.last_value`` is the interpreter's last uncaught exception, whoever raised it: a
    widget's message handler stores its own there between cells (plotly's trace-delta
    handler did). Only an exception the monitor saw a cell raise, or one whose
    traceback runs through a cell's top-level code, is the user's.
    """
    last = last_value()
    if isinstance(last, BaseException):
        if noted is not None and last is noted.error:
            return StoredException(last, noted.execution_count)
        number = cell_number(last, shell)
        if number is not None:
            return StoredException(last, number)
    if noted is not None and noted.error is not None and is_stored(noted.error, shell):
        return StoredException(noted.error, noted.execution_count)
    return None


def last_exception_objects(shell: Any = None, noted: CellException | None = None) -> list[Any]:
    """The user's stored cell exception as the scan takes it: a list of none or one."""
    stored = stored_cell_exception(shell, noted)
    return [stored.error] if stored is not None else []
