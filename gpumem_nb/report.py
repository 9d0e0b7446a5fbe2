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


def html_table(headers: Row, rows: Sequence[Row], *, caption: str = "") -> str:
    esc = html.escape
    head = "".join(f'<th style="{_NOWRAP}">{esc(h)}</th>' for h in headers)
    body = "".join(
        "<tr>" + "".join(
            f'<td style="text-align:{"left" if i == 0 else "right"};{_NOWRAP}">{esc(c)}</td>'
            for i, c in enumerate(r)
        ) + "</tr>"
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
