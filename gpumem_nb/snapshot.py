"""``gpumem_nb.snapshot()``: one reading of every source, ready to display.

In a notebook it renders as an HTML table; in a terminal (``python -m gpumem_nb``) as text.
Without a GPU it says so in one plain line and still shows host memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .model import STATUS_OK, DeviceSample, Sample, SourceStatus
from .report import html_lines, html_table, text_table
from .units import format_bytes

DEVICE_HEADERS = (
    "GPU",
    "NVML used / total",
    "this process",
    "allocated",
    "reserved",
    "peak allocated",
    "outside PyTorch",
    "other processes",
)


def device_row(d: DeviceSample) -> list[str]:
    nv = d.nvml
    al = d.allocator
    label = f"{d.index}"
    if nv is not None:
        label = f"{d.index}: {nv.name}" if nv.name else label
        if nv.status != STATUS_OK:
            return [label, f"{nv.status}: {nv.detail}"[:60], "—", "—", "—", "—", "—", "—"]
    used = "—" if nv is None else f"{format_bytes(nv.used_bytes)} / {format_bytes(nv.total_bytes)}"
    return [
        label,
        used,
        format_bytes(nv.process_bytes if nv else None),
        format_bytes(al.allocated_bytes) if al else "—",
        format_bytes(al.reserved_bytes) if al else "—",
        format_bytes(al.peak_allocated_bytes) if al else "—",
        format_bytes(d.outside_pytorch_bytes),
        format_bytes(nv.other_processes_bytes if nv else None),
    ]


def status_lines(status: SourceStatus, sample: Sample) -> list[str]:
    lines: list[str] = []
    if not status.has_gpu:
        lines.append(f"No GPU visible: {status.nvml}. Showing host memory only.")
    elif status.torch != "replay":
        lines.append(f"torch: {status.torch}.")
        if status.allocator is not None:
            conf = status.allocator.conf or "defaults"
            lines.append(f"allocator: {status.allocator.backend} ({conf}).")
    lines.extend(status.notes)
    lines.append(f"Host RAM of this process: {format_bytes(sample.rss_bytes)}.")
    return lines


@dataclass(frozen=True)
class Snapshot:
    status: SourceStatus
    sample: Sample

    def rows(self) -> list[list[str]]:
        return [device_row(d) for d in self.sample.devices]

    def __str__(self) -> str:
        parts = []
        if self.sample.devices:
            parts.append(text_table(DEVICE_HEADERS, self.rows()))
        parts.extend(status_lines(self.status, self.sample))
        return "\n".join(parts)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        table = html_table(DEVICE_HEADERS, self.rows()) if self.sample.devices else ""
        return table + html_lines(status_lines(self.status, self.sample))


def take(source: Any = None) -> Snapshot:
    """Read every source once. ``source`` defaults to a fresh live source."""
    if source is None:
        from .sources.live import LiveSource

        source = LiveSource()
        try:
            return Snapshot(status=source.status(), sample=source.read())
        finally:
            source.close()
    return Snapshot(status=source.status(), sample=source.read())
