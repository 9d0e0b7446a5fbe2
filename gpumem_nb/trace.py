"""``%%gpumem --trace``: record one cell's allocations and say which lines took the memory.

``CellTracer`` switches PyTorch's allocation history on before the cell and off after it,
leaving a recording the user already had running untouched (switching history off clears
its buffer, so a running recording is read, never toggled). It never starts CUDA: with CUDA
not yet initialised, or under ``cudaMallocAsync`` (which records no history), it says so and
the cell runs untraced.

``analyze`` replays the snapshot's trace entries (pure, table-testable): which allocation
sites held the most bytes at the cell's peak, which are still alive at its end (leak
candidates), and which were live when an OOM entry was recorded. The timeline is a plain
plotly JSON figure for the ``application/vnd.plotly.v1+json`` mime type, which JupyterLab's
bundled plotly renderer draws without any CDN, with a static SVG picture of the same data
in the bundle for every other viewer (``svgchart``). ``--save`` pickles the raw snapshot at
protocol 4, the newest that PyTorch's memory_viz reader accepts.
"""

from __future__ import annotations

import bisect
import html
import linecache
import math
import os
import pickle
import re
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import plotlyjson, safeio, svgchart
from .cellnames import is_cell_top
from .celltext import CellText
from .report import Shown, html_table, text_table
from .sources.torch import TorchDebug
from .units import cut, format_bytes, printable
from .whatif.snapshot import START_KEY

__all__ = [
    "MAX_ENTRIES",
    "TOP_DEFAULT",
    "CellTracer",
    "DeviceTrace",
    "MiB",
    "Series",
    "Site",
    "SiteBytes",
    "TraceReport",
    "TraceResult",
    "TraceTimeline",
    "analyze",
    "library_dirs",
    "save_snapshot",
    "site_of",
    "views",
]

MAX_ENTRIES = 100_000  # history ring buffer: 0.2-0.27 s for torch to snapshot when full (H200)
TOP_DEFAULT = 5
_TIMELINE_SITES = 8
MiB = 1 << 20
_MAX_POINTS = 1500
# A site's label as shown, cut where it ends in "…" (``units.cut``) and each control character
# written as its escape (``units.printable``, as the flag and replay messages write them): the
# label holds a traced line as written, and five lines of 100,000 characters made a 1.4 MB
# report. The timeline's legend keeps 70 characters and its hover 50; the report's table,
# whose column wraps, keeps 200, so that the file, the line and "(from cell line N)" stay.
_LEGEND_CHARS = 70
_HOVER_CHARS = 50
_TABLE_LABEL_CHARS = 200
_PICKLE_PROTOCOL = 4  # memory_viz's JavaScript unpickler rejects protocol 5
# Frames from these packages are never "the site": the user's line is what called them.
_LIBRARY_MODULES = ("torch", "gpumem_nb", "IPython", "ipykernel", "tornado", "zmq",
                    "traitlets", "jupyter_client", "comm", "debugpy", "asyncio", "runpy")
_OUTER_MARKERS = ("IPython", "ipykernel", "runpy", "tornado", "asyncio")
_CELL_FILE = re.compile(r"^<ipython-input-\d+-[0-9a-f]+>$|ipykernel_\d+[/\\]\d+\.py$")


# ------------------------------------------------------------------------------------------
# Sites
# ------------------------------------------------------------------------------------------
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


def library_dirs(modules: Mapping[str, Any] | None = None) -> tuple[str, ...]:
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


# ------------------------------------------------------------------------------------------
# Replay
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SiteBytes:
    site: Site
    nbytes: int
    allocations: int

    @property
    def label(self) -> str:
        return self.site.label


@dataclass(frozen=True)
class Series:
    label: str
    mib: tuple[float, ...]


@dataclass(frozen=True)
class DeviceTrace:
    device: int
    entries: int
    allocations: int
    peak_bytes: int  # this cell's own allocations live at once, at most
    peak_ms: float
    end_bytes: int
    at_peak: tuple[SiteBytes, ...]
    alive_at_end: tuple[SiteBytes, ...]
    at_oom: tuple[SiteBytes, ...] = ()
    oom_requested_bytes: int | None = None
    oom_ms: float | None = None
    times_ms: tuple[float, ...] = ()
    series: tuple[Series, ...] = ()
    skipped: int = 0  # history entries that could not be read (see ``analyze``)


def _ranked(live: Mapping[Site, list[int]], top: int) -> tuple[SiteBytes, ...]:
    ranked = sorted(((s, v[0], v[1]) for s, v in live.items() if v[0] > 0),
                    key=lambda x: (-x[1], x[0].label))
    return tuple(SiteBytes(s, n, c) for s, n, c in ranked[:top])


class _Malformed(Exception):
    """A history entry this analysis cannot read: skipped and counted."""


# Bounds on what a history entry's numbers can be: a size or an address fits in 64 bits, a
# time in microseconds since the epoch in 63, a line number in 9 digits. Beyond them a value
# is not torch's (10**400 overflowed float division, 10**5000 Python's int-to-text limit).
_MAX_FIELD = 1 << 64
_MAX_LINE = 10**9
_MAX_TIME_US = 1e17  # the year 5138: a later time is no clock's (1e18 gave absurd durations)


def _plain(obj: Any) -> dict[str, Any] | None:
    """A history entry or frame as a plain dict (a mapping whose own methods raise, or that
    is not a mapping, is None): read through dict's own methods from here on."""
    if type(obj) is dict:
        return obj
    if not isinstance(obj, Mapping):
        return None
    try:
        return dict(obj)
    except Exception:
        return None


def _usable(e: Any) -> dict[str, Any] | None:
    """The entry as a plain dict when its own fields are what torch writes (its frames are
    checked where they are read); None otherwise. A user's own recording, or a future torch,
    may hold others."""
    e = _plain(e)
    if e is None or not isinstance(e.get("action"), str):
        return None
    t = e.get("time_us")
    if t is not None and (not _finite(t) or not 0 <= t < _MAX_TIME_US):
        return None
    size = e.get("size", 0)
    if not _count(size):
        return None
    addr = e.get("addr")
    return e if addr is None or _count(addr) else None


def _count(v: Any) -> bool:
    """A non-negative int of at most 64 bits (not a bool)."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _MAX_FIELD


def _finite(v: Any) -> bool:
    """A number that converts to a finite float (a huge int would overflow)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return -_MAX_FIELD < v < _MAX_FIELD if isinstance(v, int) else math.isfinite(v)


def _as_list(entries: Any) -> list[Any]:
    """A device's trace as a list; anything that is not a list of entries reads as none."""
    if isinstance(entries, list | tuple):
        return list(entries)
    return []


_NEVER = 1 << 62  # the entry index of a free that never came


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


def analyze(entries: Sequence[Mapping[str, Any]], *, device: int = 0,
            since_us: float | None = None, top: int = TOP_DEFAULT,
            skip: tuple[str, ...] = (), cell: CellText | None = None) -> DeviceTrace:
    """Replay one device's history. Only allocations made in the window count, so the
    figures are this cell's own: at its peak, at its end, and at an OOM entry.

    A free counts at ``free_requested`` (when the tensor dies, as ``allocated_bytes``
    counts it); ``free_completed`` only when no request was seen (histories recorded
    with that action skipped). Frees of allocations made before the window are ignored.

    ``cell``: cells' own texts, which their sites' lines are read from (linecache
    misnumbers a cell's lines after a form feed, VT, NEL or U+2028; see ``celltext``).

    Entries that are not what torch writes (not a dict, a size, line or time that is not a
    number, frames that are not a list of dicts) are skipped and counted in ``skipped``.

    One pass over the entries, each read once: a traced cell of 100,000 entries waits for
    it (two passes that kept per-site totals took 0.29-0.36 s on the 2-core machine). The pass
    keeps each allocation's entry index, size, site and freeing index; who was live at the
    peak, at the OOM and at the end, and the timeline's instants, are read from those."""
    given = _as_list(entries)
    sites = _Sites(skip, cell)
    site_of_frames = sites.site
    skipped = 0
    readable: list[dict[str, Any]] = []  # the window's entries, as read
    totals: list[int] = []  # live bytes after each of them
    # The allocations in order: entry index, bytes, site, index of the entry that freed it.
    a_at: list[int] = []
    a_size: list[int] = []
    a_site: list[int] = []
    a_freed: list[int] = []
    live: dict[int, int] = {}  # address -> allocation
    requested: set[int] = set()
    total = peak = allocations = 0
    peak_i = oom_i = -1
    oom_size: int | None = None
    limit_t, limit_f = _MAX_TIME_US, _MAX_FIELD
    keep_entry, keep_total = readable.append, totals.append
    i = -1  # the window's entries read so far, less one
    for e in given:
        if type(e) is not dict:
            e = _plain(e)
            if e is None:
                skipped += 1
                continue
        action = e.get("action")
        t = e.get("time_us")
        size = e.get("size", 0)
        addr = e.get("addr")
        # torch's own types pass at once; anything else gets the general checks
        if not (type(action) is str and type(size) is int and 0 <= size < limit_f
                and (t is None or ((type(t) is float or type(t) is int) and 0 <= t < limit_t))
                and (addr is None or (type(addr) is int and 0 <= addr < limit_f))) \
                and _usable(e) is None:
            skipped += 1
            continue
        if since_us is not None and t is not None and t < since_us:
            continue  # before the window
        i += 1
        if action == "alloc":
            if addr is not None:
                try:
                    s = site_of_frames(e.get("frames") or ())
                except _Malformed:
                    skipped += 1
                    i -= 1
                    continue
                size = int(size)
                # An address allocated again without a free: the first stays counted.
                live[addr] = len(a_at)
                requested.discard(addr)
                a_at.append(i)
                a_size.append(size)
                a_site.append(s)
                a_freed.append(_NEVER)
                total += size
            allocations += 1
            if total > peak:
                peak, peak_i = total, i
        elif action == "free_requested":
            if addr in live:
                requested.add(addr)
                k = live.pop(addr)
                a_freed[k] = i
                total -= a_size[k]
        elif action == "free_completed":
            if addr in requested:
                requested.discard(addr)
            elif addr in live:
                k = live.pop(addr)
                a_freed[k] = i
                total -= a_size[k]
        elif action == "oom":
            oom_i, oom_size = i, int(size)
        keep_entry(e)
        keep_total(total)
    n = len(readable)
    n_sites = len(sites.sites)

    def live_at(i: int) -> dict[Site, list[int]]:
        """Bytes and allocations by site live just after entry ``i``, in the order the
        sites first allocated (ranking ties keep it)."""
        got = [[0, 0] for _ in range(n_sites)]
        for k in range(bisect.bisect_right(a_at, i)):
            if a_freed[k] > i:
                v = got[a_site[k]]
                v[0] += a_size[k]
                v[1] += 1
        return {sites.sites[j]: v for j, v in enumerate(got) if v[1]}

    ranked_peak = _ranked(live_at(peak_i), top) if peak_i >= 0 else ()
    ranked_end = _ranked(live_at(n - 1), top) if n else ()
    ranked_oom = _ranked(live_at(oom_i), top) if oom_i >= 0 else ()
    step = max(1, -(-n // _MAX_POINTS))
    keep = sorted({*range(0, n, step), n - 1, *(i for i in (peak_i, oom_i) if i >= 0)}) \
        if n else []
    t0 = _t0(readable, since_us)

    def ms(i: int) -> float:
        t = readable[i].get("time_us") if 0 <= i < n else None
        return (float(t) - t0) / 1e3 if t is not None and t0 is not None else float(i)

    times, series = _series(keep, [ms(i) for i in keep], totals, ranked_peak, ranked_end,
                            sites, a_at, a_size, a_site, a_freed)
    return DeviceTrace(
        device=device, entries=n, allocations=allocations, peak_bytes=peak,
        peak_ms=ms(peak_i), end_bytes=total, at_peak=ranked_peak,
        alive_at_end=ranked_end, at_oom=ranked_oom, oom_requested_bytes=oom_size,
        oom_ms=ms(oom_i) if oom_i >= 0 else None, times_ms=times, series=series,
        skipped=skipped)


def _t0(window: Sequence[Mapping[str, Any]], since_us: float | None) -> float | None:
    if since_us is not None:
        return since_us
    first = next((e.get("time_us") for e in window if e.get("time_us") is not None), None)
    return float(first) if first is not None else None


def _series(keep: Sequence[int], times: Sequence[float], totals: Sequence[int],
            at_peak: Sequence[SiteBytes], at_end: Sequence[SiteBytes], sites: _Sites,
            a_at: Sequence[int], a_size: Sequence[int], a_site: Sequence[int],
            a_freed: Sequence[int]) -> tuple[tuple[float, ...], tuple[Series, ...]]:
    """Live MiB per site at each kept instant for the biggest sites, the rest as "other".
    An allocation adds its bytes to the kept instants from its entry to the one before its
    free: a range of ``keep``, added as the two ends of a difference array."""
    chosen: list[Site] = []
    for sb in (*at_peak, *at_end):
        if sb.site not in chosen and len(chosen) < _TIMELINE_SITES:
            chosen.append(sb.site)
    if not keep or not chosen:
        return (), ()
    slot = [-1] * len(sites.sites)
    for c, s in enumerate(chosen):
        slot[sites._ids[(s.filename, s.line, s.function, s.via)]] = c
    m = len(keep)
    diffs = [[0] * (m + 1) for _ in chosen]
    left = bisect.bisect_left
    for k, sid in enumerate(a_site):
        c = slot[sid]
        if c < 0:
            continue
        lo, hi = left(keep, a_at[k]), left(keep, a_freed[k])
        if lo < hi:
            d = diffs[c]
            d[lo] += a_size[k]
            d[hi] -= a_size[k]
    values = []
    for d in diffs:
        run, col = 0, []
        for j in range(m):
            run += d[j]
            col.append(run)
        values.append(col)
    series = [Series(s.label, tuple(v / MiB for v in col)) for s, col in zip(chosen, values,
                                                                             strict=True)]
    other = tuple((totals[i] - sum(col[j] for col in values)) / MiB
                  for j, i in enumerate(keep))
    if any(v > 0 for v in other):
        series.append(Series("other sites", other))
    return tuple(round(t, 3) for t in times), tuple(series)


# ------------------------------------------------------------------------------------------
# Recording one cell
# ------------------------------------------------------------------------------------------
@dataclass
class TraceResult:
    devices: tuple[DeviceTrace, ...]
    notes: tuple[str, ...]
    added_s: float  # what tracing added to the cell: arming, snapshot, analysis, disarming
    entries: int
    top: int = TOP_DEFAULT
    saved_to: str = ""
    save_failed: str = ""  # why --save wrote nothing (also among the notes)
    snapshot: dict[str, Any] | None = field(default=None, repr=False)
    # Of added_s: inside PyTorch's own calls. On the H200 (torch 2.11) a snapshot takes
    # 0.4 ms with one entry, 23-25 ms with 10,000 and 205-253 ms with 100,000; a process's
    # first took 4-8 s more before ``inductor_lookup_skipped``.
    snapshot_s: float = 0.0  # torch.cuda.memory._snapshot()
    switch_s: float = 0.0  # _record_memory_history on and off

    @property
    def torch_s(self) -> float:
        return self.snapshot_s + self.switch_s

    @property
    def ours_s(self) -> float:
        """What gpumem_nb itself added: reading the snapshot, ranking sites, saving."""
        return max(self.added_s - self.torch_s, 0.0)

    def sites_at_failure(self) -> list[tuple[str, int]]:
        return [(sb.label, sb.nbytes) for d in self.devices for sb in d.at_oom]


class CellTracer:
    def __init__(self, torch: TorchDebug | None = None, *, max_entries: int = MAX_ENTRIES,
                 clock: Callable[[], float] = time.perf_counter,
                 wall: Callable[[], float] = time.time, session: bool = False) -> None:
        self.torch = torch if torch is not None else TorchDebug()
        self.max_entries = max_entries
        self.session = session  # %gpumem record's history is on: it, not the user's, is read
        self.clock = clock
        self.wall = wall
        self._ours = False
        self._disarmed = False  # switched off early by disarm(): stop still reads it as ours
        self._since_us: float | None = None
        self._spent_s = 0.0
        self._switch_s = 0.0  # of _spent_s, in torch's _record_memory_history
        self._notes: list[str] = []
        self._start_state: dict[str, Any] = {}  # the allocator when tracing began, for the what-if
        self._start_snapshot_s = 0.0

    def _timed_record(self, enabled: bool) -> str:
        t0 = self.clock()
        try:
            return self.torch.record_history(enabled, max_entries=self.max_entries) \
                if enabled else self.torch.record_history(False)
        finally:
            self._switch_s += self.clock() - t0

    def start(self) -> str:
        """Arm the recording. "" when armed, else why this cell cannot be traced."""
        t0 = self.clock()
        try:
            return self._start()
        finally:
            self._spent_s += self.clock() - t0

    def _start(self) -> str:
        t = self.torch
        if not t.initialized:
            return ("CUDA is not initialized yet and gpumem_nb never starts it: run a cell "
                    "that uses the GPU first (for example torch.zeros(1, device='cuda')), "
                    "then trace. This cell runs untraced.")
        if t.allocator_backend() == "cudaMallocAsync":
            return ("the cudaMallocAsync backend records no allocation history (PyTorch "
                    "supports it on the native allocator only); start the kernel without "
                    "backend:cudaMallocAsync to trace. This cell runs untraced.")
        prior = t.history_enabled()
        self._start_state = self._record_start()
        self._since_us = self.wall() * 1e6
        if prior and self.session:
            self._notes.append("The session recording (%gpumem record on) was already on: "
                               "this cell's part of it was read, and it keeps recording.")
            return ""
        if prior:
            self._notes.append("Your own allocation-history recording was already on; it "
                               "was read and left as it was.")
            return ""
        why = self._timed_record(True)
        if why:
            return f"cannot record allocation history: {why}. This cell runs untraced."
        self._ours = True
        if prior is None:
            self._notes.append("This torch cannot say whether history was recording before "
                               "the cell; it is off again now.")
        return ""

    def _record_start(self) -> dict[str, Any]:
        """The segments that exist now (no history: cheap) and, per GPU this process uses,
        what the driver has free: the what-if replays the cell from this state and judges
        OOMs against what PyTorch could have had."""
        t = self.torch
        t0 = self.clock()
        # Blocks allocated while an earlier trace recorded carry frames: listing them
        # symbolizes those too (4.5 s on the H200 for one live tensor, inductor's import).
        segments, why = t.segments_snapshot()
        self._start_snapshot_s = self.clock() - t0
        devices: dict[str, dict[str, Any]] = {}
        for i in range(t.device_count()):
            info = t.mem_info(i)
            if info is not None:
                devices[str(i)] = {"free_bytes": info[0], "total_bytes": info[1],
                                   "fraction": t.memory_fraction(i)}
        if segments is None:
            self._notes.append(f"The what-if has no start state for this cell: {why}.")
        return {"segments": segments, "devices": devices}

    def _devices_at_start(self, snap: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """The start's free memory per GPU; for a GPU that had no context yet when the cell
        began (so could not be asked then), what is free now plus what the cell reserved."""
        devices = dict(self._start_state.get("devices") or {})
        start_segments = self._start_state.get("segments") or ()
        for i, entries in enumerate(snap.get("device_traces") or ()):
            if not entries or str(i) in devices:
                continue
            info = self.torch.mem_info(i)
            if info is None:
                continue

            def held(segs: Any, dev: int = i) -> int:
                return sum(int(x.get("total_size", 0)) for x in segs
                           if int(x.get("device", dev)) == dev)

            devices[str(i)] = {
                "free_bytes": info[0] + held(snap.get("segments") or ()) - held(start_segments),
                "total_bytes": info[1], "fraction": self.torch.memory_fraction(i)}
        return devices

    def disarm(self) -> None:
        """Switch our recording off, once (it was never the user's). ``stop`` does this
        first thing; a caller whose work between ``start`` and ``stop`` failed calls it."""
        if self._ours:
            self._ours = False
            self._disarmed = True
            self._timed_record(False)

    def stop(self, *, top: int = TOP_DEFAULT, save: str | None = None,
             cells: CellText | None = None) -> TraceResult:
        """Snapshot, switch the recording back off (if it was ours), analyse, save.
        ``cells``: the cells' texts as compiled, which their lines are labelled from."""
        t0 = self.clock()
        try:
            snap, why = self.torch.memory_snapshot()
        finally:  # whatever the snapshot does, the recording is not left on
            snapshot_s = self.clock() - t0 + self._start_snapshot_s  # both of torch's
            ours = self._ours or self._disarmed
            self.disarm()
        notes = list(self._notes)
        devices: list[DeviceTrace] = []
        entries = 0
        if snap is None:
            notes.append(f"No snapshot: {why}.")
        else:
            skip = library_dirs(self.torch._modules)
            since = None if ours else self._since_us
            if self._start_state:
                try:
                    at_start = self._devices_at_start(snap)
                except Exception:  # a snapshot not in the form torch writes
                    at_start = dict(self._start_state.get("devices") or {})
                snap[START_KEY] = {**self._start_state, "since_us": since,
                                   "devices": at_start}
            traces = snap.get("device_traces")
            for i, trace in enumerate(traces if isinstance(traces, list | tuple) else ()):
                trace = _as_list(trace)
                if not trace:
                    continue
                first_t = next((u.get("time_us") for u in map(_usable, trace)
                                if u is not None), None)
                if since is not None and first_t is None:
                    notes.append("These history entries carry no timestamps, so this cell's "
                                 "cannot be told apart from earlier ones: all are shown.")
                    since = None
                d = analyze(trace, device=i, since_us=since, top=top, skip=skip, cell=cells)
                entries += d.entries
                if d.allocations:
                    devices.append(d)
                if d.skipped:
                    notes.append(f"GPU {i}: {d.skipped} history entries were not in the form "
                                 "torch writes and were skipped.")
                if ours and len(trace) >= self.max_entries:
                    notes.append(f"GPU {i}: the history buffer filled up ({self.max_entries} "
                                 "entries); the cell's earliest allocations are missing.")
                elif since is not None and first_t is not None and first_t > since:
                    notes.append(f"GPU {i}: your history buffer may have dropped this cell's "
                                 "earliest entries.")
        result = TraceResult(devices=tuple(devices), notes=tuple(notes), added_s=0.0,
                             entries=entries, top=top, snapshot=snap, snapshot_s=snapshot_s,
                             switch_s=self._switch_s)
        if save and snap is not None:
            try:
                result.saved_to = save_snapshot(snap, save)
            except Exception as e:  # refused, disk full, a snapshot pickle cannot hold
                why = safeio.reason(e) if isinstance(e, OSError) else type(e).__name__
                result.save_failed = (f"Could not write {safeio.shown(save)}: {why}; any "
                                      "file already there is unchanged.")
        elif save:
            result.save_failed = (f"Nothing was saved to {safeio.shown(save)}: there is no "
                                  "snapshot.")
        if result.save_failed:
            result.notes += (result.save_failed,)
        result.added_s = self._spent_s + self.clock() - t0
        return result


def save_snapshot(snapshot: Mapping[str, Any], path: str) -> str:
    """Pickle for PyTorch's memory_viz: protocol 4, which its reader accepts (5 it rejects).

    Written the way settings and CSV are (``safeio.write_atomic``): a regular file only,
    never through a link or into a FIFO, and a save that fails part-way leaves the old file
    whole. ``OSError`` when refused."""
    path = os.path.expanduser(path)
    data = dict(snapshot)
    safeio.write_atomic(path, lambda f: pickle.dump(data, f, protocol=_PICKLE_PROTOCOL))
    return path


# ------------------------------------------------------------------------------------------
# Views
# ------------------------------------------------------------------------------------------
class TraceReport(Shown):
    """The top sites at the peak and alive at the end, per GPU, as text and HTML."""

    HEADERS = ("bytes", "allocations", "site")

    def __init__(self, result: TraceResult, cell: Any = None) -> None:
        self.result = result
        self.cell = cell  # the %%gpumem measurement (CellReport) of the same cell

    def _sections(self) -> list[tuple[str, list[list[str]]]]:
        out: list[tuple[str, list[list[str]]]] = []
        for d in self.result.devices:
            gpu = f"GPU {d.device}"
            out.append((f"{gpu}: top sites at the cell's peak ({format_bytes(d.peak_bytes)} "
                        f"of its own allocations live at {d.peak_ms:.1f} ms)", _rows(d.at_peak)))
            if d.alive_at_end:
                out.append((f"{gpu}: still alive at the end ({format_bytes(d.end_bytes)}): "
                            "leak candidates", _rows(d.alive_at_end)))
            if d.at_oom:
                out.append((f"{gpu}: live when it ran out of memory (asked "
                            f"{format_bytes(d.oom_requested_bytes)})", _rows(d.at_oom)))
        return out

    def footer(self) -> str:
        r = self.result
        parts = [f"gpumem --trace: {r.entries} history entries; tracing added "
                 f"{r.added_s * 1e3:.1f} ms (PyTorch's snapshot {r.snapshot_s * 1e3:.1f} ms, "
                 f"switching its recording on and off {r.switch_s * 1e3:.1f} ms, gpumem_nb's "
                 f"analysis {r.ours_s * 1e3:.1f} ms)"]
        if r.saved_to:
            parts.append(f"snapshot saved to {r.saved_to} (pickle protocol 4, for "
                         "PyTorch's memory_viz)")
        return "; ".join(parts) + "."

    def __str__(self) -> str:
        lines: list[str] = []
        if not self.result.devices:
            lines.append("gpumem --trace: this cell allocated nothing on the GPU.")
        for title, rows in self._sections():
            lines += [title, text_table(self.HEADERS, rows)]
        lines += list(self.result.notes)
        lines.append(self.footer())
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        parts = []
        if not self.result.devices:
            parts.append("<div>gpumem --trace: this cell allocated nothing on the GPU.</div>")
        for title, rows in self._sections():
            parts.append(html_table(self.HEADERS, rows, caption=title,
                                    text_columns=(self.HEADERS.index("site"),)))
        parts += [f"<div>{html.escape(n)}</div>" for n in self.result.notes]
        parts.append(f"<div style='color:#777'>{html.escape(self.footer())}</div>")
        return "<div class='gpumem-nb gpumem-trace'>" + "".join(parts) + "</div>"


def _rows(sites: Iterable[SiteBytes]) -> list[list[str]]:
    return [[format_bytes(s.nbytes), str(s.allocations), _shown(s.label, _TABLE_LABEL_CHARS)]
            for s in sites]


_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#17becf", "#7f7f7f")
_OOM_COLOR = "#d62728"


class TraceTimeline:
    """Live bytes by site over the cell. Rendered by JupyterLab's bundled plotly mime
    renderer (no CDN, kept in the saved notebook); every bundle also carries a static SVG
    picture of the same stack (``svgchart``), for nbconvert, GitHub and untrusted views."""

    MIME = "application/vnd.plotly.v1+json"

    def __init__(self, device: DeviceTrace) -> None:
        self.device = device

    def _marks(self) -> list[tuple[float, str, str]]:
        d = self.device
        marks = [(d.peak_ms, "peak", plotlyjson.NEUTRAL)]
        if d.oom_ms is not None:
            marks.append((d.oom_ms, "OOM", _OOM_COLOR))
        return marks

    def figure(self) -> dict[str, Any]:
        d = self.device
        data = [{
            "type": "scatter", "mode": "lines", "name": _shown(s.label, _LEGEND_CHARS),
            "x": list(d.times_ms), "y": [round(v, 3) for v in s.mib],
            "stackgroup": "live", "line": {"shape": "hv", "width": 0.5,
                                            "color": _PALETTE[i % len(_PALETTE)]},
            "hovertemplate": "%{y:.1f} MiB<extra>" + html.escape(_shown(s.label, _HOVER_CHARS))
                             + "</extra>",
        } for i, s in enumerate(d.series)]
        marks = self._marks()
        shapes = [{"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x,
                   "y0": 0, "y1": 1, "line": {"color": color, "dash": "dot", "width": 1}}
                  for x, _, color in marks]
        annotations = [{"x": x, "y": 1, "xref": "x", "yref": "paper", "text": text,
                        "showarrow": False, "yanchor": "bottom", "font": {"color": color}}
                       for x, text, color in marks]
        layout = plotlyjson.layout(f"GPU {d.device}: this cell's live allocations by site",
                                   "ms since the cell started", "MiB live",
                                   legend_entries=len(data))
        layout.update(shapes=shapes, annotations=annotations)
        return {"data": data, "layout": layout, "config": plotlyjson.config()}

    def plot(self) -> svgchart.Plot:
        """The same stack as a static picture: each site's area on top of the ones before
        it, the peak and the OOM marked."""
        d = self.device
        xs = d.times_ms
        totals = [sum(s.mib[i] for s in d.series) for i in range(len(xs))]
        unit, unit_name = svgchart.byte_axis(max(totals, default=0.0) * MiB)
        keep = svgchart.downsample_indices(totals)
        lines, below = [], [0.0] * len(xs)
        for i, s in enumerate(d.series):
            below = [b + v for b, v in zip(below, s.mib, strict=False)]
            style = svgchart.SeriesStyle(s.label, _PALETTE[i % len(_PALETTE)], 1.0)
            lines.append(svgchart.Line(f"site-{i}", style,
                                       [(xs[j], below[j] * MiB / unit) for j in keep],
                                       area=True))
        marks = self._marks()
        span = (xs[-1] - xs[0]) if len(xs) > 1 else 0.0
        if len(marks) == 2 and span > 0 and abs(marks[1][0] - marks[0][0]) < span * (
                svgchart.label_gap_px(["peak · OOM"]) / svgchart.plot_width_px()):
            marks = [(marks[1][0], "peak · OOM", _OOM_COLOR)]  # one label, not a lost one
        return svgchart.Plot(
            lines=lines[::-1], legend=[ln.key for ln in lines],
            title=f"GPU {d.device}: this cell's live allocations by site",
            note=f"peak {format_bytes(d.peak_bytes)}", x_title="ms since the cell started",
            y_title=f"{unit_name} live", marks=[svgchart.Mark(x, t, c) for x, t, c in marks],
            summary=self.describe())

    def svg(self) -> str:
        """The static picture: a standalone SVG document."""
        return svgchart.render_plot(self.plot())

    def describe(self) -> str:
        d = self.device
        return (f"gpumem --trace timeline, GPU {d.device}: {len(d.series)} sites over "
                f"{(d.times_ms[-1] - d.times_ms[0]) if d.times_ms else 0:.1f} ms, peak "
                f"{format_bytes(d.peak_bytes)}"
                + (f", out of memory at {d.oom_ms:.1f} ms" if d.oom_ms is not None else ""))

    def __str__(self) -> str:
        return self.describe() + " (shown as a chart in JupyterLab)"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle: dict[str, Any] = {self.MIME: self.figure(), "text/plain": str(self)}
        bundle.update(svgchart.plot_bundle(self.plot()))
        return bundle


def _shown(label: str, n: int) -> str:
    """A site's label as every view shows it: cut to ``n`` characters, then printable."""
    return printable(cut(label, n))


def views(result: TraceResult, cell: Any = None) -> list[Any]:
    """What ``%%gpumem --trace`` displays: the report, then one timeline per GPU."""
    out: list[Any] = [TraceReport(result, cell)]
    out += [TraceTimeline(d) for d in result.devices if d.series]
    return out
