"""Result objects the magics display or return; each renders as text and as HTML."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .model import CellRecord, Holder
from .records import DISPLAY_HEADERS, display_rows
from .report import html_table, text_table
from .settings import Config
from .units import format_bytes


# ------------------------------------------------------------------------------------------
class CellReport:
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
                f"NVML peak {format_bytes(d.nvml_peak_bytes)}"
            )
        parts.append(f"host RAM {format_bytes(r.rss_delta_bytes, signed=True)}")
        return " · ".join(parts)

    def __str__(self) -> str:
        return self.line()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.line())

    def _repr_html_(self) -> str:
        return html_table(DISPLAY_HEADERS, display_rows(self.record))


class WhoReport:
    HEADERS = ("holder", "kind", "device", "bytes", "detail")

    def __init__(self, holders: Sequence[Holder], total: int) -> None:
        self.holders = list(holders)
        self.total = total

    def rows(self) -> list[list[str]]:
        return [[h.name, h.kind, h.device, format_bytes(h.nbytes), h.detail]
                for h in self.holders]

    @property
    def caption(self) -> str:
        if not self.total:
            return "No tensors or arrays are held by your variables, Out or a traceback."
        return f"Largest {len(self.holders)} of {self.total} holders of memory, largest first."

    def __str__(self) -> str:
        if not self.holders:
            return self.caption
        return self.caption + "\n" + text_table(self.HEADERS, self.rows())

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        if not self.holders:
            return f"<div>{self.caption}</div>"
        return html_table(self.HEADERS, self.rows(), caption=self.caption)


class ConfigView:
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

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        return html_table(("setting", "value"), self.rows)
