"""An allocation's site: the innermost frame of the user's own code, and the cell line that led
there; its label as every view shows it.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ..cellnames import is_cell_top
from ..units import cut, printable

__all__ = ["Site", "library_dirs", "site_of"]

# A site's label as shown, cut where it ends in "…" (``units.cut``) and each control character
# written as its escape (``units.printable``, as the flag and replay messages write them): the
# label holds a traced line as written, and five lines of 100,000 characters made a 1.4 MB
# report. The timeline's legend keeps 70 characters and its hover 50; the report's table,
# whose column wraps, keeps 200, so that the file, the line and "(from cell line N)" stay.
_LEGEND_CHARS = 70
_HOVER_CHARS = 50
_TABLE_LABEL_CHARS = 200


# Frames from these packages are never "the site": the user's line is what called them.
_LIBRARY_MODULES = ("torch", "gpumem_nb", "IPython", "ipykernel", "tornado", "zmq",
                    "traitlets", "jupyter_client", "comm", "debugpy", "asyncio", "runpy")
_OUTER_MARKERS = ("IPython", "ipykernel", "runpy", "tornado", "asyncio")
_CELL_FILE = re.compile(r"^<ipython-input-\d+-[0-9a-f]+>$|ipykernel_\d+[/\\]\d+\.py$")


@dataclass(frozen=True)
class Site:
    filename: str
    line: int
    function: str
    via: str = ""  # the cell line that led there, when the site is inside a function
    # The line as written, when the site is in a cell whose text is kept (``CellText``);
    # None: read through linecache. Not part of the site's identity.
    written: str | None = field(default=None, compare=False, repr=False)

    @property
    def in_cell(self) -> bool:
        return bool(_CELL_FILE.search(self.filename))

    @property
    def code(self) -> str:
        if self.written is not None:
            return self.written.strip()
        try:
            return linecache.getline(self.filename, self.line).strip() if self.line else ""
        except (ValueError, UnicodeError):  # a recorded name no file can have (a NUL in it)
            return ""

    @property
    def label(self) -> str:
        if not self.filename:
            return "(no Python stack recorded)"
        if self.in_cell:
            where = f"cell line {self.line}" + (
                f" in {self.function}" if self.function and not is_cell_top(self.function) else "")
        else:
            where = f"{_short(self.filename)}:{self.line} in {self.function}"
        code = self.code
        text = f"{where}: {code}" if code else where
        return text + (f"  (from {self.via})" if self.via else "")


def _short(filename: str) -> str:
    parts = filename.replace("\\", "/").split("/")
    return "/".join(parts[-2:]) if len(parts) > 1 else filename


def library_dirs(modules: Mapping[str, ModuleType] | None = None) -> tuple[str, ...]:
    """Directories whose frames are the machinery, not the user's code."""
    mods = sys.modules if modules is None else modules
    dirs = []
    for name in _LIBRARY_MODULES:
        f = getattr(mods.get(name), "__file__", None)
        if f:
            dirs.append(os.path.dirname(os.path.abspath(f)) + os.sep)
    return tuple(dirs)


def _stdlib_dir() -> str:
    stdlib = sysconfig.get_paths().get("stdlib")
    return os.path.abspath(stdlib) + os.sep if stdlib else "\0"


_STDLIB = _stdlib_dir()


def _is_library(name: str, skip: tuple[str, ...]) -> bool:
    """A frame of the machinery (torch, IPython, the stdlib), not the user's code."""
    if not name or name.startswith(("<frozen", "??")) or name.endswith(".cpp"):
        return True
    if not os.path.isabs(name):
        return False
    # pyenv and conda put site-packages inside the stdlib directory: libraries there,
    # other than the skipped ones, are code the user called.
    return name.startswith(skip) or (name.startswith(_STDLIB) and not any(
        d in name for d in ("site-packages", "dist-packages")))


def site_of(frames: Sequence[Mapping[str, Any]], skip: tuple[str, ...]) -> Site:
    """The innermost frame of the user's own code (torch records innermost first); when that
    is inside a function, the cell line that called it as ``via``."""
    def is_library(fr: Mapping[str, Any]) -> bool:
        return _is_library(str(fr.get("filename", "")), skip)

    frames = list(frames)
    if frames and _is_outer(frames[0]) and not _is_outer(frames[-1]):
        frames.reverse()  # a build that records outermost first
    user = [fr for fr in frames if not is_library(fr)]
    if not user:
        if not frames:
            return Site("", 0, "")
        fr = frames[0]
        return Site(str(fr.get("filename", "")), int(fr.get("line", 0)), str(fr.get("name", "")))
    inner = user[0]
    site = Site(str(inner.get("filename", "")), int(inner.get("line", 0)),
                str(inner.get("name", "")))
    # Inside a function: name the cell line that led there, the nearest cell's top level
    # going outward (a %%gpumem cell's body runs inside the cell holding the magic).
    start = next(i for i, fr in enumerate(frames) if fr is inner)
    cell = next((fr for fr in frames[start:] if is_cell_top(str(fr.get("name", "")))
                 and _CELL_FILE.search(str(fr.get("filename", "")))), None)
    if cell is None or cell is inner:
        return site
    via = f"cell line {cell.get('line', 0)}"
    return Site(site.filename, site.line, site.function, via)


def _is_outer(fr: Mapping[str, Any]) -> bool:
    name = str(fr.get("filename", "")).replace("\\", "/")
    return any(f"/{m}/" in name for m in _OUTER_MARKERS)


def _shown(label: str, n: int) -> str:
    """A site's label as every view shows it: cut to ``n`` characters, then printable."""
    return printable(cut(label, n))
