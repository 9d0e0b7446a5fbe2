"""``analyze``: one device's history replayed in one pass (pure, table-testable): the sites
that held the most at the cell's peak, those alive at its end, those live at an OOM, and
the timeline's series.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..celltext import CellText
from .entries import _MAX_FIELD, _MAX_TIME_US, _as_list, _Malformed, _plain, _usable
from .frames import _Sites
from .sites import Site

__all__ = ["TOP_DEFAULT", "DeviceTrace", "MiB", "Series", "SiteBytes", "analyze"]

TOP_DEFAULT = 5
_TIMELINE_SITES = 8
MiB = 1 << 20
_MAX_POINTS = 1500


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


_NEVER = 1 << 62  # the entry index of a free that never came


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
