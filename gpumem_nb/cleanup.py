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
shell has, so a stand-in works too.
"""

from __future__ import annotations

import contextlib
import gc
import html
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import emptycache, userexc
from .holders import (
    INPUT_ALIAS,
    OUTPUT_ALIAS,
    SHELL_NAMES,
    UNDERS,
    CellException,
    Scanner,
    StoredException,
    alias_order,
    cuda_bytes,
    exception_chain,
    frame_is_live,
    frames_of,
    is_function_frame,
    last_value,
    output_cache_names,
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
from .ledger import Ledger, PoolParts, ledgers_of
from .model import Holder, Sample
from .report import Shown, html_table, text_table
from .sources.torch.debug import TorchDebug
from .sources.torch.source import TorchSource
from .units import format_bytes
from .whatif.config import BACKEND_ASYNC, SettingError, parse_settings

_LAST = ("last_exc", "last_type", "last_value", "last_traceback")
# Climbing referrers to find who holds a stored exception: rounds, and objects per round.
# The search for who else keeps a stored exception, at most this long.
_HELD_BUDGET_S = 0.5
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Measure:
    allocated_bytes: int | None
    reserved_bytes: int | None
    nvml_used_bytes: int | None
    rss_bytes: int | None

    @classmethod
    def of(cls, sample: Sample) -> Measure:
        def total(values: Sequence[int | None]) -> int | None:
            known = [v for v in values if v is not None]
            return sum(known) if known else None

        return cls(
            allocated_bytes=total([d.allocator.allocated_bytes if d.allocator else None
                                   for d in sample.devices]),
            reserved_bytes=total([d.allocator.reserved_bytes if d.allocator else None
                                  for d in sample.devices]),
            nvml_used_bytes=total([d.nvml.used_bytes if d.nvml else None
                                   for d in sample.devices]),
            rss_bytes=sample.rss_bytes,
        )


UNKNOWN = Measure(None, None, None, None)


def _freed(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else before - after


@dataclass(frozen=True)
class StepResult:
    step: str
    did: str
    freed_allocated_bytes: int | None = None
    freed_reserved_bytes: int | None = None
    freed_nvml_bytes: int | None = None
    freed_rss_bytes: int | None = None
    brief: str = ""  # a dry run's estimate in a few words (the OOM explainer's line)


@dataclass(frozen=True)
class CleanupReport(Shown):
    steps: tuple[StepResult, ...]
    before: Measure
    after: Measure
    dry_run: bool = False
    # The dry run's split of each GPU's allocated bytes, from the same scan (ledger.py).
    ledgers: tuple[Ledger, ...] = ()
    # Where a Ctrl-C stopped the run ("in its empty_cache step"; "" when it ran to its end):
    # the rows are what was done until then, and the total runs to the last measurement.
    interrupted: str = ""

    HEADERS = ("step", "what it did", "allocated freed", "reserved freed", "NVML freed",
               "host RAM freed")

    def rows(self) -> list[list[str]]:
        rows = [
            [s.step, s.did, format_bytes(s.freed_allocated_bytes),
             format_bytes(s.freed_reserved_bytes), format_bytes(s.freed_nvml_bytes),
             format_bytes(s.freed_rss_bytes)]
            for s in self.steps
        ]
        if not self.dry_run:
            b, a = self.before, self.after
            rows.append(["total so far" if self.interrupted else "total", "",
                         format_bytes(_freed(b.allocated_bytes, a.allocated_bytes)),
                         format_bytes(_freed(b.reserved_bytes, a.reserved_bytes)),
                         format_bytes(_freed(b.nvml_used_bytes, a.nvml_used_bytes)),
                         format_bytes(_freed(b.rss_bytes, a.rss_bytes))])
        return rows

    @property
    def title(self) -> str:
        if self.dry_run:
            return "gpumem cleanup --dry-run: nothing was changed; estimates of what would go"
        if self.interrupted:
            return (f"gpumem cleanup: interrupted (Ctrl-C) {self.interrupted}; what each step "
                    "did and freed until then")
        return "gpumem cleanup: what each step freed"

    def __str__(self) -> str:
        return "\n".join([self.title, text_table(self.HEADERS, self.rows()),
                          *(x.line() for x in self.ledgers)])

    def _repr_html_(self) -> str:
        return html_table(self.HEADERS, self.rows(), caption=self.title) + "".join(
            f"<div>{html.escape(x.line())}</div>" for x in self.ledgers)

    @property
    def freed_nvml_bytes(self) -> int | None:
        return _freed(self.before.nvml_used_bytes, self.after.nvml_used_bytes)


@dataclass
class CleanupRequest:
    clear_traceback: bool = True
    clear_output: bool = False
    delete_vars: Sequence[str] = ()
    dry_run: bool = False
    # A dry run also says who else keeps the stored exception alive. That search collects
    # garbage and walks the heap's referrers (tenths of a second in a large session), so it
    # is asked for by the magic, not by the OOM explainer's in-cell estimate. A real run
    # always searches: its report must not claim memory it could not free.
    find_holders: bool = False
    # The OOM explainer's in-cell dry run hands over what it already read and scanned after
    # the failure: a second full read (NVML's process listing, on a thread) and a second scan
    # of the namespace were most of the time it added to the failing cell. Dry run only.
    reuse_sample: Sample | None = None
    reuse_holders: Sequence[Holder] | None = None
    graph_budget_s: float | None = None  # the dry run's scan: time for autograd graphs
    # Each GPU's private pools for the dry run's ledger (the OOM explainer's reading).
    pools: PoolParts | None = None


# -- naming variables ----------------------------------------------------------------------------
def _hidden(shell: Any) -> dict[str, Any]:
    hidden = getattr(shell, "user_ns_hidden", None)
    return hidden if isinstance(hidden, dict) else {}


def _out(shell: Any) -> dict[int, Any]:
    oh = shell.user_ns.get("_oh")
    return oh if isinstance(oh, dict) else {}


def shell_owned(name: str, shell: Any) -> str | None:
    """Why ``name`` is the shell's and not the user's, or None when it is the user's."""
    ns = shell.user_ns
    if name in SHELL_NAMES:
        return f"{SHELL_NAMES[name]}; deleting it would break the shell"
    hidden = _hidden(shell)
    hook = getattr(shell, "displayhook", None)
    if OUTPUT_ALIAS.match(name) and name in output_cache_names(
            {name: ns[name]}, _out(shell), hidden, hook):
        return "output cache; --out clears it"
    if name in hidden and hidden[name] is ns[name]:
        if INPUT_ALIAS.match(name):
            return "input history"
        return "own: set by the shell or an extension, not by you"
    return None


def check_vars(names: Sequence[str], shell: Any) -> list[str]:
    """The names to delete, each once, after refusing unknown names and the shell's own.
    Raises ValueError before anything is touched."""
    unique = list(dict.fromkeys(names))
    missing = [n for n in unique if n not in shell.user_ns]
    refused = [f"{n!r} is IPython's {why}" for n in unique if n not in missing
               and (why := shell_owned(n, shell)) is not None]
    problems = []
    if missing:
        problems.append(f"no variable named {', '.join(repr(m) for m in missing)} "
                        "in this session")
    problems += refused
    if problems:
        raise ValueError("; ".join(problems) + "; nothing was cleaned")
    return unique


# -- the output cache --------------------------------------------------------------------------
@dataclass(frozen=True)
class _OutputPlan:
    entries: int
    clear: list[str]  # `_`-names the cache wrote and still owns
    kept: list[str]  # `_`-names the user assigned


def _plan_output(shell: Any) -> _OutputPlan | None:
    hook = getattr(shell, "displayhook", None)
    if not getattr(hook, "do_full_cache", False):
        return None
    ns = shell.user_ns
    owned = output_cache_names(ns, _out(shell), _hidden(shell), hook)
    # Exact strs: a str subclass's `__hash__`/`__eq__` would run below (A4).
    aliases = [k for k in ns if type(k) is str and OUTPUT_ALIAS.match(k)]
    # A blank under is IPython's placeholder, whoever wrote it (``type is str``: a user's
    # object's own ``__eq__`` is never called).
    kept = [k for k in aliases if k not in owned
            and not (k in UNDERS and type(ns[k]) is str and ns[k] == "")]
    return _OutputPlan(entries=len(_out(shell)), clear=sorted(owned, key=alias_order),
                       kept=sorted(kept, key=alias_order))


def _clear_output(shell: Any, plan: _OutputPlan) -> None:
    """What ``displayhook.flush()`` does, minus its two faults: it deletes every ``_N`` and
    blanks ``_``, ``__``, ``___`` even when the user assigned them."""
    ns = shell.user_ns
    hidden = _hidden(shell)
    for name in plan.clear:
        if name in UNDERS:
            ns[name] = ""
        else:
            ns.pop(name, None)
    # The shell's own records of what it wrote: they would keep the old outputs alive.
    for key in [k for k in hidden if type(k) is str and OUTPUT_ALIAS.match(k)]:
        if key in UNDERS:
            hidden[key] = ""
        else:
            del hidden[key]
    hook = shell.displayhook
    for name in UNDERS:
        with contextlib.suppress(Exception):
            setattr(hook, name, "")
    _out(shell).clear()
    result = getattr(shell, "last_execution_result", None)
    if result is not None and getattr(result, "result", None) is not None:
        result.result = None


def _output_text(plan: _OutputPlan, dry_run: bool) -> str:
    verb, keep = ("would clear", "would keep") if dry_run else ("cleared", "kept")
    text = f"{verb} {plan.entries} Out entries"
    if plan.clear:
        text += f" and {', '.join(plan.clear)}"
    if plan.kept:
        text += f"; {keep} {', '.join(plan.kept)} (yours)"
    return text


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
    group: list[Any] = [*excs, *tbs, *finished]
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
    modules: Mapping[str, Any] | None = None,
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
         noted: CellException | None, first: Measure, mods: Mapping[str, Any],
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
           noted: CellException | None, mods: Mapping[str, Any], steps: list[StepResult],
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
              mods: Mapping[str, Any], sample: Sample | None) -> CleanupReport:
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


def allocator_segments(mods: Mapping[str, Any] | None = None) -> list[dict[str, Any]] | None:
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
                    mods: Mapping[str, Any]) -> emptycache.CacheRelease | None:
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

