"""What the live chart needs from the monitor, and nothing more: the monitor satisfies these
Protocols, and the chart reaches it through them only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from ..cleanupreport import CleanupReport, CleanupRequest
from ..model import CellMark, CellRecord, Sample, Verdict
from ..records import History
from ..sampler import Sampler
from ..settings import Config

__all__ = ["ChartHost", "ChartReplay"]


class ChartReplay(Protocol):
    label: str
    source: Any
    sampler: Sampler


class ChartHost(Protocol):
    """What the chart needs from the monitor, and nothing more."""

    config: Config
    started_t_s: float
    widget: Any

    @property
    def marks(self) -> deque[CellMark]: ...
    @property
    def on_record(self) -> list[Callable[[CellRecord, Verdict | None], None]]: ...
    @property
    def settings_listeners(self) -> list[Callable[[Config], None]]: ...
    @property
    def history(self) -> History: ...
    @property
    def feed(self) -> Sampler: ...
    @property
    def replay(self) -> ChartReplay | None: ...
    @property
    def cell_running(self) -> bool: ...
    @property
    def after_cell(self) -> list[Callable[[], None]]: ...
    def gpu_count(self) -> int: ...
    def read(self) -> Sample: ...
    def marks_for_picture(self, last: int) -> list[CellMark]: ...
    def cleanup(self, request: CleanupRequest,
                on_interrupt: Callable[[CleanupReport], None] | None = None,
                ) -> CleanupReport: ...
    def configure(self, *, device: Any = ...) -> Config: ...
