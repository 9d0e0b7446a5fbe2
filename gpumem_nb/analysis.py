"""Pure functions over readings: per-cell records, exact peaks, re-run accumulation verdicts.

No threads, no I/O, no third-party imports: everything here is table-testable.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .model import (
    CAUSE_CACHE,
    CAUSE_LIVE_TENSORS,
    CAUSE_OUTSIDE,
    AllocatorReading,
    CellDevice,
    CellRecord,
    Sample,
    Verdict,
)

DEFAULT_THRESHOLD_BYTES = 16 << 20


@dataclass
class Watermark:
    """Highest values seen by the sampler while a cell runs, per device index."""

    nvml_used_bytes: dict[int, int] = field(default_factory=dict)
    allocated_bytes: dict[int, int] = field(default_factory=dict)
    # When the cell began: a sampler reading taken before it (delivered a moment late) is
    # not a reading of this cell.
    since_t_s: float = float("-inf")

    def update(self, sample: Sample) -> None:
        if sample.t_s < self.since_t_s:
            return
        for d in sample.devices:
            if d.nvml is not None and d.nvml.used_bytes is not None:
                prev = self.nvml_used_bytes.get(d.index, 0)
                self.nvml_used_bytes[d.index] = max(prev, d.nvml.used_bytes)
            if d.allocator is not None:
                prev = self.allocated_bytes.get(d.index, 0)
                self.allocated_bytes[d.index] = max(prev, d.allocator.allocated_bytes)


def cell_peak(
    before: AllocatorReading | None,
    after: AllocatorReading | None,
    sampled_max_bytes: int | None,
    *,
    reset_at_start: bool,
) -> tuple[int | None, bool]:
    """The allocator peak during a cell, and whether it is exact.

    The allocator keeps one process-wide peak per device. Without resetting it (the default,
    because users read it themselves) the cell's peak is still exact whenever the cell pushed
    that peak higher, or CUDA came up during the cell. Otherwise the best honest answer is a
    lower bound: the largest of the readings at either end and the sampler's readings.
    """
    if after is None:
        return None, False
    if reset_at_start or before is None:
        return after.peak_allocated_bytes, True
    if after.peak_allocated_bytes > before.peak_allocated_bytes:
        return after.peak_allocated_bytes, True
    lower = max(before.allocated_bytes, after.allocated_bytes, sampled_max_bytes or 0)
    if after.peak_allocated_bytes < before.peak_allocated_bytes:
        # The user reset the peak inside the cell: what followed the reset is known exactly.
        lower = max(lower, after.peak_allocated_bytes)
    return lower, False


def cell_devices(
    before: Sample, after: Sample, watermark: Watermark, *, reset_at_start: bool
) -> tuple[CellDevice, ...]:
    out = []
    # The hooks' "after" carries the sampler's latest NVML reading; taken before this cell
    # began (cells back to back), it is the previous state, not this cell's end.
    nvml_after_fresh = after.nvml_t_s is None or after.nvml_t_s >= before.t_s
    for a in after.devices:
        b = before.device(a.index)
        b_al = b.allocator if b else None
        b_nv = b.nvml if b else None
        a_al = a.allocator
        a_nv = a.nvml if nvml_after_fresh else None
        peak, exact = cell_peak(b_al, a_al, watermark.allocated_bytes.get(a.index),
                                reset_at_start=reset_at_start)
        used_b = b_nv.used_bytes if b_nv else None
        used_a = a_nv.used_bytes if a_nv else None
        during = [v for v in (used_a, watermark.nvml_used_bytes.get(a.index)) if v]
        known = [v for v in (used_b, *during) if v]
        out.append(
            CellDevice(
                index=a.index,
                allocated_before_bytes=b_al.allocated_bytes if b_al else (0 if a_al else None),
                allocated_after_bytes=a_al.allocated_bytes if a_al else None,
                reserved_before_bytes=b_al.reserved_bytes if b_al else (0 if a_al else None),
                reserved_after_bytes=a_al.reserved_bytes if a_al else None,
                peak_allocated_bytes=peak,
                peak_exact=exact,
                nvml_used_before_bytes=used_b,
                nvml_used_after_bytes=used_a,
                nvml_peak_bytes=max(known) if known else None,
                process_before_bytes=b_nv.process_bytes if b_nv else None,
                process_after_bytes=a_nv.process_bytes if a_nv else None,
                children_before_bytes=b_nv.children_bytes if b_nv else None,
                children_after_bytes=a_nv.children_bytes if a_nv else None,
                nvml_peak_measured=bool(during),
            )
        )
    return tuple(out)


def complete_nvml(record: CellRecord, sample: Sample | None) -> CellRecord:
    """The record with NVML's "after" figures from the first sampler reading taken after the
    cell ended, or unknown (None) when there is none: the hooks never call NVML (slow when
    idle, and it can hang), and the reading they hold at the cell's end may predate it."""
    devices = []
    for d in record.devices:
        if sample is None:
            devices.append(replace(d, nvml_used_after_bytes=None, process_after_bytes=None,
                                   children_after_bytes=None))
            continue
        s = sample.device(d.index)
        nv = s.nvml if s is not None else None
        if nv is None or nv.used_bytes is None:
            # Not in this reading: the hooks' figure predates the cell's end, so unknown.
            devices.append(replace(d, nvml_used_after_bytes=None, process_after_bytes=None))
            continue
        peaks = [v for v in (d.nvml_peak_bytes, nv.used_bytes) if v is not None]
        devices.append(replace(d, nvml_used_after_bytes=nv.used_bytes,
                               process_after_bytes=nv.process_bytes,
                               children_after_bytes=nv.children_bytes,
                               nvml_peak_bytes=max(peaks), nvml_peak_measured=True))
    return replace(record, devices=tuple(devices))


def build_record(
    *,
    execution_count: int | None,
    cell_key: str,
    source: str,
    before: Sample,
    after: Sample,
    watermark: Watermark,
    reset_at_start: bool,
    error: str = "",
) -> CellRecord:
    first = next((ln.strip() for ln in source.splitlines() if ln.strip()), "")
    return CellRecord(
        execution_count=execution_count,
        cell_key=cell_key,
        source_preview=first[:60],
        start_wall_s=before.wall_s,
        duration_s=max(after.t_s - before.t_s, 0.0),
        devices=cell_devices(before, after, watermark, reset_at_start=reset_at_start),
        rss_before_bytes=before.rss_bytes,
        rss_after_bytes=after.rss_bytes,
        raised=bool(error),
        error=error,
    )


def classify(dev: CellDevice, threshold_bytes: int) -> tuple[str, int] | None:
    """Why a device's memory grew across one cell, or None if it did not grow.

    Checked in order: tensors still alive (allocated grew), then the allocator's cache
    (reserved grew while allocated held), then memory PyTorch does not manage (this process's
    NVML usage grew while reserved held).
    """
    alloc = dev.allocated_delta_bytes
    if alloc is not None and alloc > threshold_bytes:
        return CAUSE_LIVE_TENSORS, alloc
    reserved = dev.reserved_delta_bytes
    if reserved is not None and reserved > threshold_bytes:
        return CAUSE_CACHE, reserved
    proc = dev.process_delta_bytes
    if proc is not None and proc > threshold_bytes:
        return CAUSE_OUTSIDE, proc
    if dev.allocated_after_bytes is None and proc is None:
        # No allocator and no per-process figure: the device total is all there is.
        used = dev.nvml_delta_bytes
        if used is not None and used > threshold_bytes:
            return CAUSE_OUTSIDE, used
    return None


@dataclass
class _CellRuns:
    runs: int = 0
    growing_reruns: int = 0  # consecutive re-runs that each left memory behind


class AccumulationTracker:
    """Flags a cell whose re-runs keep leaving memory behind.

    A cell's first run is allowed to create things. A run's growth is its own (after minus
    before, so other cells in between do not count). Once two re-runs in a row have each grown
    by more than the threshold, every further growing re-run is flagged, once per run.
    """

    def __init__(self, threshold_bytes: int = DEFAULT_THRESHOLD_BYTES) -> None:
        self.threshold_bytes = threshold_bytes
        self._cells: dict[str, _CellRuns] = {}

    def explained_by_allocator(self, record: CellRecord) -> bool:
        """Whether the allocator alone already shows growth past the threshold, so the
        verdict needs no NVML figure."""
        return any(
            (d.allocated_delta_bytes or 0) > self.threshold_bytes
            or (d.reserved_delta_bytes or 0) > self.threshold_bytes
            for d in record.devices)

    def runs(self, cell_key: str) -> int:
        c = self._cells.get(cell_key)
        return c.runs if c else 0

    def observe(self, record: CellRecord) -> Verdict | None:
        c = self._cells.setdefault(record.cell_key, _CellRuns())
        c.runs += 1
        grown = [
            (dev.index, found)
            for dev in record.devices
            if (found := classify(dev, self.threshold_bytes)) is not None
        ]
        if not grown:
            c.growing_reruns = 0
            return None
        if c.runs >= 2:
            c.growing_reruns += 1
        # A single growing re-run is normal: the allocator holds old and new tensors at once
        # while a variable is rebound, so the cache doubles once and then stays. Growth on two
        # re-runs in a row is accumulation. A cell that raised is flagged at once: its stored
        # traceback keeps every tensor local to its frames alive.
        if c.growing_reruns < 2 and not record.raised:
            return None
        index, (cause, growth) = max(grown, key=lambda g: g[1][1])
        return Verdict(
            cell_key=record.cell_key,
            execution_count=record.execution_count,
            runs=c.runs,
            device=index,
            growth_bytes=growth,
            cause=cause,
            raised=record.raised,
        )


# The holder texts and advice live in ``holdertext``; these names stay importable from here.
from .holdertext import (  # noqa: E402
    held_text,
    holder_action,
    holder_advice,
    top_holders,
    verdict_message,
)

__all__ = [
    "DEFAULT_THRESHOLD_BYTES",
    "AccumulationTracker",
    "Watermark",
    "build_record",
    "cell_devices",
    "cell_peak",
    "classify",
    "complete_nvml",
    "held_text",
    "holder_action",
    "holder_advice",
    "top_holders",
    "verdict_message",
]
