"""The trace analysis as it was before it became one pass (gpumem_nb 54ccb68's ``_Replay``
and ``analyze``), kept verbatim as the reference that tests/test_trace_equivalence.py holds
the fast one to: whatever a user sees must come out the same."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpumem_nb.trace.entries import _MAX_LINE, _as_list, _count, _Malformed, _plain, _usable
from gpumem_nb.trace.replay import (
    _MAX_POINTS,
    _TIMELINE_SITES,
    TOP_DEFAULT,
    DeviceTrace,
    MiB,
    Series,
    SiteBytes,
    _ranked,
)
from gpumem_nb.trace.sites import _CELL_FILE, Site, _is_library, _is_outer


class _Replay:
    """Live allocations by site, advanced one history entry at a time.

    A free counts at ``free_requested`` (when the tensor dies, as ``allocated_bytes``
    counts it); ``free_completed`` only when no request was seen (histories recorded
    with that action skipped). Frees of allocations made before the window are ignored.
    """

    def __init__(self, skip: tuple[str, ...]) -> None:
        self.skip = skip
        self.live: dict[int, tuple[int, Site]] = {}
        self.by_site: dict[Site, list[int]] = {}
        self.total = 0
        self._requested: set[int] = set()
        self._sites: dict[tuple[Any, ...], Site] = {}
        self._libs: dict[str, bool] = {}
        self._flips: dict[tuple[str, str], bool] = {}
        self.last_site: Site | None = None

    def _frame(self, f: Any) -> tuple[str, int, str]:
        """One frame's (filename, line, name), or ``_Malformed``."""
        p = _plain(f)
        if p is None:
            raise _Malformed  # a frame that is not a dict, or one whose methods raise
        fn, line, name = p.get("filename"), p.get("line"), p.get("name")
        if not (isinstance(fn, str | None) and isinstance(name, str | None)
                and (line is None or (_count(line) and line < _MAX_LINE))):
            raise _Malformed
        return fn or "", line or 0, name or ""

    def _lib(self, filename: str) -> bool:
        v = self._libs.get(filename)
        if v is None:
            v = self._libs[filename] = _is_library(filename, self.skip)
        return v

    def site(self, frames: Any) -> Site:
        """``site_of`` for one entry's frames, reading only the frames it needs: the
        innermost of the user's and, inside a function, the way out to the cell. A history
        of 100,000 entries with 30 frames each took 1.5 s when every frame was read."""
        if not isinstance(frames, list | tuple):
            raise _Malformed
        if not frames:
            return self._cached("", 0, "", "")
        first, last = self._frame(frames[0]), self._frame(frames[-1])
        ends = (first[0], last[0])
        flip = self._flips.get(ends)
        if flip is None:
            flip = self._flips[ends] = _is_outer({"filename": first[0]}) and \
                not _is_outer({"filename": last[0]})
        seq = frames[::-1] if flip else frames  # a build that records outermost first
        top = last if flip else first
        inner_i = -1
        inner = None
        if not self._lib(top[0]):
            inner_i, inner = 0, top
        else:
            for i in range(1, len(seq)):
                fr = self._frame(seq[i])
                if not self._lib(fr[0]):
                    inner_i, inner = i, fr
                    break
        if inner is None:
            return self._cached(*top, "")
        if inner[2] == "<module>" and _CELL_FILE.search(inner[0]):
            return self._cached(*inner, "")
        for f in seq[inner_i + 1:]:
            fr = self._frame(f)
            if fr[2] == "<module>" and _CELL_FILE.search(fr[0]):
                return self._cached(*inner, f"cell line {fr[1]}")
        return self._cached(*inner, "")

    def _cached(self, filename: str, line: int, name: str, via: str) -> Site:
        key = (filename, line, name, via)
        s = self._sites.get(key)
        if s is None:
            s = self._sites[key] = Site(filename, line, name, via)
        return s

    def step(self, e: Mapping[str, Any], site: Site | None = None) -> str:
        """Advance by one entry; ``site``: the allocation's, when an earlier pass found it."""
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc" and addr is not None:
            size = int(e.get("size", 0))
            # May raise _Malformed: nothing changed yet.
            s = site if site is not None else self.site(e.get("frames") or ())
            self.last_site = s
            self.live[addr] = (size, s)
            self._requested.discard(addr)
            v = self.by_site.setdefault(s, [0, 0])
            v[0] += size
            v[1] += 1
            self.total += size
            return "alloc"
        if action == "free_requested" and addr in self.live:
            self._requested.add(addr)
            self._free(addr)
        elif action == "free_completed":
            if addr in self._requested:
                self._requested.discard(addr)
            elif addr in self.live:
                self._free(addr)
        return str(action)

    def _free(self, addr: int) -> None:
        size, s = self.live.pop(addr)
        v = self.by_site[s]
        v[0] -= size
        v[1] -= 1
        self.total -= size

    def copy_sites(self) -> dict[Site, list[int]]:
        return {s: list(v) for s, v in self.by_site.items()}


def reference_analyze(entries: Sequence[Mapping[str, Any]], *, device: int = 0,
            since_us: float | None = None, top: int = TOP_DEFAULT,
            skip: tuple[str, ...] = ()) -> DeviceTrace:
    """Replay one device's history. Only allocations made in the window count, so the
    figures are this cell's own: at its peak, at its end, and at an OOM entry.

    Entries that are not what torch writes (not a dict, a size, line or time that is not a
    number, frames that are not a list of dicts) are skipped and counted in ``skipped``."""
    given = _as_list(entries)
    usable = [u for u in map(_usable, given) if u is not None]
    skipped = len(given) - len(usable)
    window = [e for e in usable
              if since_us is None or e.get("time_us") is None or e["time_us"] >= since_us]
    # First pass: where the peak and the OOM are; entries it cannot read are dropped.
    first = _Replay(skip)
    peak = 0
    peak_i = oom_i = -1
    oom_size: int | None = None
    allocations = 0
    readable = []
    sites: list[Site | None] = []
    for e in window:
        first.last_site = None
        try:
            action = first.step(e)
        except _Malformed:
            skipped += 1
            continue
        readable.append(e)
        sites.append(first.last_site)
        i = len(readable) - 1
        if action == "alloc":
            allocations += 1
            if first.total > peak:
                peak, peak_i = first.total, i
        elif action == "oom":
            oom_i, oom_size = i, int(e.get("size", 0))
    window = readable
    # Second pass: who was live there, and the series at the instants to draw.
    n = len(window)
    step = max(1, -(-n // _MAX_POINTS))
    keep = sorted({*range(0, n, step), n - 1, *(i for i in (peak_i, oom_i) if i >= 0)}) \
        if n else []
    keep_set = set(keep)
    second = _Replay(skip)  # reads no frame: each allocation's site is the first pass's
    at_peak: dict[Site, list[int]] = {}
    at_oom: dict[Site, list[int]] = {}
    samples: list[dict[Site, int]] = []
    for i, e in enumerate(window):
        second.step(e, sites[i])
        if i == peak_i:
            at_peak = second.copy_sites()
        if i == oom_i:
            at_oom = second.copy_sites()
        if i in keep_set:
            samples.append({s: v[0] for s, v in second.by_site.items() if v[0]})
    t0 = _t0(window, since_us)

    def ms(i: int) -> float:
        t = window[i].get("time_us") if 0 <= i < n else None
        return (float(t) - t0) / 1e3 if t is not None and t0 is not None else float(i)

    ranked_peak = _ranked(at_peak, top)
    ranked_end = _ranked(first.by_site, top)
    times, series = _series(samples, [ms(i) for i in keep], ranked_peak, ranked_end)
    return DeviceTrace(
        device=device, entries=n, allocations=allocations, peak_bytes=peak,
        peak_ms=ms(peak_i), end_bytes=first.total, at_peak=ranked_peak,
        alive_at_end=ranked_end, at_oom=_ranked(at_oom, top), oom_requested_bytes=oom_size,
        oom_ms=ms(oom_i) if oom_i >= 0 else None, times_ms=times, series=series,
        skipped=skipped)


def _t0(window: Sequence[Mapping[str, Any]], since_us: float | None) -> float | None:
    if since_us is not None:
        return since_us
    first = next((e.get("time_us") for e in window if e.get("time_us") is not None), None)
    return float(first) if first is not None else None


def _series(samples: Sequence[dict[Site, int]], times: Sequence[float],
            at_peak: Sequence[SiteBytes], at_end: Sequence[SiteBytes],
            ) -> tuple[tuple[float, ...], tuple[Series, ...]]:
    """Live MiB per site at each kept instant for the biggest sites, the rest as "other"."""
    chosen: list[Site] = []
    for sb in (*at_peak, *at_end):
        if sb.site not in chosen and len(chosen) < _TIMELINE_SITES:
            chosen.append(sb.site)
    if not samples or not chosen:
        return (), ()
    series = [Series(s.label, tuple(smp.get(s, 0) / MiB for smp in samples))
              for s in chosen]
    other = tuple((sum(smp.values()) - sum(smp.get(s, 0) for s in chosen)) / MiB
                  for smp in samples)
    if any(v > 0 for v in other):
        series.append(Series("other sites", other))
    return tuple(round(t, 3) for t in times), tuple(series)


