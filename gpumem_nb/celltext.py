"""Cells' lines, numbered as Python's compiler numbers them.

The compiler ends a line at ``\\n``, ``\\r\\n`` or ``\\r`` only. ``str.splitlines()`` also breaks
at VT, FF, ``\\x1c``-``\\x1e``, NEL (``\\x85``), U+2028 and U+2029, and IPython caches each cell's
text for ``linecache`` split that way (``[line + "\\n" for line in code.splitlines()]``): after
any of those characters, linecache's line N is not the line the compiler called N, and the
character itself is gone from the cache. So the extension keeps the recent cells' own texts
(``CellTexts``, filled by an input transformer while it is loaded), and a cell's lines are read
from its text; real files (a module) are read through linecache, as are cells it does not
hold (run before the extension was loaded, too large, or too long ago).
"""

from __future__ import annotations

import linecache
import re
from collections.abc import Iterable

__all__ = ["MAX_CELL_TEXTS", "MAX_TEXT_CHARS", "CellText", "CellTexts", "compiler_lines"]

_LINE_END = re.compile(r"\r\n|\r|\n")

# What the store keeps: the last 200 cells' texts (a traced cell's functions usually come from
# the cells just above it), none over 1,000,000 characters, and 10,000,000 characters in all.
# IPython itself keeps every cell's lines in linecache for the whole session; this is at most
# a bounded second copy of the recent ones. A cell left out is labelled through linecache.
MAX_CELL_TEXTS = 200
MAX_TEXT_CHARS = 1_000_000
MAX_TOTAL_CHARS = 10_000_000


def compiler_lines(text: str) -> list[str]:
    """``text`` split where the compiler counts a new line, and nowhere else."""
    return _LINE_END.split(text)


class CellText:
    """Cells' texts as compiled, each recognised by the entry IPython cached for the file name
    it was compiled under (that entry holds the text, split its own way, and its length)."""

    def __init__(self, *texts: str) -> None:
        self.texts = texts
        self._by_length: dict[int, list[str]] = {}
        for t in texts:
            self._by_length.setdefault(len(t), []).append(t)
        self._lines: dict[str, list[str] | None] = {}  # file name -> the cell's lines

    def _mine(self, filename: str) -> list[str] | None:
        if filename in self._lines:
            return self._lines[filename]
        got = None
        entry = linecache.cache.get(filename)
        if isinstance(entry, tuple) and len(entry) >= 3 and isinstance(entry[0], int):
            for text in self._by_length.get(entry[0], ()):
                if entry[2] == [line + "\n" for line in text.splitlines()]:  # IPython's form
                    got = compiler_lines(text)
                    break
        self._lines[filename] = got
        return got

    def line(self, filename: str, lineno: int) -> str | None:
        """Line ``lineno`` as written, when ``filename`` is where one of these texts was
        compiled; None for any other file (read it through linecache)."""
        lines = self._mine(filename)
        if lines is None:
            return None
        return lines[lineno - 1] if 1 <= lineno <= len(lines) else ""


class CellTexts:
    """The recent cells' texts as compiled, oldest first; a text seen again moves to the end.
    ``add`` is an input transformer's whole work: it must cost next to nothing."""

    def __init__(self, max_texts: int = MAX_CELL_TEXTS, max_text_chars: int = MAX_TEXT_CHARS,
                 max_total_chars: int = MAX_TOTAL_CHARS) -> None:
        self.max_texts = max_texts
        self.max_text_chars = max_text_chars
        self.max_total_chars = max_total_chars
        self._texts: dict[str, None] = {}  # ordered: oldest first
        self._chars = 0

    def add_lines(self, lines: Iterable[str]) -> None:
        """A cell's text as the transformer is given it (its lines, ends kept)."""
        if not isinstance(lines, list):
            return
        n = 0
        for line in lines:
            if type(line) is not str:
                return
            n += len(line)
        if n <= self.max_text_chars:  # counted before it is joined: a huge cell costs no copy
            self.add("".join(lines))

    def add(self, text: str) -> None:
        texts = self._texts
        if text in texts:
            del texts[text]
        else:
            self._chars += len(text)
        texts[text] = None
        while len(texts) > self.max_texts or self._chars > self.max_total_chars:
            oldest = next(iter(texts))
            del texts[oldest]
            self._chars -= len(oldest)

    def __len__(self) -> int:
        return len(self._texts)

    def reader(self) -> CellText:
        """The texts held now, to read cells' lines from (the store may change after)."""
        return CellText(*self._texts)
