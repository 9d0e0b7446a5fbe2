"""Plain-text and HTML tables: the one place results are turned into something to read.

Every result object (snapshot, cell record, history, cleanup report) renders through these two
functions, so a terminal, a notebook and a static viewer show the same numbers.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

__all__ = [
    "Row",
    "Shown",
    "html_lines",
    "html_table",
    "text_table",
]

Row = Sequence[str]

def text_table(headers: Row, rows: Sequence[Row]) -> str:
    widths = [len(h) for h in headers]
    for r in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, r, strict=False)]

    def line(cells: Row) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=False))
        ).rstrip()

    out = [line(headers), line(["─" * w for w in widths])]
    out.extend(line(r) for r in rows)
    return "\n".join(out)


# JupyterLab styles rendered tables with ``white-space: normal``, so "+1.49 GiB" broke after
# "+1.49" even beside empty space; cells are short, so they never wrap.
_NOWRAP = "white-space:nowrap"
# A text column: wraps at any character once its words do not fit (a site such as
# "train.py:42 (from ce…)" has long unbroken runs), and reads left to right.
_WRAP = "text-align:left;white-space:normal;overflow-wrap:anywhere;min-width:12em"


def html_table(headers: Row, rows: Sequence[Row], *, caption: str = "",
               text_columns: Sequence[int] = ()) -> str:
    """``text_columns``: the columns of free text (a call site, a file path), left-aligned and
    wrapped anywhere, so one long value wraps inside the output instead of widening the table
    past it; every other column stays on one line (numbers, sizes)."""
    esc = html.escape

    def style(i: int) -> str:
        if i in text_columns:
            return _WRAP
        return f'text-align:{"left" if i == 0 else "right"};{_NOWRAP}'

    head = "".join(
        f'<th style="{_WRAP if i in text_columns else _NOWRAP}">{esc(h)}</th>'
        for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f'<td style="{style(i)}">{esc(c)}</td>' for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    cap = f"<caption style='text-align:left'>{esc(caption)}</caption>" if caption else ""
    return (
        f"<table class='gpumem-nb'>{cap}<thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def html_lines(lines: Sequence[str]) -> str:
    return "".join(f"<div>{html.escape(x)}</div>" for x in lines)


class Shown:
    """A result IPython shows: ``__str__`` for a terminal and ``print``, the same text for
    IPython's pretty printer, and ``_repr_html_`` for a notebook (escaped text unless the result
    draws a table of its own). One base, so a new result cannot give the terminal and the
    pretty printer two different texts."""

    __slots__ = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # IPython's pretty printer takes the first class in the MRO that defines
        # ``_repr_pretty_`` or ``__repr__``: a dataclass's generated ``__repr__`` would win
        # over an inherited ``_repr_pretty_``, so each result carries its own reference.
        cls._repr_pretty_ = Shown._repr_pretty_  # type: ignore[method-assign]

    def __str__(self) -> str:
        raise NotImplementedError

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(str(self))}</pre>"
