"""Safe cleanup: free what the user did not name as data, and say what each step freed.

Default steps: ``gc.collect()`` (garbage from before the cleanup, freed first so that every
later step is credited only with what it let go of), drop the shell's references to the
exception a cell raised (its frames keep every local tensor alive), then
``torch.cuda.empty_cache()`` if CUDA is already initialised. Each step is measured around
itself alone, and the rows add up to the total. Clearing the output cache (``Out``, ``_``,
``_N``) and deleting variables are opt-in, and a variable is only ever deleted when named.

What cleanup never does: change an object the user can reach. It drops references held by the
interpreter (``sys.last_*``) and by IPython's bookkeeping, and nothing else; it never clears a
frame, cuts a traceback or resets an exception's ``__traceback__``. Whatever the user still
holds (a saved exception, a generator a traceback ran through, a frame) stays whole, and the
report says who holds it. ``_`` and ``_N`` the user assigned are theirs, by IPython's own rule.

A Ctrl-C part-way is not swallowed: the caller gets the report of what was done until then
(``run``'s ``on_interrupt``), then the ``KeyboardInterrupt`` goes on.

Nothing here imports torch or IPython: the shell is used through the attributes every IPython
shell has, so a stand-in works too. The request and the report are in ``cleanupreport``; which
names are the user's, and the output cache, in ``cleanupnames``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from . import emptycache, userexc
from .cleanupnames import (
    _clear_output,
    _hidden,
    _out,
    _output_text,
    _plan_output,
    check_vars,
    shell_owned,
)
from .cleanupreport import UNKNOWN, CleanupReport, CleanupRequest, Measure, StepResult, _freed
from .holders import (
    CellException,
    Scanner,
    StoredException,
    cuda_bytes,
    exception_chain,
    frame_is_live,
    frames_of,
    is_function_frame,
    last_value,
    running_frame_ids,
    stored_cell_exception,
    traceback_links,
)
from .holders.keepers import keepers
from .holders.retention import (
    ROOT_SHELL,
    ROOT_THREAD,
    ROOT_VARIABLE,
    Root,
    RootContext,
)
from .ledger import ledgers_of
from .model import Sample
from .sources.torch.debug import TorchDebug
from .sources.torch.source import TorchSource
from .whatif.config import BACKEND_ASYNC, SettingError, parse_settings

__all__ = [
    "CleanupReport",
    "CleanupRequest",
    "Measure",
    "StepResult",
    "allocator_segments",
    "check_vars",
    "run",
    "shell_owned",
]

_LAST = ("last_exc", "last_type", "last_value", "last_traceback")
# Climbing referrers to find who holds a stored exception: rounds, and objects per round.
# The search for who else keeps a stored exception, at most this long.
_HELD_BUDGET_S = 0.5
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# -- the stored exception ----------------------------------------------------------------------
@dataclass(frozen=True)
class _ExceptionPlan:
    stored: StoredException | None
    frames: int  # finished function frames in its tracebacks
    held_by: list[str]  # who else keeps it alive (then dropping frees nothing)
    foreign: str  # a non-cell exception in sys.last_value, left alone


def _plan_exception(shell: Any, noted: CellException | None, *, find_holders: bool = True,
                    collected: bool = False) -> _ExceptionPlan:
    stored = stored_cell_exception(shell, noted)
    last = last_value()
    foreign = ""
    if isinstance(last, BaseException) and (stored is None or last is not stored.error):
        links = traceback_links([last])
        where = f" in {links[-1].tb_frame.f_code.co_name}()" if links else ""
        foreign = (f"left alone: the last exception, a {userexc.type_name(last)}{where}, "
                   "was not raised by a cell's code")
    if stored is None:
        return _ExceptionPlan(None, 0, [], foreign)
    running = running_frame_ids()
    frames = frames_of(traceback_links(exception_chain(stored.error)))
    count = sum(1 for f, links in frames.values()
                if is_function_frame(f) and not frame_is_live(f, running, links))
    held: list[str] = []
    try:
        if find_holders:
            held = _held_elsewhere(stored, shell, noted, collect=not collected)
    except Exception as e:  # a hostile referrer: say so rather than claim it was freed
        held = [f"something the check could not name ({userexc.type_name(e)})"]
    return _ExceptionPlan(stored, count, held, foreign)


_CUT_WORDS = "other objects "


def _held_elsewhere(stored: StoredException, shell: Any, noted: CellException | None,
                    collect: bool = True) -> list[str]:
    """Who, besides the interpreter's and the shell's records, keeps ``exc``, its tracebacks
    or their finished frames alive: the retention search (``holders/retention.py``) from
    those objects up to the roots a user would recognise (a variable, a module's global, a
    class attribute, a live thread, the output cache), the records cleanup drops passed over.
    Read-only: it only asks the garbage collector. Objects only the exception's own graph
    reaches (IPython's ``run_code`` frame keeps that cell's ExecutionResult, which keeps the
    exception) reach no root, and hold nothing. Unreachable cycles are collected first:
    IPython's traceback formatter leaves frames in cyclic garbage (stack_data's FrameInfo),
    which would otherwise be searched through; collecting frees only what nothing can reach.
    Cleanup's own first step has just collected (``collect=False``): a second full collection
    cost as much again, 0.9 s at 5,000,000 objects (reliability 2026-12-05 A3).
    """
    if collect:
        gc.collect()
    running = running_frame_ids()
    excs = exception_chain(stored.error)
    tbs = traceback_links(excs)
    frames = list({id(tb.tb_frame): tb.tb_frame for tb in tbs}.values())
    finished = [f for f in frames if not frame_is_live(f, running)]
    group: list[object] = [*excs, *tbs, *finished]
    ignore: set[int] = {id(vars(sys))}
    for e in excs:  # what each exception owns
        ignore |= {id(part) for part in userexc.parts(e)}
    # Python <= 3.12 keeps a snapshot dict of a read frame's locals on the frame itself.
    ignore |= {id(f.f_locals) for f in finished if is_function_frame(f)}
    for keeper in (getattr(shell, "last_execution_result", None),
                   getattr(shell, "InteractiveTB", None), noted, stored):
        if keeper is not None:
            ignore |= {id(keeper), id(getattr(keeper, "__dict__", None))}
    ns = getattr(shell, "user_ns", None)
    found = keepers(group, RootContext(user_ns=ns if isinstance(ns, dict) else None,
                                       shell=shell),
                    ignore=ignore, budget_s=_HELD_BUDGET_S)
    held: list[str] = []
    if found.cut:
        held.append(f"{_CUT_WORDS}(the search stopped there: {found.cut})")
    for root in found.roots:
        name = _holder_words(root)
        if name not in held:
            held.append(name)
    return held


def _holder_words(root: Root) -> str:
    """A root as the cleanup report says who keeps an exception."""
    if root.kind == ROOT_VARIABLE:
        return f"your variable {root.name}"
    if root.kind == ROOT_SHELL:
        return "IPython's shell"
    if root.kind == ROOT_THREAD:
        return root.name
    return f"{root.name} ({root.kind})"


def _drop_exception(exc: BaseException, shell: Any, noted: CellException | None) -> None:
    """Drop the interpreter's and the shell's references to ``exc``, and only those."""
    links = {id(tb) for tb in traceback_links(exception_chain(exc))}
    if last_value() is exc or id(getattr(sys, "last_traceback", None)) in links:
        # Deleted, not set to None: %debug then says there is no traceback, as in a fresh
        # session, instead of failing on a None.
        for name in _LAST:
            if hasattr(sys, name):
                delattr(sys, name)
    result = getattr(shell, "last_execution_result", None)
    if result is not None and getattr(result, "error_in_exec", None) is exc:
        result.error_in_exec = None
    itb = getattr(shell, "InteractiveTB", None)
    if itb is not None and id(getattr(itb, "tb", None)) in links:
        itb.tb = None
    if noted is not None and noted.error is exc:
        noted.release()


def _exception_text(plan: _ExceptionPlan, dry_run: bool) -> str:
    parts: list[str] = []
    stored = plan.stored
    if stored is None:
        parts.append("no stored exception from a cell")
    else:
        cell = (f"cell [{stored.execution_count}]" if stored.execution_count is not None
                else "a cell")
        what = f"the stored {userexc.type_name(stored.error)} of {cell}"
        parts.append(("would drop " if dry_run else "dropped ") + what)
        cut = [h for h in plan.held_by if h.startswith(_CUT_WORDS)]
        roots = [h for h in plan.held_by if not h.startswith(_CUT_WORDS)]
        if roots:
            parts.append("its frames stay alive, held by " + ", ".join(roots)
                         + (" and maybe more" if cut else ""))
        elif cut:
            # Nothing found keeping them, but the search did not finish: not known either way.
            why = cut[0].removeprefix(_CUT_WORDS).strip(" ()").split(": ", 1)[-1]
            parts.append(f"not checked whether anything else keeps its frames alive ({why})")
        elif plan.frames:
            verb = "frees" if dry_run else "freed"
            parts[-1] += f" ({verb} the locals of {plan.frames} "
            parts[-1] += f"frame{'s' if plan.frames != 1 else ''})"
    if plan.foreign:
        parts.append(plan.foreign)
    return "; ".join(parts)


# -- running the steps -------------------------------------------------------------------------
def run(
    request: CleanupRequest,
    *,
    shell: Any,
    measure: Callable[[], Sample],
    cell_exception: CellException | None = None,
    modules: Mapping[str, ModuleType] | None = None,
    on_interrupt: Callable[[CleanupReport], None] | None = None,
) -> CleanupReport:
    """Run (or estimate, with ``dry_run``) the requested steps, measuring after each. A
    Ctrl-C that stops a run once it changed anything is re-raised after ``on_interrupt`` got
    the report of what was done until then (``_run``)."""
    names = check_vars(request.delete_vars, shell)
    mods = sys.modules if modules is None else modules
    failures: list[str] = []

    def note(e: Exception) -> None:
        if not failures:
            failures.append(f"{type(e).__name__}: {e}")

    def sampled() -> Sample | None:
        try:
            return measure()
        except Exception as e:
            note(e)
            return None

    def measured(sample: Sample | None) -> Measure:
        # Junk from a source (a stats dict with "num_ooms": "many") must not stop a cleanup:
        # its figures are then unknown, and the report says so once.
        if sample is None:
            return UNKNOWN
        try:
            return Measure.of(sample)
        except Exception as e:
            note(e)
            return UNKNOWN

    def read() -> Measure:
        return measured(sampled())

    if request.dry_run:
        # The sample itself, not only its totals: the estimate of empty_cache is per device.
        sample = request.reuse_sample if request.reuse_sample is not None else sampled()
        report = _estimate(request, names, shell, cell_exception, measured(sample), mods,
                           sample)
    else:
        report = _run(request, names, shell, cell_exception, read(), mods, read,
                      on_interrupt)
    if failures:
        row = StepResult("measure", f"figures unknown: reading memory failed ({failures[0]})")
        report = CleanupReport(steps=(*report.steps, row), before=report.before,
                               after=report.after, dry_run=report.dry_run)
    return report


@dataclass
class _Progress:
    """The step under way, for the report of a run a Ctrl-C stops: what it was changing,
    what it had changed (``done``, asked at the interrupt), and whether its row is in."""

    step: str = ""
    doing: str = ""
    done: Callable[[], str] = lambda: ""
    finished: bool = False

    def begin(self, step: str, doing: str = "", done: Callable[[], str] = lambda: "") -> None:
        self.step, self.doing, self.done, self.finished = step, doing, done, False

    def finish(self) -> None:
        self.finished = True

    def where(self) -> str:
        if not self.step:
            return "before its first step"
        return f"{'after' if self.finished else 'in'} its {self.step} step"

    def row(self) -> StepResult:
        done = self.done()
        if done:
            return StepResult(self.step, f"{done}; interrupted (Ctrl-C) before it was measured")
        if self.doing:
            return StepResult(self.step, f"interrupted (Ctrl-C) while {self.doing}")
        return StepResult(self.step, "interrupted (Ctrl-C) before it changed anything")


def _deleted_words(names: Sequence[str], shell: Any) -> str:
    """Which of ``names`` are deleted, read from the namespace itself: a Ctrl-C delivered
    right after a ``pop`` must not lose the record of a variable it deleted."""
    ns = shell.user_ns
    gone = [n for n in names if n not in ns]
    kept = [n for n in names if n in ns]
    if not gone:
        return ""
    return "deleted " + ", ".join(gone) + (f"; kept {', '.join(kept)}" if kept else "")


def _run(request: CleanupRequest, names: list[str], shell: Any,
         noted: CellException | None, first: Measure, mods: Mapping[str, ModuleType],
         read: Callable[[], Measure],
         on_interrupt: Callable[[CleanupReport], None] | None = None) -> CleanupReport:
    steps: list[StepResult] = []
    prev = first
    now = _Progress()

    def record(step: str, did: str, *, collect: bool = True) -> None:
        """Measure after a step. Released objects often sit in reference cycles (frames and
        exceptions point at each other), so a step collects what it released before measuring;
        the garbage that was there before went in the first step, so the report credits the
        step that actually let go."""
        nonlocal prev
        now.done = lambda: did  # done, if not yet measured
        if collect:
            gc.collect()
        after = read()
        steps.append(StepResult(
            step, did,
            _freed(prev.allocated_bytes, after.allocated_bytes),
            _freed(prev.reserved_bytes, after.reserved_bytes),
            _freed(prev.nvml_used_bytes, after.nvml_used_bytes),
            _freed(prev.rss_bytes, after.rss_bytes),
        ))
        prev = after
        now.finish()

    try:
        _steps(request, names, shell, noted, mods, steps, now, record)
    except KeyboardInterrupt:
        # A Ctrl-C lands in a C call (empty_cache) or at the gc.collect after a step, where a
        # pending one is delivered: what was done until then is reported, then the interrupt
        # goes on. Before, the cell showed only the traceback, after two variables were
        # deleted, Out cleared and 12 MiB freed.
        if now.step and not now.finished:
            steps.append(now.row())
        report = CleanupReport(steps=tuple(steps), before=first, after=prev,
                               interrupted=now.where())
        if on_interrupt is not None:
            with contextlib.suppress(Exception):  # a failed display must not replace it
                on_interrupt(report)
        raise
    return CleanupReport(steps=tuple(steps), before=first, after=prev)


def _steps(request: CleanupRequest, names: list[str], shell: Any,
           noted: CellException | None, mods: Mapping[str, ModuleType], steps: list[StepResult],
           now: _Progress, record: Callable[..., None]) -> None:
    """The steps in order, each begun on ``now`` before it changes anything."""
    # First, on its own: what was garbage already (a frame cycle a caught exception left, a
    # replaced traceback). Collected inside the next step, it was credited to that step: 17 GiB
    # to an exception that held nothing, in tutorial 04 on the H200.
    now.begin("gc.collect", "collecting what was garbage already")
    collected = gc.collect()
    record("gc.collect", f"collected {collected} unreachable objects that were garbage "
                         "already", collect=False)
    if request.clear_traceback:
        now.begin("last exception")
        plan = _plan_exception(shell, noted, collected=True)  # the step above collected
        text = _exception_text(plan, dry_run=False)
        if plan.stored is not None:
            now.doing = "dropping the stored exception"
            _drop_exception(plan.stored.error, shell, noted)
            now.done = lambda: text
        elif noted is not None:
            noted.release()  # only the monitor's own note was left: let go of it
        del plan  # the plan holds the exception: let the step's collect free it
        record("last exception", text)
    if request.clear_output:
        now.begin("output cache")
        out = _plan_output(shell)
        if out is None:
            steps.append(StepResult("output cache", "the output cache is off; nothing to clear"))
            now.finish()
        else:
            now.doing = "clearing Out"
            _clear_output(shell, out)
            cleared = _output_text(out, dry_run=False)
            now.done = lambda: cleared
            record("output cache", cleared)
    if names:
        now.begin("variables", done=lambda: _deleted_words(names, shell))
        for name in names:
            shell.user_ns.pop(name, None)
        record("variables", "deleted " + ", ".join(names))
    now.begin("empty_cache", "returning unused cached blocks to the driver")
    try:
        emptied = TorchSource(mods).empty_cache()
    except Exception as e:
        steps.append(StepResult("empty_cache", f"failed: {type(e).__name__}: {e}"))
        now.finish()
    else:
        if emptied:
            record("empty_cache", "returned unused cached blocks to the driver", collect=False)
        else:
            steps.append(StepResult("empty_cache", "skipped: CUDA is not initialized"))
            now.finish()


def _estimate(request: CleanupRequest, names: list[str], shell: Any,
              noted: CellException | None, first: Measure,
              mods: Mapping[str, ModuleType], sample: Sample | None) -> CleanupReport:
    plan = _plan_exception(shell, noted, find_holders=request.find_holders)
    stored = [plan.stored.error] if plan.stored is not None else []
    holders = request.reuse_holders
    if holders is None:
        scanner = Scanner(mods) if request.graph_budget_s is None else \
            Scanner(mods, graph_budget_s=request.graph_budget_s)
        holders = scanner.scan(shell.user_ns, output_cache=_out(shell),
                               last_exception=stored, hidden=_hidden(shell))
    steps: list[StepResult] = [
        StepResult("gc.collect", "would collect what is garbage already (size unknown)")]
    if request.clear_traceback:
        # A search cut by its budget found no keeper: the estimate is what dropping it frees.
        kept = any(not h.startswith(_CUT_WORDS) for h in plan.held_by)
        held = 0 if kept else cuda_bytes(h for h in holders if h.kind == "traceback")
        steps.append(StepResult("last exception", _exception_text(plan, dry_run=True),
                                freed_allocated_bytes=held))
    if request.clear_output:
        out = _plan_output(shell)
        if out is None:
            steps.append(StepResult("output cache", "the output cache is off; nothing to clear"))
        else:
            held = cuda_bytes(h for h in holders if h.kind == "output cache")
            steps.append(StepResult("output cache", _output_text(out, dry_run=True),
                                    freed_allocated_bytes=held))
    if names:
        named = set(names)
        held = cuda_bytes(h for h in holders if h.name in named)
        steps.append(StepResult("variables", "would delete " + ", ".join(names),
                                freed_allocated_bytes=held))
    cache = _cache_estimate(sample, mods)
    if cache is not None:
        steps.append(StepResult("empty_cache", cache.did(), freed_reserved_bytes=cache.nbytes,
                                brief=cache.brief()))
    return CleanupReport(steps=tuple(steps), before=first, after=first, dry_run=True,
                         ledgers=ledgers_of(sample, holders, allocator_segments(mods),
                                            request.pools))


def allocator_segments(mods: Mapping[str, ModuleType] | None = None) -> list[dict[str, Any]] | None:
    """The allocator's segments for the ledger's cuBLAS workspaces, or None: never starts
    CUDA, and under cudaMallocAsync there are none."""
    torch = TorchDebug(sys.modules if mods is None else mods)
    if not torch.initialized:
        return None
    try:
        return torch.segments_snapshot()[0]
    except Exception:
        return None


def _cache_estimate(sample: Sample | None,
                    mods: Mapping[str, ModuleType]) -> emptycache.CacheRelease | None:
    """What empty_cache would give back, by the backend's own rule (``emptycache``): from the
    allocator's segments when they can be read (about 0.06 ms on the H200, no history),
    else from one stats read per device."""
    torch = TorchDebug(mods)
    if sample is None or not torch.initialized:
        return None
    readings = {d.index: d.allocator for d in sample.devices if d.allocator is not None}
    info = torch.allocator_info()
    backend = info.backend if info is not None else "native"
    try:
        settings = parse_settings(info.conf if info is not None else "")
    except SettingError:
        settings = parse_settings("")
    segments = None
    if backend != BACKEND_ASYNC:
        segments, _ = torch.segments_snapshot()
    try:
        return emptycache.estimate(readings, backend=backend,
                                   expandable=settings.expandable_segments, segments=segments,
                                   large_page_bytes=settings.large_segment_size)
    except (TypeError, ValueError, AttributeError, OverflowError):  # segments of another shape
        return emptycache.estimate(readings, backend=backend,
                                   expandable=settings.expandable_segments, segments=None,
                                   large_page_bytes=settings.large_segment_size)
