"""The per-cell history: bounded, tabular, exportable to pandas and CSV.

pandas is optional and imported here only, on demand.
"""

from __future__ import annotations

import csv
import io
import threading
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import safeio
from .model import CellDevice, CellRecord
from .report import Shown, html_table, text_table
from .units import format_bytes

__all__ = [
    "CHILDREN_HEADER",
    "COLUMNS",
    "DEFAULT_HISTORY_CELLS",
    "DISPLAY_HEADERS",
    "History",
    "HistoryTable",
    "display_headers",
    "display_rows",
    "flat_rows",
    "format_children",
    "format_nvml_peak",
    "format_peak",
    "has_children",
]

DEFAULT_HISTORY_CELLS = 10_000

# Columns of the flat export: one row per cell and device (a cell with no GPU gives one row).
COLUMNS = (
    "execution_count", "cell_key", "source", "start_wall_s", "duration_s", "raised", "error",
    "device", "allocated_before_bytes", "allocated_after_bytes", "allocated_delta_bytes",
    "reserved_before_bytes", "reserved_after_bytes", "reserved_delta_bytes",
    "peak_allocated_bytes", "peak_exact", "nvml_used_before_bytes", "nvml_used_after_bytes",
    "nvml_peak_bytes", "nvml_peak_measured", "process_before_bytes", "process_after_bytes",
    "rss_before_bytes", "rss_after_bytes", "children_before_bytes", "children_after_bytes",
)

DISPLAY_HEADERS = ("cell", "source", "time", "GPU", "allocated Δ", "reserved Δ", "peak",
                   "NVML Δ", "NVML peak", "host RAM Δ", "outcome")
# Shown only when some cell's devices had this kernel's child processes on them.
CHILDREN_HEADER = "children (NVML)"


def has_children(records: list[CellRecord]) -> bool:
    return any(d.children_after_bytes or d.children_before_bytes
               for r in records for d in r.devices)


def display_headers(children: bool = False) -> tuple[str, ...]:
    if not children:
        return DISPLAY_HEADERS
    return (*DISPLAY_HEADERS[:-1], CHILDREN_HEADER, DISPLAY_HEADERS[-1])


def format_children(d: CellDevice) -> str:
    """What the kernel's children held after the cell, and how that changed."""
    after = d.children_after_bytes
    if after is None:
        return "—"
    delta = after - (d.children_before_bytes or 0)
    return format_bytes(after) + (f" ({format_bytes(delta, signed=True)})" if delta else "")


def flat_rows(rec: CellRecord) -> Iterator[dict[str, Any]]:
    base: dict[str, Any] = {
        "execution_count": rec.execution_count, "cell_key": rec.cell_key,
        "source": rec.source_preview, "start_wall_s": rec.start_wall_s,
        "duration_s": rec.duration_s, "raised": rec.raised, "error": rec.error,
        "rss_before_bytes": rec.rss_before_bytes, "rss_after_bytes": rec.rss_after_bytes,
    }
    if not rec.devices:
        yield {c: base.get(c) for c in COLUMNS}
        return
    for d in rec.devices:
        row = dict(base)
        row.update({
            "device": d.index,
            "allocated_before_bytes": d.allocated_before_bytes,
            "allocated_after_bytes": d.allocated_after_bytes,
            "allocated_delta_bytes": d.allocated_delta_bytes,
            "reserved_before_bytes": d.reserved_before_bytes,
            "reserved_after_bytes": d.reserved_after_bytes,
            "reserved_delta_bytes": d.reserved_delta_bytes,
            "peak_allocated_bytes": d.peak_allocated_bytes,
            "peak_exact": d.peak_exact,
            "nvml_used_before_bytes": d.nvml_used_before_bytes,
            "nvml_used_after_bytes": d.nvml_used_after_bytes,
            "nvml_peak_bytes": d.nvml_peak_bytes,
            "nvml_peak_measured": d.nvml_peak_measured,
            "process_before_bytes": d.process_before_bytes,
            "process_after_bytes": d.process_after_bytes,
            "children_before_bytes": d.children_before_bytes,
            "children_after_bytes": d.children_after_bytes,
        })
        yield {c: row.get(c) for c in COLUMNS}


def format_nvml_peak(d: CellDevice) -> str:
    """NVML's peak during the cell; "≥" when no reading was taken during or after it (only
    the one at its start is known: a lower bound, not a measurement)."""
    text = format_bytes(d.nvml_peak_bytes)
    return text if d.nvml_peak_measured or d.nvml_peak_bytes is None else f"≥{text}"


def format_peak(d: CellDevice) -> str:
    text = format_bytes(d.peak_allocated_bytes)
    return text if d.peak_exact or d.peak_allocated_bytes is None else f"≥{text}"


def display_rows(rec: CellRecord, children: bool = False) -> list[list[str]]:
    """The record's table rows; ``children`` adds the column of ``display_headers(True)``."""
    label = f"[{rec.execution_count}]" if rec.execution_count is not None else rec.cell_key[:8]
    flag = "raised" if rec.raised else "ok"
    common = [label, rec.source_preview[:40], f"{rec.duration_s:.3f} s"]
    rss = format_bytes(rec.rss_delta_bytes, signed=True)
    if not rec.devices:
        return [[*common, "—", "—", "—", "—", "—", "—", rss, *(["—"] if children else []),
                 flag]]
    return [
        [*common, str(d.index), format_bytes(d.allocated_delta_bytes, signed=True),
         format_bytes(d.reserved_delta_bytes, signed=True), format_peak(d),
         format_bytes(d.nvml_delta_bytes, signed=True), format_nvml_peak(d), rss,
         *([format_children(d)] if children else []), flag]
        for d in rec.shown_devices()
    ]


class History:
    """The last ``capacity`` cell records; safe to read while cells append."""

    def __init__(self, capacity: int = DEFAULT_HISTORY_CELLS) -> None:
        self._records: deque[CellRecord] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def append(self, rec: CellRecord) -> None:
        with self._lock:
            self._records.append(rec)

    def replace(self, old: CellRecord, new: CellRecord) -> bool:
        """Swap a record for its completed version (NVML figures arrive after the cell)."""
        with self._lock:
            for i in range(len(self._records) - 1, -1, -1):
                if self._records[i] is old:
                    self._records[i] = new
                    return True
        return False

    def records(self, last: int | None = None) -> list[CellRecord]:
        with self._lock:
            data = list(self._records)
        return data if last is None else data[-last:] if last > 0 else []

    def last(self) -> CellRecord | None:
        """The newest record, without copying the history (the chart asks on every draw)."""
        with self._lock:
            return self._records[-1] if self._records else None

    def __len__(self) -> int:
        return len(self._records)

    def rows(self, last: int | None = None) -> list[dict[str, Any]]:
        return [row for rec in self.records(last) for row in flat_rows(rec)]

    def to_dataframe(self, last: int | None = None) -> Any:
        """One row per cell and GPU; of the ``last`` cells only, when given."""
        import pandas as pd

        return pd.DataFrame(self.rows(last), columns=list(COLUMNS))

    def to_csv(self, path: str | Path | None = None) -> str:
        """The CSV text; with ``path``, also written there (``OSError`` if refused)."""
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows(self.rows())
        text = buf.getvalue()
        if path is not None:
            # Atomic, and never through a link or into a FIFO or device (see safeio): the
            # user named a file to create, not whatever that name happens to point at.
            safeio.write_text_atomic(path, text)
        return text


class HistoryTable(Shown):
    """The last cells as a table, for ``%gpumem history``."""

    def __init__(self, records: list[CellRecord], total: int) -> None:
        self.records = records
        self.total = total

    @property
    def headers(self) -> tuple[str, ...]:
        return display_headers(has_children(self.records))

    def rows(self) -> list[list[str]]:
        children = has_children(self.records)
        return [row for rec in self.records for row in display_rows(rec, children)]

    @property
    def caption(self) -> str:
        if not self.records:
            return "No cells recorded yet: run a cell with the extension loaded."
        return (f"Last {len(self.records)} of {self.total} cells; Δ = after − before; "
                "peak = allocator peak during the cell (≥ marks a lower bound).")

    def __str__(self) -> str:
        if not self.records:
            return self.caption
        return self.caption + "\n" + text_table(self.headers, self.rows())

    def _repr_html_(self) -> str:
        if not self.records:
            return f"<div>{self.caption}</div>"
        return html_table(self.headers, self.rows(), caption=self.caption)
