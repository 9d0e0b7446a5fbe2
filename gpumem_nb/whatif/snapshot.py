"""Reading what a replay starts from: a snapshot (ours or ``_dump_snapshot``'s), one device's
history, the segments at the history's start, and the device's capacity.

Pickles are read by an unpickler that builds only plain data (dicts, lists, strings, numbers):
a snapshot file from somewhere else cannot run code here. Our own compact JSON traces
(``.json`` or ``.json.gz``, see ``compact``) load too.
"""

from __future__ import annotations

import builtins
import gzip
import io
import json
import os
import pickle
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import safeio
from .config import settings_of_snapshot

MAX_SNAPSHOT_BYTES = 1 << 30  # memory_viz itself gives up on snapshots around 1 GB
START_KEY = "gpumem_start"  # what %%gpumem --trace adds to the snapshot it keeps or saves
COMPACT_FORMAT = "gpumem-whatif-trace/1"
_SAFE_BUILTINS = frozenset({"dict", "list", "tuple", "set", "frozenset", "bytearray", "bytes",
                            "str", "int", "float", "complex", "bool"})
_KEEP = ("action", "addr", "size", "stream", "time_us")


class SnapshotError(ValueError):
    """A snapshot that cannot be read; the message is a plain sentence."""


class _DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _SAFE_BUILTINS:
            return getattr(builtins, name)
        raise pickle.UnpicklingError(f"refused {module}.{name}: a snapshot holds plain data only")


def load(source: Mapping[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    """A snapshot dict from a dict or a file (pickle, JSON, gzip'd JSON)."""
    if isinstance(source, Mapping):
        return expand(dict(source))
    if not isinstance(source, (str, os.PathLike)):
        raise SnapshotError("a snapshot is the dict torch.cuda.memory._snapshot() returns or "
                            f"a path to its pickle, not {type(source).__name__}")
    try:
        data = safeio.read_bytes(source, max_bytes=MAX_SNAPSHOT_BYTES)
    except OSError as e:
        raise SnapshotError(f"cannot read {safeio.shown(source)}: {safeio.reason(e)}") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise SnapshotError(f"{safeio.shown(source)} is a damaged gzip file: {e}") from None
    try:
        if data[:1] in (b"{", b"["):
            obj = json.loads(data)
        else:
            obj = _DataOnlyUnpickler(io.BytesIO(data)).load()
    except Exception as e:  # junk makes the unpickler raise nearly anything
        raise SnapshotError(f"{safeio.shown(source)} is not a memory snapshot: "
                            f"{type(e).__name__}: {str(e)[:200]}") from None
    if not isinstance(obj, dict):
        raise SnapshotError(f"{safeio.shown(source)} is not a memory snapshot (it holds a "
                            f"{type(obj).__name__}, not a dict)")
    return expand(obj)


@dataclass(frozen=True)
class Start:
    """What ``%%gpumem --trace`` records when tracing begins."""

    segments: list[dict[str, Any]] | None  # None: not recorded
    device_total_bytes: int | None = None
    device_free_bytes: int | None = None
    memory_fraction: float | None = None
    since_us: float | None = None


@dataclass(frozen=True)
class TraceInput:
    """One device's history and what the replay needs around it."""

    device: int
    entries: Sequence[Mapping[str, Any]]
    start: Start
    recorded_setting: str
    notes: tuple[str, ...]

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


def _num(v: Any) -> Any:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def segments_of(raw: Any) -> list[dict[str, Any]]:
    """A snapshot's segments as the model reads them: plain ints, blocks with a size and a
    state; anything else dropped (a segment with junk in it is no segment)."""
    out = []
    for seg in raw if isinstance(raw, list) else ():
        if not isinstance(seg, Mapping):
            continue
        ints = {k: seg.get(k, 0) for k in ("device", "address", "total_size", "stream")}
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                   for v in ints.values()):
            continue
        blocks: list[dict[str, Any]] = []
        at = ints["address"]
        raw_blocks = seg.get("blocks")
        for b in raw_blocks if isinstance(raw_blocks, list) else ():
            size = b.get("size") if isinstance(b, Mapping) else None
            addr = b.get("address", at) if isinstance(b, Mapping) else None
            if not isinstance(size, int) or not isinstance(addr, int) or size < 0:
                break
            blocks.append({"address": addr, "size": size, "state": str(b.get("state", ""))})
            at = addr + size
        else:
            out.append({**ints, "segment_type": seg.get("segment_type"),
                        "is_expandable": bool(seg.get("is_expandable")), "blocks": blocks})
    return out



def start_of(snapshot: Mapping[str, Any], device: int) -> Start:
    rec = snapshot.get(START_KEY)
    if not isinstance(rec, Mapping):
        return Start(None)
    devices = rec.get("devices")
    devices = devices if isinstance(devices, Mapping) else {}
    dev = devices.get(str(device)) or devices.get(device)
    dev = dev if isinstance(dev, Mapping) else {}
    segs = rec.get("segments")

    total, free, since = _num(dev.get("total_bytes")), _num(dev.get("free_bytes")), \
        _num(rec.get("since_us"))
    return Start(segments=segments_of(segs) if isinstance(segs, list) else None,
                 device_total_bytes=int(total) if total and total > 0 else None,
                 device_free_bytes=int(free) if free is not None and free >= 0 else None,
                 memory_fraction=_num(dev.get("fraction")),
                 since_us=float(since) if since is not None else None)


def trace_input(snapshot: Mapping[str, Any], device: int | None = None) -> TraceInput:
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list) or not any(isinstance(t, list) and t for t in traces):
        traces = None
    if traces is None:
        raise SnapshotError("this snapshot holds no allocation history (device_traces is "
                            "empty): record it with torch.cuda.memory._record_memory_history "
                            "or %%gpumem --trace")
    if device is None:
        device = max(range(len(traces)),
                     key=lambda i: len(traces[i]) if isinstance(traces[i], list) else 0)
    elif not 0 <= device < len(traces) or not isinstance(traces[device], list) or \
            not traces[device]:
        raise SnapshotError(f"this snapshot has no history for GPU {device}")
    entries: Sequence[Mapping[str, Any]] = traces[device]
    start = start_of(snapshot, device)
    notes: list[str] = []
    if start.since_us is not None:  # a recording that was already on: keep the cell's part
        entries = [e for e in entries if not isinstance(e, Mapping)
                   or not isinstance(e.get("time_us"), (int, float))
                   or e["time_us"] >= start.since_us]
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
                      recorded_setting=setting, notes=tuple(notes))


def rebuild_start(snapshot: Mapping[str, Any], entries: Sequence[Mapping[str, Any]],
                  device: int) -> tuple[list[dict[str, Any]], str]:
    """The segments that existed when the history began, when nobody recorded them: the
    end snapshot's segments the history did not create, and those it freed without creating,
    with the allocations the history frees without having made, and the end snapshot's live
    blocks it never made, in place; the rest of each such segment free."""
    created: set[int] = set()
    freed_before: dict[int, int] = {}
    allocated: set[int] = set()
    early_live: dict[int, int] = {}
    for e in entries:
        if not isinstance(e, Mapping):
            continue
        a, addr, size = e.get("action"), e.get("addr"), e.get("size")
        if not isinstance(addr, int) or not isinstance(size, int):
            continue
        if a in ("segment_alloc", "segment_map"):
            created.add(addr)
        elif a in ("segment_free", "segment_unmap") and addr not in created:
            freed_before.setdefault(addr, size)
        elif a == "alloc":
            allocated.add(addr)
        elif a == "free_requested" and addr not in allocated:
            early_live.setdefault(addr, size)
    segments = [s for s in segments_of(snapshot.get("segments"))
                if s.get("device", device) == device]
    out: list[dict[str, Any]] = []
    for seg in segments:
        addr = int(seg.get("address", 0))
        if addr in created:
            continue
        blocks = []
        at = addr
        for b in seg.get("blocks") or ():
            size = int(b.get("size", 0))
            baddr = int(b.get("address", at))
            live = b.get("state") == "active_allocated" and baddr not in allocated
            blocks.append({"address": baddr, "size": size,
                           "state": "active_allocated" if live or baddr in early_live
                           else "inactive"})
            at = baddr + size
        out.append({**{k: seg.get(k) for k in ("device", "address", "total_size", "stream",
                                               "segment_type", "is_expandable")},
                    "blocks": blocks})
    for addr, size in freed_before.items():
        inside = sorted((a, n) for a, n in early_live.items() if addr <= a < addr + size)
        blocks, at = [], addr
        for a, n in inside:
            if a > at:
                blocks.append({"address": at, "size": a - at, "state": "inactive"})
            blocks.append({"address": a, "size": n, "state": "active_allocated"})
            at = a + n
        if at < addr + size:
            blocks.append({"address": at, "size": addr + size - at, "state": "inactive"})
        out.append({"device": device, "address": addr, "total_size": size,
                    "segment_type": "small" if size <= (2 << 20) else "large",
                    "stream": 0, "blocks": blocks})
    if not out:
        return [], ""
    return out, (f"The history began with {len(out)} segment(s) already reserved; their "
                 "layout was rebuilt from the end snapshot and the history (sizes of "
                 "allocations made before it are their requested sizes).")


# ------------------------------------------------------------------------------------------
# The compact form the GPU validation brings back: history without stacks.
# ------------------------------------------------------------------------------------------
def compact(snapshot: Mapping[str, Any], *, extra: Mapping[str, Any] | None = None
            ) -> dict[str, Any]:
    """A snapshot reduced to what a replay reads: each device's history as columns of
    action/addr/size/stream/time_us (no frames), the segments without frames, the allocator
    settings and our start record."""
    traces = []
    for t in snapshot.get("device_traces") or ():
        cols: dict[str, list[Any]] = {k: [] for k in _KEEP}
        for e in t or ():
            for k in _KEEP:
                cols[k].append(e.get(k))
        traces.append(cols)
    out: dict[str, Any] = {
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


def _strip(seg: Mapping[str, Any]) -> dict[str, Any]:
    seg = {k: v for k, v in seg.items() if k != "frames"}
    seg["blocks"] = [{k: v for k, v in b.items() if k != "frames"}
                     for b in seg.get("blocks") or ()]
    return seg


def expand(obj: dict[str, Any]) -> dict[str, Any]:
    """A compact trace back in the shape of ``_snapshot()``'s dict (entries as dicts)."""
    if obj.get("format") != COMPACT_FORMAT:
        return obj
    out = {k: v for k, v in obj.items() if k not in ("device_traces_columns", "format")}
    out["device_traces"] = [list(_rows(cols)) for cols in obj.get("device_traces_columns") or ()]
    return out


def _rows(cols: Mapping[str, list[Any]]) -> Iterator[dict[str, Any]]:
    names = [k for k in _KEEP if k in cols]
    for values in zip(*(cols[k] for k in names), strict=False):
        yield dict(zip(names, values, strict=False))
