"""The smallest GPU each setting needs: the recorded work replayed at smaller and smaller
memory until it runs out (bisection on what PyTorch may reserve).

What PyTorch may reserve is checked as ``set_per_process_memory_fraction``'s cap is (the
same check the allocator makes, with its free-the-cache-and-retry before giving up), so a
real run capped at the minimum found fits. The bisection assumes that more memory never
makes a run fail, and mostly it does not: the allocator frees its cache and retries before an
OOM. But not always: a history that grows tensors by ``torch.cat`` fits in some rooms a
little under its minimum and runs out in others between (which blocks are cached when the
cap is reached depends on the exact room), in the replay and on the GPU alike. So below the
minimum the search goes on down, a step at a time, until two rooms in a row run out, and a
lower room that fits is said as the least the run can fit in, not reliably (only where the
cap the minimum allows is under ``UNEVEN_BELOW`` x the unlimited peak: where little was
cached, the rooms under it differ little, and each costs a whole replay). It starts from
the unlimited replay's peak, and doubles past it when a run needs more room than its peak
(the cap is checked against a whole request before the pages it needs are mapped).

A GPU size's row ("fits on 40 GB") takes an N GB GPU as N GiB of NVML's total, less two
things PyTorch can never reserve:
- what the driver reserves for itself (NVML's total less CUDA's): this GPU's, read from NVML,
  where there is one, else ``DRIVER_RESERVE_BYTES``, said to be assumed. Left out, the H200
  itself was overstated by its 615 MiB (the tutorials review, M8);
- what the CUDA context and the libraries hold outside PyTorch's cache: this process's own,
  measured (NVML's line less what PyTorch reserved) when the replayed work is this process's,
  else ``CONTEXT_BYTES``, said to be assumed. A fixed 512 MiB was under every context the H200
  tutorials measured (522-742 MiB), and so called a 6 GB GPU enough for 5.36 GiB.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..units import format_bytes
from .allocstate import Limits
from .config import AllocatorSettings
from .replay import CompiledTrace, replay

__all__ = [
    "CONTEXT_BYTES",
    "DRIVER_RESERVE_BYTES",
    "GPU_SIZES_GB",
    "PROBE_MISSES",
    "PROBE_MOST",
    "STEP_BYTES",
    "STEP_FRACTION",
    "UNEVEN_BELOW",
    "DemandRecords",
    "Fit",
    "FitRow",
    "GiB",
    "MiB",
    "Rooms",
    "lowest_room",
    "min_room",
    "uneven_worth_trying",
    "usable_bytes",
]

GiB = 1 << 30
MiB = 1 << 20
GPU_SIZES_GB = (24, 40, 48, 80, 94, 141)
CONTEXT_BYTES = 512 * MiB  # CUDA context and workspaces: not PyTorch's to reserve
# NVML v2's ``reserved`` on the H200 the tutorials ran on (644,939,776 B, tutorial 01): the
# driver's own, outside CUDA's total. Other GPUs differ; read where a GPU is at hand.
DRIVER_RESERVE_BYTES = 644_939_776
STEP_BYTES = 2 * MiB  # the search stops this close to the minimum (a large segment's size)
STEP_FRACTION = 0.005  # or within 0.5% of it: a real run 2% under the minimum runs out


@dataclass(frozen=True)
class FitRow:
    label: str
    setting: str
    min_bytes: int | None  # smallest memory PyTorch may use in which nothing runs out
    replays: int = 0
    note: str = ""
    # A smaller room that also fits, where a room between runs out: the least the run can
    # fit in, not reliably (None: every room tried under min_bytes runs out).
    lowest_bytes: int | None = None

    def fits(self, gpu_gb: float, context_bytes: int = CONTEXT_BYTES,
             reserve_bytes: int = DRIVER_RESERVE_BYTES) -> bool | None:
        if self.min_bytes is None:
            return None
        return self.min_bytes <= usable_bytes(gpu_gb, context_bytes, reserve_bytes)


def usable_bytes(gpu_gb: float, context_bytes: int = CONTEXT_BYTES,
                 reserve_bytes: int = DRIVER_RESERVE_BYTES) -> int:
    """What PyTorch can reserve on an N GB GPU: N GiB less the driver's reserve and the
    context."""
    return int(gpu_gb * GiB) - reserve_bytes - context_bytes


def _room_limits(settings: AllocatorSettings, room: int) -> Limits:
    """The limits of a GPU leaving ``room`` bytes to PyTorch, under ``settings``'s own
    fraction if it has one (its cap is the fraction of the room)."""
    f = settings.per_process_memory_fraction
    allowed = int(f * room) if f is not None and f < 1.0 else room
    return Limits(allowed_bytes=allowed, capacity_bytes=room)


class DemandRecords:
    """What an unlimited replay's limit checks say of the same replay capped at ``cap``
    bytes, without replaying it (``DeviceCachingAllocator.demand_records``): the capped
    replay is the unlimited one up to the first check that asks more than ``cap``; there the
    allocator gives back every cached whole segment and retries, and runs out when the retry
    still asks more than ``cap``. A cap at least the largest demand is the unlimited replay,
    which fitted."""

    def __init__(self, flat: Sequence[int]) -> None:
        self.demands = list(flat[0::2])  # increasing
        self.retries = list(flat[1::2])  # -1: not known without replaying

    def fits(self, cap: int) -> bool | None:
        """Whether a replay capped at ``cap`` fits; None when only a replay can say."""
        j = bisect_right(self.demands, cap)
        if j == len(self.demands):
            return True
        return False if self.retries[j] > cap else None

    def largest_failing(self) -> int | None:
        """The largest cap ``fits`` says runs out: caps from the check before's demand up
        to the one of check j first fail at check j, and run out under its retry's."""
        d, r = self.demands, self.retries
        for j in range(len(d) - 1, -1, -1):
            top = min(d[j], r[j]) - 1
            if top >= (d[j - 1] if j else 0):
                return top
        return None


def min_room(trace: CompiledTrace, settings: AllocatorSettings, *, start_segments: Sequence,
             device: int, start_page_bytes: int, unlimited_peak_bytes: int,
             peak_allocated_bytes: int, device_total_bytes: int | None = None,
             unlimited_max_demand_bytes: int | None = None,
             demand_records: Sequence[int] | None = None,
             progress: Callable[[int, int], None] | None = None) -> tuple[int | None, int]:
    """(the smallest room in which the replay has no OOM, replays made). The GPU's own size
    stays what it is (an expandable segment's address space is sized from it): only what
    PyTorch may reserve shrinks, as a memory fraction shrinks it.

    The search stops once the room that fits is within ``STEP_BYTES`` or ``STEP_FRACTION``
    of it of one that does not, that fraction taken of the room found, not of where the
    search began: taken of the unlimited peak (a ``torch.cat`` growth session caches 2-4
    times what it needs), it stopped up to 2% above the minimum, and real runs capped 2%
    under it fitted. ``unlimited_max_demand_bytes``: the most the unlimited replay's limit
    checks asked for; with no GC, a room whose limits reach it is that replay, which fitted,
    so the unlimited peak needs no replay of its own when it is that room. The first room
    tried then is one step under it: a history that needs its whole unlimited peak (nothing
    cached can be given back) is settled by that one replay.

    ``demand_records``: the unlimited replay's (``DemandRecords``), with no GC: a room they
    decide is not replayed, and the largest room they say runs out is where the search
    starts from (a history that runs out at the first check past its cap needs no replay)."""
    f = settings.per_process_memory_fraction
    rooms = Rooms(trace, settings, start_segments=start_segments, device=device,
                  start_page_bytes=start_page_bytes, device_total_bytes=device_total_bytes,
                  demand_records=demand_records, progress=progress)
    records = rooms.records
    fits, step = rooms.fits, _step

    scale = 1.0 / f if f is not None and 0 < f < 1.0 else 1.0
    hi = max(int(unlimited_peak_bytes * scale) + 1, 1)
    lo = max(int(peak_allocated_bytes * scale) - 1, 0)  # live bytes alone do not fit below
    if records is not None and scale == 1.0:
        failing = records.largest_failing()
        if failing is not None and lo < failing < hi:
            lo = failing
    # Whether a room of ``hi`` is known to fit without replaying it (see above).
    proved = False
    demand = unlimited_max_demand_bytes
    if demand is not None and not settings.garbage_collection_threshold:
        lim = _room_limits(settings, hi)
        proved = (lim.allowed_bytes or 0) >= demand and (lim.capacity_bytes or 0) >= demand
    first = True
    while True:
        while hi - lo > step(hi):
            mid = hi - step(hi) if first and proved else (lo + hi) // 2
            first = False
            if fits(mid):
                hi, proved = mid, True
            else:
                lo = mid
        if proved or fits(hi):
            return hi, rooms.replays
        # The cap is checked against a whole request before the pages it needs are mapped
        # (an expandable segment's check): a run can need more room than its unlimited peak.
        if hi > 1 << 50:
            return None, rooms.replays
        lo, hi = hi, hi * 2


def _step(room: int) -> int:
    return max(STEP_BYTES, int(room * STEP_FRACTION))


PROBE_MISSES = 2  # rooms in a row that run out, under the minimum, before the search stops
PROBE_MOST = 12  # rooms tried under the minimum at most (6% at 0.5% a step)
UNEVEN_BELOW = 0.9  # rooms under the minimum are tried when it is under this x the peak


class Rooms:
    """Whether a replay capped at a room fits: decided by the unlimited replay's demand
    records where they can, else replayed; counts the replays."""

    def __init__(self, trace: CompiledTrace, settings: AllocatorSettings, *,
                 start_segments: Sequence, device: int, start_page_bytes: int,
                 device_total_bytes: int | None, demand_records: Sequence[int] | None,
                 progress: Callable[[int, int], None] | None) -> None:
        self.trace, self.settings = trace, settings
        self.start_segments, self.device = start_segments, device
        self.start_page_bytes, self.device_total_bytes = start_page_bytes, device_total_bytes
        self.records = DemandRecords(demand_records) if demand_records is not None and \
            not settings.garbage_collection_threshold else None
        self.progress = progress
        self.replays = 0

    def fits(self, room: int) -> bool:
        lim = _room_limits(self.settings, room)
        if self.records is not None:
            known = self.records.fits(min(lim.allowed_bytes or 0, lim.capacity_bytes or 0))
            if known is not None:
                return known
        self.replays += 1
        r = replay(self.trace, self.settings, limits=lim, start_segments=self.start_segments,
                   device=self.device, device_total_bytes=self.device_total_bytes,
                   start_page_bytes=self.start_page_bytes, stop_at_oom=True,
                   progress=self.progress)
        return not r.oom


def uneven_worth_trying(settings: AllocatorSettings, need: int, peak_bytes: int) -> bool:
    """Whether to look under the minimum: when what the cap allows there (the room, or a
    memory fraction of it) is under ``UNEVEN_BELOW`` x the unlimited replay's peak."""
    allowed = _room_limits(settings, need).allowed_bytes
    return allowed is not None and allowed < UNEVEN_BELOW * peak_bytes


def lowest_room(rooms: Rooms, need: int, *, floor_bytes: int = 0) -> int | None:
    """The smallest room under ``need`` (the bisection's minimum) that also fits, trying one
    search step lower at a time until ``PROBE_MISSES`` rooms in a row run out; None when the
    first ones do (the usual case, which costs that many replays at most, most of them
    decided by the demand records or stopped at an early OOM). Never under ``floor_bytes``
    (the live bytes' peak, as a room), where nothing fits."""
    lowest, misses, room = None, 0, need
    f = rooms.settings.per_process_memory_fraction
    scale = 1.0 / f if f is not None and 0 < f < 1.0 else 1.0
    for _ in range(PROBE_MOST):
        room -= _step(room)
        if room <= 0 or room < floor_bytes * scale:
            break  # the live bytes alone do not fit below their peak
        if rooms.fits(room):
            lowest, misses = room, 0
        else:
            misses += 1
            if misses >= PROBE_MISSES:
                break
    return lowest


@dataclass(frozen=True)
class Fit:
    rows: tuple[FitRow, ...]
    target_gb: float | None = None
    context_bytes: int = CONTEXT_BYTES  # kept from each GPU size for the context
    context_measured: bool = False  # this process's, read now; else CONTEXT_BYTES, assumed
    reserve_bytes: int = DRIVER_RESERVE_BYTES  # kept from each GPU size for the driver
    reserve_measured: bool = False  # this GPU's, from NVML; else DRIVER_RESERVE_BYTES

    def fits(self, row: FitRow, gpu_gb: float) -> bool | None:
        """Whether ``row`` fits an N GB GPU, less this fit's reserve and context."""
        return row.fits(gpu_gb, self.context_bytes, self.reserve_bytes)

    def usable_bytes(self, gpu_gb: float) -> int:
        """What PyTorch can reserve on an N GB GPU, as this fit takes it."""
        return usable_bytes(gpu_gb, self.context_bytes, self.reserve_bytes)

    def gpu_table(self) -> tuple[tuple[str, ...], list[list[str]]]:
        headers = ("setting", "needs", *(f"{g} GB" for g in GPU_SIZES_GB))
        out = []
        for r in self.rows:
            if r.min_bytes is None:
                out.append([r.label, r.note or "cannot be modelled", *("" for _ in GPU_SIZES_GB)])
                continue
            out.append([r.label, format_bytes(r.min_bytes),
                        *("yes" if self.fits(r, g) else "no"
                          for g in GPU_SIZES_GB)])
        return headers, out

    def sentence(self, gpu_gb: float | None = None) -> str:
        """The cheapest setting that fits an N GB GPU, in a sentence."""
        gb = gpu_gb if gpu_gb is not None else self.target_gb
        known = [r for r in self.rows if r.min_bytes is not None]
        if not known:
            return "No setting could be modelled, so no GPU size is predicted."
        best = min(known, key=lambda r: r.min_bytes or 0)
        if gb is None:
            gpu_gb_needed = -(-((best.min_bytes or 0) + self.reserve_bytes + self.context_bytes)
                              // GiB)
            return (f"The least memory: {best.label}, {format_bytes(best.min_bytes)} for "
                    f"PyTorch (a GPU of {gpu_gb_needed} GB or more).")
        if self.usable_bytes(gb) <= 0:
            return (f"On a {gb:g} GB GPU the driver's reserve and the context leave PyTorch "
                    f"nothing: the least is {best.label} at {format_bytes(best.min_bytes)}.")
        fitting = [r for r in known if self.fits(r, gb)]
        room = format_bytes(self.usable_bytes(gb))
        if not fitting:
            return (f"On a {gb:g} GB GPU ({room} for PyTorch) no setting tried fits: the "
                    f"least is {best.label} at {format_bytes(best.min_bytes)}.")
        cheapest = min(fitting, key=lambda r: r.min_bytes or 0)
        others = [r.label for r in fitting if r is not cheapest]
        short = [r.label for r in known if not self.fits(r, gb)]
        rest = f"; {', '.join(others)} also fit{'s' if len(others) == 1 else ''}" \
            if others else ""
        rest += f"; {', '.join(short)} {'does' if len(short) == 1 else 'do'} not" \
            if short else ""
        return (f"On a {gb:g} GB GPU ({room} for PyTorch) {cheapest.label} fits and needs "
                f"the least, {format_bytes(cheapest.min_bytes)}{rest}.")

    def lines(self) -> list[str]:
        from ..report import text_table

        headers, rows = self.gpu_table()
        whose = ("held by this process's CUDA context and libraries outside PyTorch, measured now"
                 if self.context_measured else
                 "for the CUDA context, assumed: the replayed process's was not measured")
        driver = ("this GPU's, read from NVML" if self.reserve_measured else
                  "assumed: the H200's, as no GPU's could be read")
        return ["Smallest memory each setting needs (replayed by bisection; an N GB GPU is "
                f"taken as N GiB less {format_bytes(self.reserve_bytes)} the driver reserves "
                f"for itself, {driver}, and {format_bytes(self.context_bytes)} {whose}):",
                text_table(headers, rows), self.sentence(), *self.uneven_lines()]

    def uneven_lines(self) -> list[str]:
        """A setting that fits in a smaller room too, with a room between that runs out."""
        return [f"{r.label}: also fits in {format_bytes(r.lowest_bytes)}, but not in every "
                f"room between that and {format_bytes(r.min_bytes)} (which blocks are cached "
                "when the cap is reached depends on the exact room): below "
                f"{format_bytes(r.min_bytes)} a real run may fit or run out."
                for r in self.rows if r.lowest_bytes is not None and r.min_bytes is not None]

