"""Reading what a replay starts from: a snapshot (ours or ``_dump_snapshot``'s), one device's
history, the segments at the history's start, and the device's capacity.

Pickles are read by an unpickler that builds only plain data (dicts, lists, strings, numbers)
and looks up no name at all: a snapshot file from somewhere else can neither run code here
nor make a builtin build something large from a few bytes. Our own compact JSON traces
(``.json`` or ``.json.gz``, see ``compact``) load too. What a file may unpack to, and what
its JSON may take once parsed, are bounded in bytes before they are held (``unpack``).

Whatever the file holds, the model gets a state it can replay: numbers that fit a
``size_t`` (or a finite double), segments whose blocks tile them with free neighbours
merged, no two segments overlapping. A field that does not fit is dropped, never raised on.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from .. import safeio
from . import unpack
from .config import settings_of_snapshot
from .fields import SIZE_T_END, Block, Segment, finite, plain, uint

__all__ = [
    "COMPACT_FORMAT", "MAX_BLOCKS", "MAX_DEVICES", "MAX_GROWTH_RATIO", "MAX_HISTORY_ENTRIES",
    "MAX_SNAPSHOT_BYTES", "ORIGIN_CELL", "ORIGIN_HISTORY", "ORIGIN_SESSION", "SESSION_KEY",
    "START_KEY", "Block", "NoHistory", "Segment", "SnapshotError", "Start", "TraceInput",
    "compact", "expand", "load", "origin_of", "rebuild_start", "segments_of", "start_of",
    "trace_input"
]

MAX_SNAPSHOT_BYTES = 1 << 30  # memory_viz itself gives up on snapshots around 1 GB
# A pickle's shared references make a repeated entry cost 2 bytes in the file: a 4 MB file
# held 2M entries and took 14-125 s to replay, a 20 MB one 66 s and 1 GB. The replay reads
# each entry and block, so their counts are bounded, not the file's size alone.
MAX_HISTORY_ENTRIES = 1_000_000  # 1-3 s to replay per setting here (bench_whatif_bound.py)
MAX_BLOCKS = 1_000_000  # the end's and the recorded start's segments, with their blocks
MAX_DEVICES = 1024  # GPUs one snapshot may name: far more than one process drives
START_KEY = "gpumem_start"  # what %%gpumem --trace adds to the snapshot it keeps or saves
SESSION_KEY = "gpumem_session"  # what %gpumem record adds: the session's start and drops
COMPACT_FORMAT = "gpumem-whatif-trace/1"
_KEEP = ("action", "addr", "size", "stream", "time_us")
_MIN_BLOCK = 512  # kMinBlockSize
# The unpickler builds the whole object before anything can be counted, and a byte of the
# file can make an object: 50 MB of EMPTY_DICT opcodes (50 KB gzip'd) made 4.3 GB. So the
# unpickler reads through ``_Watched``, which refuses once this process has grown past what
# any snapshot within the entry bound needs, or grows far faster than the bytes it has read.
# Each bound is a multiple of ``unpack.MAX_UNPACKED_BYTES`` (read when the file is), so the
# peak stays a small multiple of what a file may unpack to:
# - the process never grows past ``_GROWTH_BOUNDS`` times it (1 GiB at 256 MiB: the largest
#   real snapshot, 1,000,000 entries with 29 frames each, is 178 MB of file and 0.7 GB);
# - past ``_GROWTH_FLOOR_BOUNDS`` times it (below, the start's noise), not faster than
#   ``MAX_GROWTH_RATIO`` bytes of memory a byte of file: a real snapshot takes about 4 (5.5
#   at 100,000 entries, well under the floor); an empty dict is 64 bytes for one byte of
#   file, and a DUP or NONE opcode puts an 8-byte slot on the unpickler's stack: 250 MiB of
#   DUP (249 KB gzip'd) made 6.3 GiB when the ratio allowed 16.
_GROWTH_BOUNDS = 4
_GROWTH_FLOOR_BOUNDS = 2
MAX_GROWTH_RATIO = 6
_MAX_READ_BYTES = 8 << 20  # pickle writes 64 KB frames: one read past this is no snapshot
_NOT_SPACE = re.compile(rb"\S")


class _Expands(Exception):
    """The pickle grows memory past ``_Watched``'s bounds."""


class _Watched:
    """The file as the C unpickler reads it: through ``peek`` it asks for 128 KB at a time
    and for a frame at once, so each call is where the memory built so far is checked."""

    def __init__(self, data: bytes | bytearray) -> None:
        from ..sources.host import HostSource, release_free_heap

        self._view = memoryview(data)
        self._pos = 0
        self._host = HostSource()
        # Growth is read as RSS, which misses memory the process freed earlier and kept
        # resident: the unpickler reuses it without the RSS moving (after 300 MB freed, a
        # DUP pickle peaked at 76 MiB for a 16 MiB bound instead of 50 MiB). Once the free
        # pages go back, every page the unpickler touches is counted.
        release_free_heap()
        self._rss0 = self._host.rss_bytes()

    def _check(self, n: int) -> None:
        if n > _MAX_READ_BYTES:
            raise _Expands(f"it asks for {n} bytes at once (a frame or string far larger "
                           "than pickle writes for a snapshot)")
        rss, rss0 = self._host.rss_bytes(), self._rss0
        if rss is None or rss0 is None:
            return
        grown, bound = rss - rss0, unpack.MAX_UNPACKED_BYTES
        if grown > _GROWTH_BOUNDS * bound or (grown > _GROWTH_FLOOR_BOUNDS * bound
                                              and grown > MAX_GROWTH_RATIO * self._pos):
            raise _Expands(f"unpickling its first {self._pos} bytes took {grown >> 20} MiB "
                           "of memory (shared references or empty objects expand)")

    def read(self, n: int = -1) -> bytes:
        n = len(self._view) - self._pos if n is None or n < 0 else n
        self._check(n)
        out = bytes(self._view[self._pos:self._pos + n])
        self._pos += len(out)
        return out

    def readinto(self, buf: bytearray | memoryview) -> int:
        self._check(len(buf))
        out = self._view[self._pos:self._pos + len(buf)]
        buf[:len(out)] = out
        self._pos += len(out)
        return len(out)

    def peek(self, n: int = 1) -> bytes:
        self._check(0)
        return bytes(self._view[self._pos:self._pos + max(n, 1)])

    def readline(self) -> bytes:
        end = bytes(self._view[self._pos:self._pos + _MAX_READ_BYTES]).find(b"\n")
        n = (end + 1) if end >= 0 else min(len(self._view) - self._pos, _MAX_READ_BYTES + 1)
        return self.read(n)

    def close(self) -> None:
        self._host.close()
        self._view.release()


class SnapshotError(ValueError):
    """A snapshot that cannot be read; the message is a plain sentence."""


class NoHistory(SnapshotError):
    """The snapshot holds no allocation history to replay."""


class _DataOnlyUnpickler(pickle.Unpickler):
    """torch's snapshots, ours and ``_dump_snapshot``'s, are plain dicts, lists, strings and
    numbers, which pickle writes without naming any class: every name is refused."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise pickle.UnpicklingError(f"refused {plain(module, 60)}.{plain(name, 60)}: a "
                                     "snapshot holds plain data only")


def _shown(source: str | os.PathLike[str]) -> str:
    return plain(safeio.shown(source))


def load(source: Mapping[str, object] | str | os.PathLike[str]) -> dict[str, Any]:
    """A snapshot dict from a dict or a file (pickle, JSON, either gzip'd)."""
    if isinstance(source, Mapping):
        return expand(dict(source))
    if not isinstance(source, (str, os.PathLike)):
        raise SnapshotError("a snapshot is the dict torch.cuda.memory._snapshot() returns or "
                            f"a path to its pickle, not {type(source).__name__}")
    try:
        obj = _parsed(source)
    except OSError as e:
        raise SnapshotError(f"cannot read {_shown(source)}: {plain(safeio.reason(e))}") from None
    except unpack.Refused as e:
        raise SnapshotError(str(e)) from None
    except _Expands as e:
        raise SnapshotError(f"{_shown(source)} is refused: {e}") from None
    except Exception as e:  # junk makes the unpickler raise nearly anything
        why = " ".join(str(e).split())  # the unpickler's text runs over lines
        raise SnapshotError(f"{_shown(source)} is not a memory snapshot: "
                            f"{type(e).__name__}: {plain(why, 200)}") from None
    if not isinstance(obj, dict):
        raise SnapshotError(f"{_shown(source)} is not a memory snapshot (its top level is "
                            f"a {type(obj).__name__}, not a dict)")
    _check_bounds(obj, _shown(source))
    return expand(obj)


def _first_byte(data: bytes | bytearray) -> bytes:
    """The first byte after a UTF-8 BOM (as some editors save JSON) and white space. Its own
    function: the match holds the whole buffer, and must not outlive this look."""
    m = _NOT_SPACE.search(data, 3 if data[:3] == b"\xef\xbb\xbf" else 0)
    return m.group() if m else b""


def _parsed(source: str | os.PathLike[str]) -> object:
    """The file's object. Each step rebinds ``data``, so the bytes before it can go: the
    file's once it is unpacked, the unpacked bytes before the JSON text is parsed."""
    data: bytes | bytearray = safeio.read_bytes(source, max_bytes=MAX_SNAPSHOT_BYTES)
    if data[:2] == b"\x1f\x8b":
        data = unpack.gunzip(data, _shown(source))
    if _first_byte(data) in (b"{", b"["):
        text = unpack.json_text(data, _shown(source))
        del data
        return json.loads(text)
    watched = _Watched(data)
    del data
    try:
        return _DataOnlyUnpickler(watched).load()
    finally:
        watched.close()


def _check_bounds(obj: Mapping[str, object], name: str) -> None:
    """Refuse, in one sentence, a file that holds more entries or blocks than a replay
    should read (counted by their lists' lengths: nothing is walked). Every list the
    what-if reads is counted: a GPU's history past the first 1024 and the recorded start's
    segments are as cheap to share as the first GPU's entries."""
    traces = obj.get("device_traces")
    cols = obj.get("device_traces_columns")
    for lists in (traces, cols):
        if isinstance(lists, list) and len(lists) > MAX_DEVICES:
            raise SnapshotError(f"{name} holds histories for {len(lists)} GPUs, more than "
                                f"the {MAX_DEVICES} a what-if reads: not a snapshot "
                                "of one process")
    entries = sum(len(t) for t in traces if isinstance(t, list)) \
        if isinstance(traces, list) else 0
    if isinstance(cols, list):
        entries += sum(max((len(v) for v in c.values() if isinstance(v, list)), default=0)
                       for c in cols if isinstance(c, Mapping))
    if entries > MAX_HISTORY_ENTRIES:
        raise SnapshotError(f"{name} holds {entries} history entries, more than the "
                            f"{MAX_HISTORY_ENTRIES} a what-if replays: record fewer "
                            "(_record_memory_history's max_entries)")
    start = obj.get(START_KEY)
    blocks = 0
    for segments in (obj.get("segments"),
                     start.get("segments") if isinstance(start, Mapping) else None):
        for seg in segments if isinstance(segments, list) else ():
            b = seg.get("blocks") if isinstance(seg, Mapping) else None
            blocks += len(b) + 1 if isinstance(b, list) else 1
            if blocks > MAX_BLOCKS:
                raise SnapshotError(f"{name} holds more than {MAX_BLOCKS} segments and "
                                    "blocks: too many for a what-if to read")


@dataclass(frozen=True)
class Start:
    """What ``%%gpumem --trace`` records when tracing begins."""

    segments: list[Segment] | None  # None: not recorded
    device_total_bytes: int | None = None
    device_free_bytes: int | None = None
    memory_fraction: float | None = None
    since_us: float | None = None


# Where a history's clock starts, by what recorded it: ``%%gpumem --trace`` (the cell),
# ``%gpumem record`` (the session recording, across cells), or neither (a snapshot from
# torch's own ``_record_memory_history``, timed from its first entry).
ORIGIN_CELL = "cell"
ORIGIN_SESSION = "session"
ORIGIN_HISTORY = "history"


@dataclass(frozen=True)
class TraceInput:
    """One device's history and what the replay needs around it."""

    device: int
    entries: Sequence[Mapping[str, object]]
    start: Start
    recorded_setting: str
    notes: tuple[str, ...]
    origin: str = ORIGIN_CELL

    @property
    def capacity_bytes(self) -> int | None:
        """What was free to PyTorch on that GPU when the history began: the driver's free
        memory plus what PyTorch already held, capped by the memory fraction."""
        st = self.start
        if st.device_free_bytes is None:
            return None
        held = sum(int(s.get("total_size", 0)) for s in st.segments or ()
                   if int(s.get("device", self.device)) == self.device)
        cap = st.device_free_bytes + held
        if st.memory_fraction is not None and st.memory_fraction < 1 and st.device_total_bytes:
            cap = min(cap, int(st.memory_fraction * st.device_total_bytes))
        return cap


def segments_of(raw: object) -> list[Segment]:
    """A snapshot's segments as the model reads them: ints that fit a ``size_t``, blocks
    tiling the segment (a gap is free space) with free neighbours merged, and no segment
    overlapping an earlier one of its GPU; anything else dropped (a segment with junk in its
    blocks is no segment)."""
    out: list[Segment] = []
    spans: dict[int, list[tuple[int, int]]] = {}  # GPU -> (start, end) of the kept ones
    for seg in raw if isinstance(raw, list) else ():
        if not isinstance(seg, Mapping):
            continue
        device, start, total, stream = (uint(seg.get(k, 0)) for k in (
            "device", "address", "total_size", "stream"))
        if device is None or start is None or total is None or stream is None or not total \
                or start + total > SIZE_T_END:
            continue
        blocks = _tiled(start, start + total, seg.get("blocks"))
        taken = spans.setdefault(device, [])
        j = bisect_left(taken, (start, 0))
        if blocks is None or (j > 0 and taken[j - 1][1] > start) or \
                (j < len(taken) and taken[j][0] < start + total):
            continue
        taken.insert(j, (start, start + total))
        out.append({"device": device, "address": start, "total_size": total, "stream": stream,
                    "segment_type": "small" if seg.get("segment_type") == "small" else "large",
                    "is_expandable": seg.get("is_expandable") is True, "blocks": blocks})
    return out


# rebuild_start's actions: 0 alloc, 1 free_requested, 2 a segment made, 3 one given back.
_NEG_INF = float("-inf")
_REBUILD_KIND = {"alloc": 0, "free_requested": 1, "segment_alloc": 2, "segment_map": 2,
                 "segment_free": 3, "segment_unmap": 3}
_HELD = ("active_allocated", "active_awaiting_free", "active_pending_free")


def _tiled(start: int, end: int, raw: object) -> list[Block] | None:
    """The blocks of the segment [start, end) in address order, every byte in one of them:
    gaps become free blocks and neighbouring free blocks one (the allocator merges them as
    they are freed, so a state with two of them side by side is no state it can be in).
    None when a block is junk, overlaps another or lies outside the segment."""
    parsed = []
    at = start
    for b in raw if isinstance(raw, list) else ():
        if not isinstance(b, Mapping):
            return None
        size, addr = uint(b.get("size")), uint(b.get("address", at))
        if size is None or addr is None:
            return None
        state = b.get("state")
        if size:
            parsed.append((addr, size, state if state in _HELD else "inactive"))
        at = addr + size
    parsed.sort(key=lambda x: x[0])
    out: list[Block] = []
    at = start
    for addr, size, state in [*parsed, (end, 0, "")]:
        if addr < at or addr + size > end:
            return None
        if addr > at:
            out.append({"address": at, "size": addr - at, "state": "inactive"})
        if size:
            out.append({"address": addr, "size": size, "state": state})
        at = addr + size
    merged: list[Block] = []
    for blk in out:
        if merged and blk["state"] == "inactive" and merged[-1]["state"] == "inactive":
            merged[-1]["size"] += blk["size"]
        else:
            merged.append(blk)
    return merged


def _bytes(v: object) -> int | None:
    f = finite(v)
    return int(f) if f is not None and 0 <= f < SIZE_T_END else None


def start_of(snapshot: Mapping[str, object], device: int) -> Start:
    rec = snapshot.get(START_KEY)
    if not isinstance(rec, Mapping):
        return Start(None)
    devices = rec.get("devices")
    devices = devices if isinstance(devices, Mapping) else {}
    dev = devices.get(str(device)) or devices.get(device)
    dev = dev if isinstance(dev, Mapping) else {}
    segs = rec.get("segments")
    total, free = _bytes(dev.get("total_bytes")), _bytes(dev.get("free_bytes"))
    fraction = finite(dev.get("fraction"))
    return Start(segments=segments_of(segs) if isinstance(segs, list) else None,
                 device_total_bytes=total or None, device_free_bytes=free,
                 memory_fraction=fraction if fraction is not None and 0 <= fraction <= 1
                 else None,
                 since_us=finite(rec.get("since_us")))


def trace_input(snapshot: Mapping[str, object], device: int | None = None) -> TraceInput:
    if device is not None and (not isinstance(device, int) or isinstance(device, bool)):
        raise TypeError(f"device is a GPU number (an int such as 0), not {device!r:.60}")
    if "device_traces" not in snapshot and "segments" not in snapshot:
        keys = ", ".join(plain(str(k), 30) for k in list(snapshot)[:6]) or "none"
        raise SnapshotError("this file is not a memory snapshot: it has neither segments nor "
                            f"device_traces (its keys: {keys}); the what-if reads "
                            "torch.cuda.memory._snapshot()'s dict, a _dump_snapshot pickle "
                            "or a %%gpumem --trace --save file")
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list) or not any(isinstance(t, list) and t for t in traces):
        traces = None
    if traces is None:
        raise NoHistory("this snapshot holds no allocation history (device_traces is "
                        "empty): record it with torch.cuda.memory._record_memory_history "
                        "or %%gpumem --trace")
    if device is None:
        device = max(range(len(traces)),
                     key=lambda i: len(traces[i]) if isinstance(traces[i], list) else 0)
    elif not 0 <= device < len(traces) or not isinstance(traces[device], list) or \
            not traces[device]:
        raise SnapshotError(f"this snapshot has no history for GPU {device}")
    entries: Sequence[Mapping[str, object]] = traces[device]
    start = start_of(snapshot, device)
    notes: list[str] = []
    if start.since_us is not None:  # a recording that was already on: keep the cell's part
        since = start.since_us
        entries = [e for e in entries if _since(e, since)]
    setting, note = settings_of_snapshot(snapshot)
    if note:
        notes.append(note)
    if start.segments is None:
        segs, why = rebuild_start(snapshot, entries, device)
        start = Start(segs, start.device_total_bytes, start.device_free_bytes,
                      start.memory_fraction, start.since_us)
        if why:
            notes.append(why)
    return TraceInput(device=device, entries=entries, start=start,
                      recorded_setting=setting, notes=tuple(notes), origin=origin_of(snapshot))


def origin_of(snapshot: Mapping[str, object]) -> str:
    """What recorded ``snapshot``'s history, so what its times count from."""
    if isinstance(snapshot.get(SESSION_KEY), Mapping):
        return ORIGIN_SESSION
    if isinstance(snapshot.get(START_KEY), Mapping):
        return ORIGIN_CELL
    return ORIGIN_HISTORY


def _since(e: object, since: float) -> bool:
    """Whether ``e`` is kept in a recording that began at ``since``: an entry without a
    finite time is."""
    if type(e) is dict:
        t = e.get("time_us")
        if type(t) is float:
            return not t < since or t == _NEG_INF  # NaN and +inf are kept, as -inf is
    elif not isinstance(e, Mapping):
        return True
    return finite(e.get("time_us")) is None or e["time_us"] >= since


def rebuild_start(snapshot: Mapping[str, object], entries: Sequence[Mapping[str, object]],
                  device: int) -> tuple[list[Segment], str]:
    """The segments that existed when the history began, when nobody recorded them: the
    end snapshot's segments the history did not create, and those it freed without creating.
    Live in them: the end snapshot's live blocks the history never made, and the allocations
    the history frees without having made (their requested size, rounded to 512 B); every
    other byte free, free neighbours merged (what the history allocated there was free when
    it began)."""
    created: set[int] = set()
    freed_before: dict[int, int] = {}
    allocated: set[int] = set()
    early_live: dict[int, int] = {}
    # The hot path at the entry bound: only the four actions read here have their numbers
    # checked (plain ints inline, anything else through ``uint``).
    for e in entries:
        if type(e) is not dict and not isinstance(e, Mapping):
            continue
        a = e.get("action")
        if type(a) is not str and not isinstance(a, str):
            continue
        kind = _REBUILD_KIND.get(a)
        if kind is None:
            continue
        addr, size = e.get("addr"), e.get("size")
        if type(addr) is not int or not 0 <= addr < SIZE_T_END:
            addr = uint(addr)
            if addr is None:
                continue
        if type(size) is not int or not 0 <= size < SIZE_T_END:
            size = uint(size)
            if size is None:
                continue
        if kind == 0:
            allocated.add(addr ^ (addr >> 24))  # replay.fold_address: well spread
        elif kind == 1:
            if addr ^ (addr >> 24) not in allocated:
                early_live.setdefault(addr, -(-max(size, 1) // _MIN_BLOCK) * _MIN_BLOCK)
        elif kind == 2:
            created.add(addr)
        elif addr not in created:
            freed_before.setdefault(addr, size)
    early = sorted(early_live.items())
    early_at = [a for a, _ in early]
    found: list[dict[str, object]] = []
    for seg in segments_of(snapshot.get("segments")):
        if seg["device"] != device or seg["address"] in created:
            continue
        blocks: list[Block] = [{**b, "state": "active_allocated" if b["state"] == "active_allocated"
                   and b["address"] ^ (b["address"] >> 24) not in allocated
                   else "inactive"} for b in seg["blocks"]]
        found.append({**seg, "blocks": _with_early(blocks, early, early_at)})
    for addr, size in freed_before.items():
        if not size or addr + size > SIZE_T_END:
            continue
        blocks = [{"address": addr, "size": size, "state": "inactive"}]
        found.append({"device": device, "address": addr, "total_size": size,
                    "segment_type": "small" if size <= (2 << 20) else "large",
                    "stream": 0, "blocks": _with_early(blocks, early, early_at)})
    out = segments_of(found)  # merges the free neighbours; a freed segment inside a kept one goes
    if not out:
        return [], ""
    return out, (f"The history began with {len(out)} segment(s) already reserved; their "
                 "layout was rebuilt from the end snapshot and the history (blocks of "
                 "allocations made before it get their requested size, rounded to 512 B).")


def _with_early(blocks: list[Block], early: list[tuple[int, int]],
                early_at: list[int]) -> list[Block]:
    """``blocks`` with the allocations made before the history carved out of the free ones
    they lie in."""
    out: list[Block] = []
    for b in blocks:
        start, end = b["address"], b["address"] + b["size"]
        i, j = bisect_left(early_at, start), bisect_right(early_at, end - 1)
        if b["state"] != "inactive" or i == j:
            out.append(b)
            continue
        at = start
        for a, n in early[i:j]:
            if a < at:
                continue
            if a > at:
                out.append({"address": at, "size": a - at, "state": "inactive"})
            at = min(a + n, end)
            out.append({"address": a, "size": at - a, "state": "active_allocated"})
        if at < end:
            out.append({"address": at, "size": end - at, "state": "inactive"})
    return out


# ------------------------------------------------------------------------------------------
# The compact form the GPU validation brings back: history without stacks.
# ------------------------------------------------------------------------------------------
def compact(snapshot: Mapping[str, Any], *, extra: Mapping[str, object] | None = None
            ) -> dict[str, object]:
    """A snapshot reduced to what a replay reads: each device's history as columns of
    action/addr/size/stream/time_us (no frames), the segments without frames, the allocator
    settings and our start record."""
    traces = []
    for t in snapshot.get("device_traces") or ():
        cols: dict[str, list[object]] = {k: [] for k in _KEEP}
        for e in t or ():
            for k in _KEEP:
                cols[k].append(e.get(k))
        traces.append(cols)
    out: dict[str, object] = {
        "format": COMPACT_FORMAT,
        "device_traces_columns": traces,
        "segments": [_strip(s) for s in snapshot.get("segments") or ()],
        "allocator_settings": dict(snapshot.get("allocator_settings") or {}),
    }
    if isinstance(snapshot.get(START_KEY), Mapping):
        start = dict(snapshot[START_KEY])
        start["segments"] = [_strip(s) for s in start.get("segments") or ()]
        out[START_KEY] = start
    out.update(extra or {})
    return out


def _strip(seg: Mapping[str, Any]) -> dict[str, object]:
    seg = {k: v for k, v in seg.items() if k != "frames"}
    seg["blocks"] = [{k: v for k, v in b.items() if k != "frames"}
                     for b in seg.get("blocks") or ()]
    return seg


def expand(obj: dict[str, Any]) -> dict[str, Any]:
    """A compact trace back in the shape of ``_snapshot()``'s dict (entries as dicts)."""
    if obj.get("format") != COMPACT_FORMAT:
        return obj
    columns = obj.get("device_traces_columns")
    if not isinstance(columns, list):
        raise SnapshotError(f"this {COMPACT_FORMAT} trace has no device_traces_columns list")
    out = {k: v for k, v in obj.items() if k not in ("device_traces_columns", "format")}
    out["device_traces"] = [list(_rows(cols)) if isinstance(cols, Mapping) else []
                            for cols in columns]
    return out


def _rows(cols: Mapping[str, Any]) -> Iterator[dict[str, object]]:
    """One GPU's entries from its columns; a column that is not a list is left out."""
    names = [k for k in _KEEP if isinstance(cols.get(k), list)]
    for values in zip(*(cols[k] for k in names), strict=False):
        yield dict(zip(names, values, strict=False))
