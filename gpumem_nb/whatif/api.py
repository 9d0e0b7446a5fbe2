"""The what-if's entry points: ``whatif()`` for a snapshot, ``run()`` for a history already
read, and the OOM explainer's line."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..units import format_bytes
from .allocstate import Limits
from .config import AllocatorSettings, SettingError, parse_settings, settings_of_snapshot
from .fields import quoted
from .fit import Fit, FitRow, Rooms, lowest_room, min_room, uneven_worth_trying
from .progress import Progress
from .replay import Replayed, compile_trace, replay, series
from .report import WhatIf, WhatIfChart, WhatIfRow, views
from .rules import SIZE_MAX, get_allocation_size, kLargeBuffer, kSmallBuffer, round_size
from .snapshot import SESSION_KEY, NoHistory, SnapshotError, TraceInput, load, trace_input

__all__ = [
    "DEFAULT_ALTERNATIVES",
    "MAX_CAPACITY_BYTES",
    "MIN_GPU_BYTES",
    "NoHistory",
    "Progress",
    "SettingError",
    "SnapshotError",
    "WhatIf",
    "WhatIfChart",
    "WhatIfRow",
    "check_capacity",
    "expandable_oom_line",
    "left_out_oom_line",
    "load",
    "parse_settings",
    "parse_settings_or_none",
    "plausible_gpu_bytes",
    "run",
    "same_rules",
    "trace_input",
    "views",
    "whatif",
    "with_setting",
]

ASYNC_NOTE = ("cudaMallocAsync lives inside the CUDA driver, which decides where memory goes; "
              "it cannot be modelled, so nothing is predicted for it.")
DEFAULT_ALTERNATIVES = ("expandable_segments:True", "max_split_size_mb:64",
                        "max_split_size_mb:512", "roundup_power2_divisions:4")
MAX_CAPACITY_BYTES = 1 << 50  # 1024 TiB, as the threshold setting: more is a typo
MiB = 1 << 20
# The OOM explainer's line replays at most this many history entries: 20,000 took 44-87 ms
# to read and replay under expandable segments on the 2-core development machine (load 1.7,
# benchmarks/bench_whatif_bound.py), so 15,000 leave room under the explainer's 100 ms on a
# busier one. Past it the line says how to get the replay.
OOM_LINE_MAX_ENTRIES = 15_000
# While a session is recorded, torch's snapshot comes first, and its cost grows with the
# history (about 0.7 s per 100,000 entries with Python stacks): 6,000 entries take about
# 42 ms to read and 26 ms to replay, under the explainer's 100 ms. How many there are is read
# from the allocator's counters before any snapshot (``SessionRecorder.entries_estimate``).
SESSION_OOM_LINE_MAX_ENTRIES = 6_000


def same_rules(a: AllocatorSettings, b: AllocatorSettings) -> bool:
    """Whether two settings make the allocator behave the same (text and inert keys aside)."""
    return replace(a, text="", ignored_keys=()) == replace(b, text="", ignored_keys=())


def whatif(snapshot: Mapping[str, object] | str | os.PathLike[str], settings: Sequence[str],
           capacity_bytes: int | None = None, *, device: int | None = None,
           fit: bool | float = False, total_bytes: int | None = None) -> WhatIf:
    """``gpumem_nb.whatif`` (documented there)."""
    t_start = time.perf_counter()
    if isinstance(settings, str):
        raise SettingError("settings is a list of PYTORCH_ALLOC_CONF strings: write "
                           f"[{quoted(settings)}] for one")
    if not isinstance(settings, Iterable):
        raise TypeError("settings is a list of PYTORCH_ALLOC_CONF strings (\"\" for the "
                        f"defaults), not {type(settings).__name__}")
    parsed = [parse_settings(s) for s in settings]
    if capacity_bytes is not None:
        check_capacity(capacity_bytes)
    if total_bytes is not None:
        check_capacity(total_bytes, "total_bytes")
    fit_gb = check_fit(fit)
    ti = trace_input(load(snapshot), device)
    return run(ti, parsed, capacity_bytes, t_start=t_start, fit=fit is not False,
               fit_gb=fit_gb, total_bytes=total_bytes)


def check_fit(fit: object) -> float | None:
    """``fit``: False, True, or the GPU size in GB to name the cheapest setting for."""
    if fit is False or fit is True:
        return None
    # At least 2 GB: the driver's reserve and the CUDA context (about 1.1 GiB assumed) fill a
    # 1 GB GPU, and at 0.5 GB the sentence said "-512.00 MiB for PyTorch".
    if isinstance(fit, int | float) and not isinstance(fit, bool) and \
            MIN_FIT_GB <= fit <= MAX_FIT_GB:
        return float(fit)
    raise SettingError(f"fit is True, False or a GPU size in GB from {MIN_FIT_GB} to "
                       f"{MAX_FIT_GB}, such as 40, not {fit!r:.60}")


MIN_FIT_GB = 2
MAX_FIT_GB = 1 << 20


MIN_GPU_BYTES = 256 << 20  # less is no GPU PyTorch runs on: a size given without its unit


def plausible_gpu_bytes(total_bytes: int) -> bool:
    """Whether a GPU's whole memory can be this: "80", meant as 80 GiB, is 80 bytes, under
    which every row would run out."""
    return total_bytes >= MIN_GPU_BYTES


def check_capacity(capacity_bytes: object, name: str = "capacity_bytes") -> int:
    """A capacity in bytes, or a ``SettingError`` that says what one is."""
    if not isinstance(capacity_bytes, int) or isinstance(capacity_bytes, bool) or \
            not 0 < capacity_bytes <= MAX_CAPACITY_BYTES:
        raise SettingError(f"{name} is a number of bytes between 1 and "
                           f"{MAX_CAPACITY_BYTES} ({format_bytes(MAX_CAPACITY_BYTES)}), not "
                           f"{capacity_bytes!r:.60}")
    return capacity_bytes


def run(ti: TraceInput, parsed: Sequence[AllocatorSettings], capacity_bytes: int | None = None,
        *, allowed_bytes: int | None = None, t_start: float | None = None, fit: bool = False,
        fit_gb: float | None = None, total_bytes: int | None = None,
        context_bytes: int | None = None, reserve_bytes: int | None = None,
        progress: Progress | None = None) -> WhatIf:
    """``_run``, with ``progress`` (the notebook's line for a long what-if, ``Progress``)
    told what is under way, emptied at the end, and told of a Ctrl-C."""
    try:
        out = _run(ti, parsed, capacity_bytes, progress, allowed_bytes=allowed_bytes,
                   t_start=t_start, fit=fit, fit_gb=fit_gb, total_bytes=total_bytes,
                   context_bytes=context_bytes, reserve_bytes=reserve_bytes)
    except KeyboardInterrupt:
        if progress is not None:
            progress.interrupted()
        raise
    except BaseException:
        if progress is not None:
            progress.done()
        raise
    if progress is not None:
        progress.done()
    return out


def _fit(rows: Sequence[FitRow], fit_gb: float | None, context_bytes: int | None,
         reserve_bytes: int | None) -> Fit:
    """The fit, with each of the context and the driver's reserve measured where read (a
    context of 0 is NVML not attributing memory to the process, not an empty context)."""
    measured: dict[str, Any] = {}
    if context_bytes is not None and context_bytes > 0:
        measured.update(context_bytes=context_bytes, context_measured=True)
    if reserve_bytes is not None and reserve_bytes >= 0:
        measured.update(reserve_bytes=reserve_bytes, reserve_measured=True)
    return Fit(tuple(rows), fit_gb, **measured)


def _run(ti: TraceInput, parsed: Sequence[AllocatorSettings], capacity_bytes: int | None,
         progress: Progress | None, *, allowed_bytes: int | None = None,
         t_start: float | None = None, fit: bool = False, fit_gb: float | None = None,
         total_bytes: int | None = None, context_bytes: int | None = None,
         reserve_bytes: int | None = None) -> WhatIf:
    """Replay ``ti`` under each setting. ``capacity_bytes`` is what the driver could hand out;
    ``allowed_bytes`` a memory fraction's cap (checked as the allocator checks it), which
    otherwise comes from the setting's or the recorded process's fraction of the GPU's
    memory (``total_bytes`` when the snapshot does not say it, as ``_dump_snapshot``'s does
    not). ``fit``: also find each setting's smallest GPU (``fit.py``), each GPU size less
    ``reserve_bytes`` (the driver's, read from this GPU) and ``context_bytes`` (the recorded
    process's memory outside PyTorch), each where measured."""
    t_start = time.perf_counter() if t_start is None else t_start
    notes = list(ti.notes)
    recorded = parse_settings_or_none(ti.recorded_setting)
    events = progress.events if progress is not None else None
    trace = compile_trace(ti.entries, **_recorded_limits(ti, recorded, total_bytes),
                          progress=events)
    if recorded is None:
        notes.append(f"The recorded setting {ti.recorded_setting!r} could not be read; no row "
                     "is marked as the current one.")
    cap = capacity_bytes if capacity_bytes is not None else ti.capacity_bytes
    st = ti.start
    total = st.device_total_bytes or total_bytes
    if total_bytes is not None and st.device_total_bytes and total_bytes != total:
        # Said, not silently dropped: a user asking "on an 80 GB GPU?" gets the answer
        # for the GPU that was recorded otherwise.
        notes.append(f"The GPU size given ({format_bytes(total_bytes)}, --gpu or "
                     f"total_bytes=) is not used: the recording says GPU {ti.device} has "
                     f"{format_bytes(total)}. To judge another GPU, use --capacity or --fit.")
    start_page = recorded.large_segment_size if recorded is not None else None
    t0 = st.since_us if st.since_us is not None else next(
        (t for t in trace.times_us if t is not None), None)

    # An event without a usable time takes the last one before it (a row's OOM said "at
    # 1e+305 ms" for a time_us of 1e308, or the event's number as milliseconds).
    known: list[float | None] = []
    for t in trace.times_us:
        known.append(t if t is not None else (known[-1] if known else t0))

    def ms(i: int) -> float:
        if not known:
            return 0.0
        t = known[min(i, len(known) - 1)]
        return (t - t0) / 1e3 if t is not None and t0 is not None else float(i)

    rows: list[WhatIfRow] = []
    fits: list[FitRow] = []
    unmatched = 0
    # Settings that act alike on this history share their replays (see ``_acting``).
    most = max((e[2] for e in trace.events), default=0)
    held = max((int(seg.get("total_size", 0)) for seg in st.segments or ()), default=0)
    done: dict[AllocatorSettings, tuple[Replayed, tuple[int | None, int, int | None], str]] = {}
    for k, s in enumerate(parsed):
        of = f"({k + 1} of {len(parsed)} settings)"
        if progress is not None:
            progress.begin(f"replaying under {s.label} {of}")
        current = recorded is not None and same_rules(s, recorded)
        if not s.modelled:
            rows.append(WhatIfRow(setting=s.text, label=s.label, current=current,
                                  modelled=False, note=ASYNC_NOTE))
            if fit:
                fits.append(FitRow(s.label, s.text, None, note="cannot be modelled"))
            continue
        row_notes = []
        fraction = s.per_process_memory_fraction
        if fraction is None:
            fraction = st.memory_fraction
        allowed = allowed_bytes
        if allowed is None and fraction is not None and fraction < 1.0:
            if total:
                allowed = int(fraction * total)
            else:
                row_notes.append("The memory fraction is ignored: the snapshot does not say "
                                 "how much memory the GPU has (give it: --gpu SIZE, "
                                 "total_bytes=).")
        if s.garbage_collection_threshold and allowed is None:
            row_notes.append("garbage_collection_threshold acts only under a memory fraction "
                             "(set_per_process_memory_fraction); with none it changes nothing.")
        acting = _acting(s, _largest_block_bytes(most, held, s))
        same = done.get(acting)
        if same is not None:
            r = same[0]
        else:
            r = replay(trace, s, limits=Limits(allowed_bytes=allowed, capacity_bytes=cap),
                       start_segments=st.segments, device=ti.device, device_total_bytes=total,
                       start_page_bytes=start_page or s.large_segment_size, progress=events)
        unmatched = max(unmatched, r.unmatched_frees)
        if r.oom:
            row_notes.append(f"Ran out of memory at {ms(r.oom_event or 0):.1f} "
                             f"{'ms' if t0 is not None else 'events'}; its peak is what the "
                             "rest of the history asked for after the failed request, as if "
                             "it had been given.")
        if fit and same is not None:
            need, n, low = same[1]
            fits.append(FitRow(s.label, s.text, need, 0, lowest_bytes=low,
                               note=f"as {same[2]}: no block reaches max_split_size_mb"))
        elif fit:
            if progress is not None:
                progress.begin(f"finding the least memory under {s.label} {of}")
            unlimited = r if cap is None and allowed is None else replay(
                trace, s, start_segments=st.segments, device=ti.device,
                device_total_bytes=total, start_page_bytes=start_page or s.large_segment_size,
                progress=events)
            need, n = min_room(trace, s, start_segments=st.segments or (), device=ti.device,
                               start_page_bytes=start_page or s.large_segment_size,
                               unlimited_peak_bytes=unlimited.peak_reserved_bytes,
                               peak_allocated_bytes=unlimited.peak_allocated_bytes,
                               device_total_bytes=total,
                               unlimited_max_demand_bytes=unlimited.max_demand_bytes,
                               demand_records=unlimited.demand_records,
                               progress=events)
            low = None
            # Only where the cache held much more than the run needs: which cached blocks a
            # cap meets is then what differs from room to room. A history that needs nearly
            # its whole peak has little cached to differ by, and its rooms under the minimum
            # are whole replays each (the review history's 1,000,000 entries: 2.7 s a room).
            if need is not None and uneven_worth_trying(s, need, unlimited.peak_reserved_bytes):
                rooms = Rooms(trace, s, start_segments=st.segments or (), device=ti.device,
                              start_page_bytes=start_page or s.large_segment_size,
                              device_total_bytes=total,
                              demand_records=unlimited.demand_records, progress=events)
                low = lowest_room(rooms, need, floor_bytes=unlimited.peak_allocated_bytes)
                n += rooms.replays
            fits.append(FitRow(s.label, s.text, need, n, lowest_bytes=low))
            done.setdefault(acting, (r, (need, n, low), s.label))
        if not fit:
            done.setdefault(acting, (r, (None, 0, None), s.label))
        pts = series(r.changes, len(trace.events), r.start_reserved_bytes)
        rows.append(WhatIfRow(
            setting=s.text, label=s.label, current=current, modelled=True,
            peak_reserved_bytes=r.peak_reserved_bytes, end_reserved_bytes=r.end_reserved_bytes,
            inactive_split_bytes=r.inactive_split_bytes, segment_allocs=r.segment_allocs,
            segment_frees=r.segment_frees, oom=r.oom,
            start_reserved_bytes=r.start_reserved_bytes,
            peak_allocated_bytes=r.peak_allocated_bytes,
            oom_at_ms=ms(r.oom_event) if r.oom_event is not None else None,
            oom_requested_bytes=r.oom_requested_bytes, note=" ".join(row_notes),
            series=tuple((round(ms(i), 3), v) for i, v in pts)))
    start_bytes = sum(int(seg.get("total_size", 0)) for seg in st.segments or ()
                      if int(seg.get("device", ti.device)) == ti.device)
    rec = [(0.0, start_bytes)] + [(round(ms(i), 3), start_bytes + d) for i, d in trace.recorded]
    doubles = min(trace.double_frees, unmatched)
    if unmatched > doubles:
        notes.append(f"{unmatched - doubles} free(s) of allocations made before the history "
                     "began were skipped (their blocks are not in the start state).")
    if doubles:
        notes.append(f"{doubles} free(s) of an address the history had already freed were "
                     "skipped (a history entry repeated or lost).")
    if trace.skipped:
        notes.append("Skipped malformed history entries: " + ", ".join(
            f"{n} {why}" for why, n in sorted(trace.skipped.items())) + ".")
    return WhatIf(
        rows=tuple(rows), device=ti.device, recorded_setting=ti.recorded_setting,
        capacity_bytes=cap, entries=trace.entries, events=len(trace.events),
        skipped=dict(trace.skipped), unmatched_frees=unmatched, notes=tuple(notes),
        recorded_series=tuple(rec), recorded_peak_reserved_bytes=max(v for _, v in rec),
        recorded_end_reserved_bytes=rec[-1][1],
        recorded_known=bool(trace.recorded) or bool(start_bytes),
        time_unit="ms" if t0 is not None else "event", origin=ti.origin,
        fit=_fit(fits, fit_gb, context_bytes, reserve_bytes) if fit else None,
        elapsed_s=time.perf_counter() - t_start)


def _largest_block_bytes(most_bytes: int, start_segment_bytes: int,
                         s: AllocatorSettings) -> int:
    """A bound on any block the replay can hold under ``s`` without expandable segments,
    the largest request being ``most_bytes``: no block outgrows its segment, and a new
    segment is ``get_allocation_size`` of a rounded request (2 MiB, the large segment size,
    or the request rounded to 2 MiB); a start segment is what it is. Without
    ``roundup_power2_divisions`` a request rounds to 512 bytes, so the largest one makes the
    largest segment (a training loop's 64 MiB weights: 64 MiB, where twice the request was
    taken for every setting, and ``max_split_size_mb:128`` was replayed for the defaults'
    answer); with them it rounds to less than twice its size."""
    lss = s.large_segment_size
    if max(s.roundup_power2_divisions, default=0) <= 1:
        top = get_allocation_size(round_size(most_bytes, s.roundup_power2_divisions), lss)
    else:
        top = 2 * most_bytes + (2 << 20)
    return max(kSmallBuffer, kLargeBuffer, lss, top, start_segment_bytes)


def _acting(s: AllocatorSettings, largest_block_bytes: int) -> AllocatorSettings:
    """``s`` as it acts on a history whose blocks stay under ``largest_block_bytes``: a
    ``max_split_size_mb`` above every block and request never marks one oversize, so it
    acts as the default (and ``max_non_split_rounding_mb``, read only for oversize
    requests, too). Text and inert keys aside, as ``same_rules`` compares."""
    a = replace(s, text="", ignored_keys=())
    if not s.expandable_segments and largest_block_bytes < s.max_split_size < SIZE_MAX:
        a = replace(a, max_split_size=SIZE_MAX, max_non_split_rounding_size=kLargeBuffer)
    return a


def _recorded_limits(ti: TraceInput, recorded: AllocatorSettings | None,
                     total_bytes: int | None) -> dict[str, int | None]:
    """What the recorded process held at the start and could reserve, when both are known
    and its allocator frees for nothing but room (no garbage-collection threshold)."""
    st = ti.start
    if st.segments is None or recorded is None or recorded.garbage_collection_threshold:
        return {}
    total = st.device_total_bytes or total_bytes
    fraction = recorded.per_process_memory_fraction or st.memory_fraction
    limits = [x for x in (ti.capacity_bytes,
                          int(fraction * total) if fraction and fraction < 1 and total
                          else None) if x is not None]
    if not limits:
        return {}
    held = sum(int(seg.get("total_size", 0)) for seg in st.segments
               if int(seg.get("device", ti.device)) == ti.device)
    return {"start_reserved_bytes": held, "recorded_limit_bytes": min(limits)}


def _expandable_line_applies(snapshot: Mapping[str, object]) -> bool:
    """Whether the snapshot's own setting is one the expandable line is about: modelled,
    without expandable segments."""
    recorded = parse_settings_or_none(settings_of_snapshot(snapshot)[0])
    return recorded is not None and recorded.modelled and not recorded.expandable_segments


def parse_settings_or_none(text: str) -> AllocatorSettings | None:
    try:
        return parse_settings(text)
    except SettingError:
        return None


def with_setting(text: str, key: str, value: str) -> str:
    """``text`` with ``key:value`` in place of any value ``key`` had (brackets respected)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    kept = [p for p in parts if p.strip() and p.split(":", 1)[0].strip() != key]
    return ",".join([*kept, f"{key}:{value}"])


def left_out_oom_line(entries: int, most: int, room_bytes: int, *, session: bool) -> str:
    """The OOM explainer's line when the history is too long to replay in its time: how
    many events, and the command that replays them."""
    what = "session recording" if session else "traced cell"
    cmd = ("%gpumem whatif --session" if session else "%gpumem whatif") + \
        f" --conf expandable_segments:True --capacity {-(-room_bytes // MiB)}MiB"
    return (f"The expandable_segments:True line is left out: the {what} holds {entries:,} "
            f"allocator events, more than the {most:,} the OOM explainer replays in its "
            f"time; {cmd} replays them (seconds), at the {format_bytes(room_bytes)} PyTorch "
            "could use.")


def expandable_oom_line(snapshot: Mapping[str, object], *, device: int,
                        capacity_bytes: int | None, allowed_bytes: int | None = None) -> str:
    """The OOM explainer's line: the history replayed with expandable segments on, at the
    memory PyTorch could use when it failed (what the driver had, and under a memory
    fraction its cap, checked the way the allocator checks it).

    A session recording (``%gpumem record on``, its snapshot carries ``SESSION_KEY``) is
    replayed from its recorded start: "restart the kernel under it and run the same cells".
    A traced cell's history starts from the segments the current setting made before it:
    the line says so, and states no OOM outcome when those segments decide it."""
    if capacity_bytes is None and allowed_bytes is None:
        return ""
    room = min(x for x in (capacity_bytes, allowed_bytes) if x is not None)
    traces = snapshot.get("device_traces")
    history = traces[device] if isinstance(traces, list) and 0 <= device < len(traces) \
        else None
    n = len(history) if isinstance(history, list) else 0
    if n > OOM_LINE_MAX_ENTRIES and _expandable_line_applies(snapshot):
        # Replaying them would hold the OOM cell for seconds (3.3 s at 1,000,000 entries):
        # said, with the command that gives the line.
        return left_out_oom_line(n, OOM_LINE_MAX_ENTRIES, room,
                                 session=isinstance(snapshot.get(SESSION_KEY), Mapping))
    try:
        ti = trace_input(snapshot, device)
        setting = with_setting(ti.recorded_setting, "expandable_segments", "True")
        parsed = parse_settings(setting)
    except (SnapshotError, SettingError):
        return ""
    recorded = parse_settings_or_none(ti.recorded_setting)
    if recorded is None or recorded.expandable_segments or not recorded.modelled:
        return ""
    row = run(ti, [parsed], capacity_bytes, allowed_bytes=allowed_bytes)[0]
    if row.peak_reserved_bytes is None:
        return ""
    verdict = (f" ({'fits' if not row.oom else 'still out of memory'} in the "
               f"{format_bytes(room)} PyTorch could use)")
    held = row.start_reserved_bytes or 0
    session = snapshot.get(SESSION_KEY)
    peak = format_bytes(row.peak_reserved_bytes)
    if isinstance(session, Mapping):
        if session.get("dropped"):
            return (f"Replayed under expandable_segments:True, the session recording would "
                    f"have peaked at {peak} reserved; it lost its earliest entries (its "
                    "buffer filled), so whether a restarted kernel fits is not predicted.")
        if held:
            return (f"Replayed under expandable_segments:True from when the session "
                    f"recording began ({format_bytes(held)} already reserved then, under the "
                    f"current setting), the cells since would have peaked at {peak} reserved; "
                    "the segments reserved before it decide whether they fit, so no outcome "
                    "is predicted.")
        return (f"Replayed under expandable_segments:True from the start of the session "
                f"recording (an empty GPU), the same cells would have peaked at {peak} "
                f"reserved{verdict}: what restarting the kernel under it would do.")
    if not held:
        return (f"Replayed under expandable_segments:True, this cell alone (nothing was "
                f"reserved before it) would have peaked at {peak} reserved{verdict}.")
    return (f"Replayed under expandable_segments:True, this cell alone, from the "
            f"{format_bytes(held)} of segments the current setting made before it, would "
            f"have peaked at {peak} reserved. Those segments decide whether it fits, so no "
            "outcome is predicted; for a kernel restarted under it, record the session from "
            "its start (%gpumem record on) and run %gpumem whatif --session.")
