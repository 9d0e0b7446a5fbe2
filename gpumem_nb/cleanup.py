"""Safe cleanup: free what the user did not name as data, and say what each step freed.

Default steps: drop the stored last exception (its frames keep every local tensor alive),
``gc.collect()``, then ``torch.cuda.empty_cache()`` if CUDA is already initialised. Clearing the
output cache (``Out``, ``_``, ``_N``) and deleting variables are opt-in, and a variable is only
ever deleted when named. Nothing here imports torch or IPython: the shell's pieces are passed in.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import types
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .holders import Scanner, cuda_bytes
from .model import Sample
from .report import html_table, text_table
from .sources.torch import TorchSource
from .units import format_bytes


class OutputCache(Protocol):
    """IPython's displayhook: ``flush()`` empties Out, ``_``, ``__``, ``___`` and ``_N``."""

    def flush(self) -> None: ...


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


@dataclass(frozen=True)
class CleanupReport:
    steps: tuple[StepResult, ...]
    before: Measure
    after: Measure
    dry_run: bool = False

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
            rows.append(["total", "", format_bytes(_freed(b.allocated_bytes, a.allocated_bytes)),
                         format_bytes(_freed(b.reserved_bytes, a.reserved_bytes)),
                         format_bytes(_freed(b.nvml_used_bytes, a.nvml_used_bytes)),
                         format_bytes(_freed(b.rss_bytes, a.rss_bytes))])
        return rows

    @property
    def title(self) -> str:
        if self.dry_run:
            return "gpumem cleanup --dry-run: nothing was changed; estimates of what would go"
        return "gpumem cleanup: what each step freed"

    def __str__(self) -> str:
        return self.title + "\n" + text_table(self.HEADERS, self.rows())

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        return html_table(self.HEADERS, self.rows(), caption=self.title)

    @property
    def freed_nvml_bytes(self) -> int | None:
        return _freed(self.before.nvml_used_bytes, self.after.nvml_used_bytes)


@dataclass
class CleanupRequest:
    clear_traceback: bool = True
    clear_output: bool = False
    delete_vars: Sequence[str] = ()
    dry_run: bool = False


def check_vars(names: Sequence[str], user_ns: Mapping[str, Any]) -> None:
    """Refuse unknown names before anything is touched."""
    missing = [n for n in names if n not in user_ns]
    if missing:
        raise ValueError(
            f"no variable named {', '.join(repr(m) for m in missing)} in this session; "
            "nothing was cleaned"
        )


def _clear_last_exception(stored: Sequence[Any]) -> str:
    """Release the frames of the stored exception and every tensor local to them.

    Dropping ``sys.last_*`` is not enough: IPython's last ExecutionResult and its traceback
    formatter keep the same traceback. Rather than hunt every holder, the traceback chain is
    cut and each finished function frame cleared, so whoever still holds the first link holds
    no locals.
    """
    kinds: list[str] = []
    tracebacks: list[types.TracebackType] = []
    for obj in stored:
        if isinstance(obj, types.TracebackType):
            tracebacks.append(obj)
        exc = obj if isinstance(obj, BaseException) else None
        while exc is not None:
            if exc.__traceback__ is not None:
                kinds.append(type(exc).__name__)
                tracebacks.append(exc.__traceback__)
                exc.__traceback__ = None
            exc = exc.__cause__ or exc.__context__
    frames = 0
    for tb in tracebacks:
        link: types.TracebackType | None = tb
        while link is not None:
            nxt = link.tb_next
            if link.tb_frame.f_code.co_name != "<module>":
                with contextlib.suppress(RuntimeError):  # a frame still running
                    link.tb_frame.clear()
                    frames += 1
            link.tb_next = None
            link = nxt
    for name in ("last_exc", "last_type", "last_value", "last_traceback"):
        if hasattr(sys, name):
            setattr(sys, name, None)
    if not tracebacks:
        return "no stored exception"
    what = ", ".join(dict.fromkeys(kinds)) or "traceback"
    return f"dropped the stored {what} ({frames} frames)"


def run(
    request: CleanupRequest,
    *,
    user_ns: MutableMapping[str, Any],
    output_cache: OutputCache | None,
    out_entries: Mapping[int, Any],
    measure: Callable[[], Sample],
    stored_exceptions: Sequence[Any] = (),
    modules: Mapping[str, Any] | None = None,
) -> CleanupReport:
    """Run (or estimate, with ``dry_run``) the requested steps, measuring after each."""
    check_vars(request.delete_vars, user_ns)
    mods = sys.modules if modules is None else modules
    first = Measure.of(measure())
    if request.dry_run:
        return _estimate(request, user_ns, out_entries, stored_exceptions, first, mods)

    steps: list[StepResult] = []
    prev = first

    def record(step: str, did: str, *, collect: bool = True) -> None:
        """Measure after a step. Released objects often sit in reference cycles (frames and
        exceptions point at each other), so a step collects what it released before measuring:
        the report then credits the step that actually let go."""
        nonlocal prev
        if collect:
            gc.collect()
        now = Measure.of(measure())
        steps.append(StepResult(
            step, did,
            _freed(prev.allocated_bytes, now.allocated_bytes),
            _freed(prev.reserved_bytes, now.reserved_bytes),
            _freed(prev.nvml_used_bytes, now.nvml_used_bytes),
            _freed(prev.rss_bytes, now.rss_bytes),
        ))
        prev = now

    if request.clear_traceback:
        record("last exception", _clear_last_exception(stored_exceptions))
    if request.clear_output and output_cache is not None:
        n = len(out_entries)
        output_cache.flush()
        record("output cache", f"cleared {n} Out entries and _, __, ___")
    if request.delete_vars:
        for name in request.delete_vars:
            del user_ns[name]
        record("variables", "deleted " + ", ".join(request.delete_vars))
    collected = gc.collect()
    record("gc.collect", f"collected {collected} other unreachable objects", collect=False)
    if TorchSource(mods).empty_cache():
        record("empty_cache", "returned unused cached blocks to the driver", collect=False)
    else:
        steps.append(StepResult("empty_cache", "skipped: CUDA is not initialised"))
    return CleanupReport(steps=tuple(steps), before=first, after=prev)


def _estimate(
    request: CleanupRequest,
    user_ns: Mapping[str, Any],
    out_entries: Mapping[int, Any],
    stored_exceptions: Sequence[Any],
    first: Measure,
    mods: Mapping[str, Any],
) -> CleanupReport:
    holders = Scanner(mods).scan(user_ns, output_cache=out_entries,
                                 last_exception=stored_exceptions)
    steps: list[StepResult] = []
    if request.clear_traceback:
        held = cuda_bytes(h for h in holders if h.kind == "traceback")
        steps.append(StepResult("last exception", "would drop the stored exception",
                                freed_allocated_bytes=held))
    if request.clear_output:
        held = cuda_bytes(h for h in holders if h.kind == "output cache")
        steps.append(StepResult("output cache", f"would clear {len(out_entries)} Out entries",
                                freed_allocated_bytes=held))
    if request.delete_vars:
        named = set(request.delete_vars)
        held = cuda_bytes(h for h in holders if h.name in named)
        steps.append(StepResult("variables", "would delete " + ", ".join(request.delete_vars),
                                freed_allocated_bytes=held))
    steps.append(StepResult("gc.collect", "would collect unreachable cycles (size unknown)"))
    if TorchSource(mods).initialized and first.reserved_bytes is not None:
        cache = first.reserved_bytes - (first.allocated_bytes or 0)
        steps.append(StepResult("empty_cache", "would return unused cached blocks (at most)",
                                freed_reserved_bytes=cache))
    return CleanupReport(steps=tuple(steps), before=first, after=first, dry_run=True)
