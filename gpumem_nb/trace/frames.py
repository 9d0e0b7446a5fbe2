"""Each allocation's frames to a site number, each distinct frame read and classified once.
"""

from __future__ import annotations

from typing import Any

from ..cellnames import is_cell_top
from ..celltext import CellText
from .entries import _MAX_LINE, _count, _Malformed, _plain
from .sites import _CELL_FILE, Site, _is_library, _is_outer

__all__ = []


class _Sites:
    """``site_of`` for each allocation's frames, reading only the frames it needs: the
    innermost of the user's and, inside a function, the way out to the cell.

    torch symbolizes each distinct frame once and shares that dict among every entry
    recorded there (``py_symbolize``), so a frame is checked and classified once per
    analysis, by identity; the object is kept with its reading so that its id cannot be
    reused by another. A site is a small int here (``Site`` hashes in Python, slowly)."""

    def __init__(self, skip: tuple[str, ...], cell: CellText | None = None) -> None:
        self.skip = skip
        self.cell = cell
        self.sites: list[Site] = []
        self._ids: dict[tuple[str, int, str, str], int] = {}
        # id(frame) -> (frame, filename, line, name, library, cell top level, outer)
        self._frames: dict[int, tuple[Any, str, int, str, bool, bool, bool]] = {}
        self._libs: dict[str, bool] = {}
        self._outer: dict[str, bool] = {}
        # by the first, the last and how many frames read, of each reading length
        self._memo: dict[tuple[int, int, int],
                         list[tuple[int, dict[tuple[int, ...], tuple[tuple[Any, ...], int]]]]] = {}

    def _frame(self, f: Any) -> tuple[Any, str, int, str, bool, bool, bool]:
        """One frame, read and classified (``_Malformed`` when not torch's form)."""
        got = self._frames.get(id(f))
        if got is not None and got[0] is f:
            return got
        p = _plain(f)
        if p is None:
            raise _Malformed  # a frame that is not a dict, or one whose methods raise
        fn, line, name = p.get("filename"), p.get("line"), p.get("name")
        if not (isinstance(fn, str | None) and isinstance(name, str | None)
                and (line is None or (_count(line) and line < _MAX_LINE))):
            raise _Malformed
        fn, line, name = fn or "", line or 0, name or ""
        lib = self._libs.get(fn)
        if lib is None:
            lib = self._libs[fn] = _is_library(fn, self.skip)
        outer = self._outer.get(fn)
        if outer is None:
            outer = self._outer[fn] = _is_outer({"filename": fn})
        cell = is_cell_top(name) and bool(_CELL_FILE.search(fn))
        got = self._frames[id(f)] = (f, fn, line, name, lib, cell, outer)
        return got

    def site(self, frames: Any) -> int:
        """The site's number. The same stack seen again (the same frame objects, as
        torch shares them) is answered from the frames its first reading read, looked up
        by their identities: a loop's allocations cost a lookup each, not a walk."""
        if not isinstance(frames, list | tuple):
            raise _Malformed
        n = len(frames)
        if not n:
            return self._id("", 0, "", "")
        key = (id(frames[0]), id(frames[-1]), n)
        groups = self._memo.get(key)
        if groups is not None:
            for read, seen in groups:
                got = seen.get(tuple(map(id, frames[:read])))
                if got is not None:
                    return got[1]
        sid, read = self._walk(frames)
        if read:  # kept with the frames it read, so that their ids stay theirs
            if groups is None:
                groups = self._memo[key] = []
            group = next((g for r, g in groups if r == read), None)
            if group is None:
                group = {}
                groups.append((read, group))
            group[tuple(map(id, frames[:read]))] = ((*frames[:read], frames[-1]), sid)
        return sid

    def _walk(self, frames: list[Any] | tuple[Any, ...]) -> tuple[int, int]:
        """The site's number, and how many frames from the innermost it read (0: not
        a plain innermost-first reading, so not remembered)."""
        frame = self._frame
        n = len(frames)
        first, last = frame(frames[0]), frame(frames[-1])
        flip = first[6] and not last[6]  # a build that records outermost first
        top = last if flip else first
        inner_i = -1
        inner = None
        if not top[4]:
            inner_i, inner = 0, top
        else:
            for i in range(1, n):
                fr = frame(frames[n - 1 - i] if flip else frames[i])
                if not fr[4]:
                    inner_i, inner = i, fr
                    break
        read = 0 if flip else (inner_i + 1 if inner is not None else n)
        if inner is None:
            return self._id(top[1], top[2], top[3], ""), read
        if not inner[5]:
            # Inside a function: the cell line that led there, the nearest cell's top
            # level going outward (a %%gpumem cell's body runs inside the cell holding it).
            for i in range(inner_i + 1, n):
                fr = frame(frames[n - 1 - i] if flip else frames[i])
                if fr[5]:
                    return (self._id(inner[1], inner[2], inner[3], f"cell line {fr[2]}"),
                            0 if flip else i + 1)
            read = 0 if flip else n
        return self._id(inner[1], inner[2], inner[3], ""), read

    def _id(self, filename: str, line: int, name: str, via: str) -> int:
        key = (filename, line, name, via)
        i = self._ids.get(key)
        if i is None:
            i = self._ids[key] = len(self.sites)
            written = self.cell.line(filename, line) if self.cell is not None else None
            self.sites.append(Site(filename, line, name, via, written))
        return i
