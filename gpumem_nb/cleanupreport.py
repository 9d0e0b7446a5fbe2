"""What a cleanup asks for (``CleanupRequest``) and what it says it did (``CleanupReport``):
each step's row, measured around that step alone, the rows adding up to the total.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from .ledger import Ledger, PoolParts
from .model import Holder, Sample
from .report import Shown, html_table, text_table
from .units import format_bytes

__all__ = ["UNKNOWN", "CleanupReport", "CleanupRequest", "Measure", "StepResult"]


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
