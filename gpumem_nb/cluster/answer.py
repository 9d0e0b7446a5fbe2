"""One worker's answer, checked field by field before anything is computed from it.

A worker's answer is data from another process, possibly another gpumem_nb version (a field
renamed, a type changed) or none at all: every field is checked here, once, and a device whose
answer does not read is one row marked "unreadable: <reason>", never a traceback in the
notebook or a dead chart feed. Sizes are whole byte counts below ``MAX_BYTES``; texts are cut
to ``MAX_TEXT`` characters; a worker is read for at most ``MAX_DEVICES`` devices (a real one
sees a few, MIG instances included), so one answer's cost is bounded whatever it holds.

Engine-neutral: it knows the answer's shape (``worker.report``), not how it travelled.
"""

from __future__ import annotations

from typing import TypedDict

from .._version import __version__
from ..units import cut
from . import ROW_ERROR, ROW_NO_NVML, ROW_OK, WorkerGpu

__all__ = [
    "MAX_BYTES",
    "MAX_DEVICES",
    "MAX_TEXT",
    "ROW_UNREADABLE",
    "SIZE_FIELDS",
    "Unreadable",
    "other_version",
    "rows",
    "version_of",
]

ROW_UNREADABLE = "unreadable"
MAX_BYTES = 1 << 60  # an exbibyte: no GPU, nor a sum of them, comes near
MAX_TEXT = 64  # characters kept of a name, host, UUID or detail
MAX_DEVICES = 64  # devices read per worker
SIZE_FIELDS = ("used_bytes", "total_bytes", "process_bytes", "allocated_bytes",
               "reserved_bytes", "peak_allocated_bytes")



class _Base(TypedDict):
    """What every row of one worker's answer says: its address, name, host and process."""

    worker: str
    name: str
    host: str
    pid: int | None


class Unreadable(ValueError):
    """A field of the answer is not what gpumem_nb sends; the text says which and why."""


def _text(value: object, name: str, limit: int = MAX_TEXT) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Unreadable(f"{name} is {_kind(value)}, not text")
    return cut(value, limit)


def _kind(value: object) -> str:
    return f"a {type(value).__name__}"


def _count(value: object, name: str, limit: int) -> int | None:
    """A whole number from 0 up to ``limit``, or None (unknown)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise Unreadable(f"{name} is {_kind(value)}, not a whole number")
    if not 0 <= value < limit:
        raise Unreadable(f"{name} is out of range ({'negative' if value < 0 else 'too large'})")
    return int(value)


def version_of(answer: object) -> str | None:
    """The gpumem_nb version a worker's answer says it comes from; "" for an answer from a
    gpumem_nb that does not send its version (older ones); None when it is no dict."""
    if not isinstance(answer, dict):
        return None
    v = answer.get("gpumem_nb", "")
    return cut(v, 32) if isinstance(v, str) else "?"


def other_version(answer: object) -> str | None:
    """The worker's version when it differs from this kernel's; None when the same."""
    v = version_of(answer)
    if v is None or v == __version__:
        return None
    return v or "older, which does not send its version"


def rows(address: str, answer: object, known_name: str = "") -> tuple[list[WorkerGpu], int]:
    """The rows of one worker's answer (a dict of ``worker.report``'s shape), and how many
    of its devices were left out (beyond ``MAX_DEVICES``). Never raises."""
    address = cut(address, MAX_TEXT)
    if not isinstance(answer, dict):
        return [WorkerGpu(worker=address, name=known_name, status=ROW_UNREADABLE,
                          detail=f"the answer is {_kind(answer)}, not a dict")], 0
    try:
        base: _Base = dict(worker=address, name=_text(answer.get("name"), "name"),
                                    host=_text(answer.get("host"), "host"),
                                    pid=_count(answer.get("pid"), "pid", 1 << 32))
    except Unreadable as e:
        return [WorkerGpu(worker=address, name=known_name, status=ROW_UNREADABLE,
                          detail=str(e))], 0
    devices = answer.get("devices")
    if devices is None or (isinstance(devices, list | tuple) and not devices):
        try:
            nvml = _text(answer.get("nvml"), "nvml", 200)
        except Unreadable as e:
            return [WorkerGpu(**base, status=ROW_UNREADABLE, detail=str(e))], 0
        status = ROW_OK if nvml == "ok" else ROW_NO_NVML
        return [WorkerGpu(**base, status=status,
                          detail="no GPU visible" if status == ROW_OK else cut(nvml, 120))], 0
    if not isinstance(devices, list | tuple):
        return [WorkerGpu(**base, status=ROW_UNREADABLE,
                          detail=f"devices is {_kind(devices)}, not a list")], 0
    out = [_device(base, d, i) for i, d in enumerate(devices[:MAX_DEVICES])]
    return out, max(len(devices) - MAX_DEVICES, 0)


def _device(base: _Base, d: object, position: int) -> WorkerGpu:
    try:
        if not isinstance(d, dict):
            raise Unreadable(f"device {position} is {_kind(d)}, not a dict")
        sizes: dict[str, int | None] = {n: _count(d.get(n), n, MAX_BYTES) for n in SIZE_FIELDS}
        status = _text(d.get("status", "ok"), "status") or "ok"
        detail = _text(d.get("detail"), "detail", 80)
        return WorkerGpu(**base, device=_count(d.get("index"), "index", 1 << 20),
                         uuid=_text(d.get("uuid"), "uuid", 80),
                         gpu_name=_text(d.get("name"), "the GPU's name"), **sizes,
                         status=ROW_OK if status == "ok" else ROW_ERROR,
                         detail="" if status == "ok" else detail)
    except Unreadable as e:
        return WorkerGpu(**base, device=None, status=ROW_UNREADABLE, detail=str(e))
