"""The live chart's widget: a small anywidget whose front end is livechart.js, beside this file.

Why not plotly's FigureWidget: since plotly 6 every FigureWidget ships plotly.js (5 MB) with
its own state, and its Python side imports plotly.io, which imports nbformat, jsonschema and
``rfc3987_syntax`` (1.6 s). This widget's front end is a few KB of readable JavaScript, sent once
per chart, and its kernel side is a handful of plain-JSON traits. docs/chart.md has the
measured comparison.

The data model is a list of named series (``SeriesSpec``) and, per series key, its points in
two parts: ``history`` (the long, downsampled past, resent only every few seconds) and
``recent`` (the points since, resent each tick), so live traffic stays small however long the
session. Another feature may add series of its own (the cluster's lines) with
``MemoryWidget.add_series``; the front end draws whatever series the model lists.

The controls (device, Pause, Clean up) are drawn by the front end too, so each answers at once
in the page while a long cell holds the kernel's messages back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anywidget
import traitlets

__all__ = [
    "CompactReading",
    "LiveChart",
    "Points",
    "SeriesSpec",
    "compact_esm_bytes",
    "esm_bytes",
]

_HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class SeriesSpec:
    """One line of the chart: ``key`` names its points in ``history``/``recent``."""

    key: str
    name: str
    color: str
    width: float = 2.0
    dash: str = ""  # an SVG stroke-dasharray; "" is solid
    hidden: bool = False  # hidden until a legend click shows it
    legend: int = 0  # its place in the legend, which lists the lines as the picture does

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


Points = list[list[float | None]]  # [xs, ys]: seconds and GiB, None for a gap


def _without_comment_lines(code: str) -> str:
    """``code`` less the lines that hold only a ``//`` comment (none is inside a string or a
    template literal in livechart.js: tests/test_widget.py checks the result still parses)."""
    return "".join(line for line in code.splitlines(keepends=True)
                   if not line.lstrip().startswith("//"))


class LiveChart(anywidget.AnyWidget):
    # Read once, at import: anywidget can also watch a path for changes, which needs a thread.
    # The page gets the code without its whole-line comments (a third of the file), which
    # every chart sends again: they are for the reader of livechart.js.
    _esm = _without_comment_lines((_HERE / "livechart.js").read_text(encoding="utf-8"))
    _css = (_HERE / "livechart.css").read_text(encoding="utf-8")

    series = traitlets.List(traitlets.Dict()).tag(sync=True)
    history = traitlets.Dict().tag(sync=True)
    recent = traitlets.Dict().tag(sync=True)
    # Lines another feature sends whole, as [xs, ys] per key (the cluster's).
    extra = traitlets.Dict().tag(sync=True)
    marks = traitlets.List(traitlets.List()).tag(sync=True)
    meta = traitlets.Dict().tag(sync=True)
    # Pause is the browser's first: the view freezes on the click and tells the kernel, whose
    # messages wait behind a running cell (livechart.js). The cleanup and device requests are
    # custom messages, each answered by {"kind": "done", "id": ...} once handled.
    paused = traitlets.Bool(False).tag(sync=True)
    # The model ids of the chart's output (the box) and of the header and banner beside it:
    # what the page saves in the notebook as the chart's picture (livechart.js, docs/chart.md).
    parts = traitlets.Dict().tag(sync=True)


class CompactReading(anywidget.AnyWidget):
    """``%gpumem watch --compact``: one line per GPU (compact.py formats them), drawn by
    compact.js. ``lines`` is the only trait that changes after the first display."""

    _esm = (_HERE / "compact.js").read_text(encoding="utf-8")
    _css = (_HERE / "compact.css").read_text(encoding="utf-8")

    lines = traitlets.List(traitlets.Dict()).tag(sync=True)
    meta = traitlets.Dict().tag(sync=True)


def compact_esm_bytes() -> int:
    return len(CompactReading._esm.encode()) + len(CompactReading._css.encode())


def esm_bytes() -> int:
    """The size of what the browser runs, for the benchmark and the docs."""
    return len(LiveChart._esm.encode()) + len(LiveChart._css.encode())
