"""Which cell a piece of code came from, on every IPython this package supports (7.34 to 9).

IPython compiles each cell under a file name of its own, and the number the user sees is read
back from that name. The versions differ in three ways:

- IPython >= 8 keeps ``shell.compile._filename_map`` (file name -> execution count). IPython 7
  has no such map: plain IPython names a cell ``<ipython-input-N-hash>`` (N is the count), and
  ipykernel 6's compiler names it after a hash of the cell's text alone
  (``/tmp/ipykernel_PID/HASH.py``), with no number in it. For that case the monitor notes the
  name of each cell as it starts (:class:`CellNames`), asking the shell's own compiler.
- A cell's top-level code is named ``<module>``, but IPython 7.34 on Python 3.11 renames it
  ``<cell line: 0>``.
- IPython >= 9.8 advances ``shell.execution_count`` before ``pre_run_cell``; older versions
  advance it after the cell.

Nothing here imports IPython: its version is read from ``sys.modules`` when it is loaded.
"""

from __future__ import annotations

import linecache
import re
import sys
import weakref
from collections.abc import Callable

__all__ = ["CellNames", "counts_ahead_at_start", "is_cell_top", "number_in_name"]

_INPUT_NAME = re.compile(r"<ipython-input-(\d+)-")
_KEEP = 512  # cell names remembered for IPython 7 under ipykernel: a long session's worth
_BY_SHELL: weakref.WeakKeyDictionary[object, CellNames] = weakref.WeakKeyDictionary()


def is_cell_top(code_name: str) -> bool:
    """Whether a code object's name is a cell's top level (not a function defined in it)."""
    return code_name == "<module>" or code_name.startswith("<cell line:")


def number_in_name(filename: str) -> int | None:
    """The count in plain IPython's ``<ipython-input-N-hash>``; None for any other name."""
    m = _INPUT_NAME.match(filename)
    return int(m.group(1)) if m else None


def counts_ahead_at_start() -> bool:
    """Whether IPython has already advanced ``execution_count`` when ``pre_run_cell`` fires
    (IPython >= 9.8). True where the version cannot be read: the behaviour of the newest."""
    ipython = sys.modules.get("IPython")
    version = getattr(ipython, "version_info", None)
    if not isinstance(version, tuple) or len(version) < 2:
        return True
    try:
        return (int(version[0]), int(version[1])) >= (9, 8)
    except (TypeError, ValueError):
        return True


class CellNames:
    """File name -> execution count for the cells of one shell, on every IPython."""

    def __init__(self, shell: object) -> None:
        # Weakly: the table lives in a weak mapping keyed by the shell it serves.
        try:
            ref: Callable[[], object] = weakref.ref(shell)
        except TypeError:
            ref = lambda: shell  # noqa: E731 - a stand-in shell that cannot be weakly held
        self._shell = ref
        self._noted: dict[str, int] = {}

    @property
    def shell(self) -> object:
        return self._shell()

    @classmethod
    def of(cls, shell: object) -> CellNames:
        """The one table of ``shell``: what the monitor notes, every reader finds (and a
        reload of the extension keeps, as IPython keeps its own map)."""
        try:
            names = _BY_SHELL.get(shell)
            if names is None:
                names = _BY_SHELL[shell] = cls(shell)
            return names
        except TypeError:  # not weak-referenceable (a stand-in shell): a table of its own
            return cls(shell)

    def _ipython_map(self) -> dict[object, object] | None:
        table = getattr(getattr(self.shell, "compile", None), "_filename_map", None)
        return table if isinstance(table, dict) else None

    def note(self, raw_cell: str, count: int | None) -> None:
        """At a cell's start, on an IPython without ``_filename_map``: the name its compiler
        will give the cell (ipykernel's depends on the text alone, so it is known now)."""
        if count is None or self._ipython_map() is not None:
            return
        namer = getattr(getattr(self.shell, "compile", None), "get_code_name", None)
        if not callable(namer):
            return
        try:
            name = namer(raw_cell, raw_cell, count)
        except Exception:  # a compiler of another shape: the other ways still apply
            return
        if not isinstance(name, str) or number_in_name(name) is not None:
            return  # plain IPython 7: the number is in the name itself
        self._noted.pop(name, None)
        self._noted[name] = count  # the latest run of the same text wins
        while len(self._noted) > _KEEP:
            del self._noted[next(iter(self._noted))]

    def number(self, filename: str) -> int | None:
        """The execution count of the cell compiled under ``filename``; None when it is not a
        cell's (a library's file, ``<timed exec>``)."""
        table = self._ipython_map()
        if table is not None and filename in table:
            got = table[filename]
            return got if isinstance(got, int) else None
        found = number_in_name(filename)
        if found is not None:
            return found
        return self._noted.get(filename)

    def is_cell_file(self, filename: str) -> bool:
        """Whether ``filename`` names some cell's code, numbered or not (a cell that ran
        before the monitor noted names): IPython 7 and 8 cache every cell's text under its
        name in ``linecache._ipython_cache``."""
        if self.number(filename) is not None:
            return True
        cache = getattr(linecache, "_ipython_cache", None)
        return isinstance(cache, dict) and filename in cache
