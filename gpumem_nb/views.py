"""Result objects the magics and ``gpumem_nb.snapshot()`` display or return.

Each renders as text and as HTML through ``report``. Kept in one module named ``views`` so that
no submodule is named after a public function: ``gpumem_nb.snapshot`` once was both, and the
import system replaced the function with the module as soon as the extension loaded.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .analysis import held_text
from .ledger import Ledger
from .model import STATUS_NO_NVML, STATUS_OK, CellRecord, DeviceSample, Holder, Sample, SourceStatus
from .records import DISPLAY_HEADERS, display_rows, format_nvml_peak
from .report import Shown, html_lines, html_table, text_table
from .settings import Config
from .units import format_bytes, shown_name

__all__ = [
    "DEVICE_HEADERS",
    "TAKE_WAIT_S",
    "CellReport",
    "ConfigView",
    "Snapshot",
    "WhoReport",
    "children_html",
    "children_lines",
    "device_row",
    "status_lines",
    "take",
]


# ------------------------------------------------------------------------------------------
class CellReport(Shown):
    """What ``%%gpumem`` measured; ``-o`` returns this."""

    def __init__(self, record: CellRecord) -> None:
        self.record = record

    @property
    def peak_allocated_bytes(self) -> int | None:
        return self.record.devices[0].peak_allocated_bytes if self.record.devices else None

    def line(self) -> str:
        r = self.record
        parts = [f"gpumem: {r.duration_s * 1e3:.1f} ms"]
        for d in r.shown_devices():
            exact = "exact" if d.peak_exact else "lower bound"
            parts.append(
                f"GPU {d.index}: peak {format_bytes(d.peak_allocated_bytes)} ({exact}), "
                f"allocated {format_bytes(d.allocated_delta_bytes, signed=True)}, "
                f"reserved {format_bytes(d.reserved_delta_bytes, signed=True)}, "
                f"NVML peak {format_nvml_peak(d)}"
            )
        parts.append(f"host RAM {format_bytes(r.rss_delta_bytes, signed=True)}")
        return " · ".join(parts)

    def __str__(self) -> str:
        return self.line()

    def _repr_html_(self) -> str:
        return html_table(DISPLAY_HEADERS, display_rows(self.record))


class WhoReport(Shown):
    HEADERS = ("holder", "kind", "device", "bytes", "detail")

    def __init__(self, holders: Sequence[Holder], total: int,
                 ledgers: Sequence[Ledger] = ()) -> None:
        self.holders = list(holders)
        self.total = total
        # Each GPU's allocated bytes split among all holders (not only those shown).
        self.ledgers = list(ledgers)

    def rows(self) -> list[list[str]]:
        return [[h.label, h.kind, h.device, held_text(h), h.detail] for h in self.holders]

    @property
    def caption(self) -> str:
        if not self.total:
            return "No tensors or arrays are held by your variables, Out or a traceback."
        text = f"Largest {len(self.holders)} of {self.total} holders of memory, largest first"
        if any(h.graph_bytes for h in self.holders):
            text += ("; a graph's bytes are the tensors it saved for backward that nothing "
                     "listed above it holds")
        return text + "."

    def __str__(self) -> str:
        lines = [x.line() for x in self.ledgers]
        if not self.holders:
            return "\n".join([self.caption, *lines])
        return "\n".join([self.caption, text_table(self.HEADERS, self.rows()), *lines])

    def _repr_html_(self) -> str:
        lines = "".join(f"<div>{html.escape(x.line())}</div>" for x in self.ledgers)
        if not self.holders:
            return f"<div>{self.caption}</div>" + lines
        return html_table(self.HEADERS, self.rows(), caption=self.caption) + lines


class ConfigView(Shown):
    def __init__(self, cfg: Config, running: bool) -> None:
        self.rows = [
            ["interval", f"{cfg.interval_s:g} s" + ("" if running else " (sampler stopped)")],
            ["device", "all" if cfg.device is None else str(cfg.device)],
            ["threshold", format_bytes(cfg.threshold_bytes)],
            ["peak", cfg.peak],
            ["auto-show", "on" if cfg.auto_show else "off"],
        ]

    def __str__(self) -> str:
        return text_table(("setting", "value"), self.rows)

    def _repr_html_(self) -> str:
        return html_table(("setting", "value"), self.rows)


# ------------------------------------------------------------------------------------------
DEVICE_HEADERS = (
    "GPU",
    "NVML used / total",
    "this process",
    "allocated",
    "reserved",
    "peak allocated",
    "outside PyTorch",
    "other processes",
    "this kernel's children",
)


def device_row(d: DeviceSample) -> list[str]:
    nv = d.nvml
    al = d.allocator
    label = f"{d.index}"
    if nv is not None:
        label = f"{d.index}: {shown_name(nv.name)}" if nv.name else label
        if nv.status not in (STATUS_OK, STATUS_NO_NVML):
            return [label, f"{nv.status}: {nv.detail}"[:60], *["—"] * (len(DEVICE_HEADERS) - 2)]
    if nv is None:
        used = "—"
    elif nv.status == STATUS_NO_NVML:
        used = "unknown (no NVML)"  # the reason is in the status lines below the table
    else:
        used = f"{format_bytes(nv.used_bytes)} / {format_bytes(nv.total_bytes)}"
    return [
        label,
        used,
        format_bytes(nv.process_bytes if nv else None),
        format_bytes(al.allocated_bytes) if al else "—",
        format_bytes(al.reserved_bytes) if al else "—",
        format_bytes(al.peak_allocated_bytes) if al else "—",
        format_bytes(d.outside_pytorch_bytes),
        format_bytes(nv.other_processes_bytes if nv else None),
        format_bytes(nv.children_bytes if nv else None),
    ]


def children_lines(sample: Sample) -> list[str]:
    """One line per child process of this kernel that holds GPU memory, per device."""
    lines: list[str] = []
    for d in sample.devices:
        nv = d.nvml
        if nv is None or not nv.children:
            continue
        where = f"GPU {d.index}"
        lines.append(f"This kernel's children on {where} hold {format_bytes(nv.children_bytes)}"
                     " (each has a CUDA context of its own):")
        lines.extend(f"  {c.label}: {format_bytes(c.nbytes)}"
                     + (f" — {c.cmdline}" if c.cmdline else "") for c in nv.children)
    return lines


def children_html(sample: Sample) -> str:
    """``children_lines`` for the chart's header; "" when this kernel has none on a GPU."""
    lines = children_lines(sample)
    return f"<div class='gpumem-children'>{html_lines(lines)}</div>" if lines else ""


def status_lines(status: SourceStatus, sample: Sample) -> list[str]:
    lines: list[str] = []
    if not status.has_gpu:
        lines.append(f"No GPU visible: {status.nvml}. Showing host memory only.")
    elif status.torch != "replay":
        lines.append(f"torch: {status.torch}.")
        if status.allocator is not None:
            conf = status.allocator.conf or "defaults"
            lines.append(f"allocator: {status.allocator.backend} ({conf}).")
    lines.extend(children_lines(sample))
    lines.extend(status.notes)
    if status.torch == "replay":  # the recorded process's, not this kernel's
        lines.append(f"Host RAM of the recorded process: {format_bytes(sample.rss_bytes)} "
                     "(the recording's).")
    else:
        lines.append(f"Host RAM of this process: {format_bytes(sample.rss_bytes)}.")
    return lines


@dataclass(frozen=True)
class Snapshot(Shown):
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

    def _repr_html_(self) -> str:
        table = html_table(DEVICE_HEADERS, self.rows()) if self.sample.devices else ""
        return table + html_lines(status_lines(self.status, self.sample))


# How long ``snapshot()`` waits for a fresh live source (its nvmlInit, then its reading).
TAKE_WAIT_S = 2.0


def take(source: Any = None, wait_s: float = TAKE_WAIT_S) -> Snapshot:
    """Read every source once. ``source`` defaults to a fresh live source, read on a helper
    thread under the process's read gate and waited on ``wait_s`` at most: a wedged driver's
    nvmlInit or memory query never returns, and ``gpumem_nb.snapshot()`` in a cell used to
    hang it for good. Then NVML's figures are unknown and the status says why."""
    if source is not None:
        return Snapshot(status=source.status(), sample=source.read())
    import threading
    import time

    from .sources import gate
    from .sources.live import LiveSource

    live = gate.LIVE
    if not live.enter(wait_s=wait_s):
        hung = live.hung_s()
        return _unanswered("a reading of the GPUs has not returned"
                           + (f" for {hung:.1f} s" if hung is not None else "")
                           + " (NVML hangs)")
    box: list[Snapshot] = []
    errors: list[BaseException] = []

    def work() -> None:
        fresh = LiveSource()
        try:
            box.append(Snapshot(status=fresh.status(), sample=fresh.read()))
        except BaseException as e:  # handed to the caller
            errors.append(e)
        finally:
            try:
                fresh.close()
            finally:
                live.leave()

    worker = threading.Thread(target=work, name="gpumem_nb-snapshot", daemon=True)
    t0 = time.monotonic()
    worker.start()
    worker.join(wait_s)
    if box:
        return box[0]
    if errors:
        raise errors[0]
    return _unanswered(f"NVML did not answer within {time.monotonic() - t0:.1f} s "
                       "(a wedged driver, or a GPU off the bus, can do this)")


def _unanswered(why: str) -> Snapshot:
    import time

    return Snapshot(status=SourceStatus(nvml=f"{why}; its figures are unknown", torch="unknown",
                                        gpu_count=0),
                    sample=Sample(t_s=time.monotonic(), wall_s=time.time(), rss_bytes=None))
