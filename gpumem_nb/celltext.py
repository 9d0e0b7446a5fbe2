"""A traced cell's lines, numbered as Python's compiler numbers them.

The compiler ends a line at ``\\n``, ``\\r\\n`` or ``\\r`` only. ``str.splitlines()`` also breaks
at VT, FF, ``\\x1c``-``\\x1e``, NEL (``\\x85``), U+2028 and U+2029, and IPython caches each cell's
text for ``linecache`` split that way (``[line + "\\n" for line in code.splitlines()]``): after
any of those characters, linecache's line N is not the line the compiler called N, and the
character itself is gone from the cache. So the tracer keeps the cell's own text, and reads the
cell's lines from it; every other file (an earlier cell, a module) is read through linecache.
"""

from __future__ import annotations

import linecache
import re

__all__ = ["CellText", "compiler_lines"]

_LINE_END = re.compile(r"\r\n|\r|\n")


def compiler_lines(text: str) -> list[str]:
    """``text`` split where the compiler counts a new line, and nowhere else."""
    return _LINE_END.split(text)


class CellText:
    """One cell's text as compiled, and the file name it was compiled under, recognised by
    the entry IPython cached for it (that entry holds this text, split its own way)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._lines = compiler_lines(text)
        self._cached = [line + "\n" for line in text.splitlines()]  # IPython's form of it
        self._is_mine: dict[str, bool] = {}

    def _mine(self, filename: str) -> bool:
        got = self._is_mine.get(filename)
        if got is None:
            entry = linecache.cache.get(filename)
            got = self._is_mine[filename] = (
                isinstance(entry, tuple) and len(entry) >= 3 and entry[0] == len(self.text)
                and entry[2] == self._cached)
        return got

    def line(self, filename: str, lineno: int) -> str | None:
        """Line ``lineno`` as written, when ``filename`` is where this cell was compiled;
        None for any other file (read it through linecache)."""
        if not self._mine(filename):
            return None
        return self._lines[lineno - 1] if 1 <= lineno <= len(self._lines) else ""
