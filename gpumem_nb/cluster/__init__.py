"""A cluster's GPUs beside the kernel's own: one row per worker and GPU, devices counted once.

Dask's own ``scheduler_info()`` carries each worker's NVML reading of the *whole device*, so two
workers on one GPU count it twice, and it has no allocator figures. Here each worker runs
gpumem_nb's own sources (``cluster.worker.report``: NVML, the allocator read without importing
torch, the worker process's own NVML share) through the cluster engine's own machinery, and the
rows are joined by device UUID.

Layout: this module holds the records, the collector protocol and the table; ``worker`` is what
runs in a worker (imports no engine); ``dask_backend`` is the one Dask implementation and the
only importer of ``distributed``; ``feed`` polls a collector off the cell's path for the chart.
Nothing here is imported unless the user asks for a cluster view. Another engine (Ray's
per-process GPU metrics, say) is one more class with ``collect`` and ``close``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

from ..report import Shown, html_lines, html_table, text_table
from ..units import MAX_NAME_CHARS, cut, format_bytes, printable

__all__ = [
    "HEADERS",
    "MAX_CELL",
    "MAX_ROWS",
    "MAX_SHARED_LINES",
    "READING_CLOSED",
    "ROW_ERROR",
    "ROW_NO_GPUMEM",
    "ROW_NO_NVML",
    "ROW_OK",
    "ROW_UNKNOWN",
    "ClusterDevice",
    "ClusterReading",
    "ClusterView",
    "Collector",
    "WorkerGpu",
    "natural_key",
]

ROW_OK = "ok"
ROW_UNKNOWN = "unknown"  # no answer in time: figures unknown, not zero
ROW_NO_GPUMEM = "no gpumem_nb"
ROW_NO_NVML = "no NVML"
ROW_ERROR = "error"
READING_CLOSED = "closed"  # the whole collection: the client is closed, nothing was asked


@dataclass(frozen=True)
class WorkerGpu:
    """One worker and one of its GPUs (or the worker alone, when it reports none)."""

    worker: str  # the worker's address
    name: str = ""  # the worker's name
    host: str = ""
    pid: int | None = None
    device: int | None = None  # the CUDA index inside the worker
    uuid: str = ""
    gpu_name: str = ""
    used_bytes: int | None = None  # NVML, the whole device
    total_bytes: int | None = None
    process_bytes: int | None = None  # NVML, this worker process's own share
    allocated_bytes: int | None = None  # the worker's PyTorch allocator
    reserved_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    status: str = ROW_OK
    detail: str = ""


@dataclass(frozen=True)
class ClusterDevice:
    """A physical GPU (or MIG instance) by UUID, whichever workers share it."""

    uuid: str
    host: str
    gpu_name: str
    used_bytes: int | None
    total_bytes: int | None
    workers: tuple[str, ...]


@dataclass(frozen=True)
class ClusterReading:
    """One collection from every worker."""

    t_s: float
    rows: tuple[WorkerGpu, ...]
    engine: str = "dask"
    scheduler: str = ""
    status: str = ROW_OK  # ok, or why the whole collection failed (rows then unknown)
    detail: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def devices(self) -> list[ClusterDevice]:
        """Each device once, by UUID: the largest "used" any of its workers read (they read
        the same device a moment apart)."""
        by_uuid: dict[str, list[WorkerGpu]] = {}
        for r in self.rows:
            if r.uuid and r.status == ROW_OK:
                by_uuid.setdefault(r.uuid, []).append(r)
        out = []
        for uuid, rows in by_uuid.items():
            used = [r.used_bytes for r in rows if r.used_bytes is not None]
            total = next((r.total_bytes for r in rows if r.total_bytes is not None), None)
            out.append(ClusterDevice(uuid=uuid, host=rows[0].host, gpu_name=rows[0].gpu_name,
                                     used_bytes=max(used) if used else None, total_bytes=total,
                                     workers=tuple(r.name or r.worker for r in rows)))
        return out


class Collector(Protocol):
    """What a cluster engine gives gpumem_nb: a bounded collection, and a way to stop."""

    engine: str

    def collect(self, timeout_s: float) -> ClusterReading:
        """Every worker's rows; never raises, never waits much past ``timeout_s`` (rows of a
        worker or scheduler that did not answer are ``unknown``)."""
        ...

    def close(self) -> None: ...


def natural_key(text: str) -> tuple[tuple[int, int, str], ...]:
    """Sorts worker names as people number them: 2 before 10, not "10" before "2"."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in re.split(r"(\d+)", text) if part)


# The table shows at most this many rows, and the shared-GPU lines this many GPUs: a
# cluster of 100,000 devices printed 26.6 MB of text (121 MB of HTML) and took a minute.
# The rest are counted in the sums and said to be left out; ``-o`` gives every row.
MAX_ROWS = 100
MAX_SHARED_LINES = 20
MAX_CELL = MAX_NAME_CHARS  # characters kept of a name or host in a cell

HEADERS = ("worker", "host", "GPU", "UUID", "NVML used / total", "this worker",
           "allocated", "reserved", "peak allocated", "status")


def _short_uuid(uuid: str) -> str:
    return cut(uuid, 16)


def _row(r: WorkerGpu) -> list[str]:
    gpu = "—" if r.device is None else f"{r.device}" + (f": {r.gpu_name}" if r.gpu_name else "")
    used = "—" if r.total_bytes is None and r.used_bytes is None else \
        f"{format_bytes(r.used_bytes)} / {format_bytes(r.total_bytes)}"
    status = r.status + (f": {r.detail}" if r.detail else "")
    # Names, hosts and error text come from the workers: printed escaped, never raw.
    return [printable(cut(r.name or r.worker, MAX_CELL)),
            printable(cut(r.host, MAX_CELL)) or "—", printable(cut(gpu, MAX_CELL)),
            printable(_short_uuid(r.uuid)) or "—", used,
            format_bytes(r.process_bytes), format_bytes(r.allocated_bytes),
            format_bytes(r.reserved_bytes), format_bytes(r.peak_allocated_bytes),
            printable(status)[:80]]


class ClusterView(Shown):
    """``%gpumem cluster``: the table, and each device counted once."""

    def __init__(self, reading: ClusterReading) -> None:
        self.reading = reading

    def rows(self) -> list[list[str]]:
        """The table's rows: the first ``MAX_ROWS`` (``lines()`` says how many were left
        out)."""
        return [_row(r) for r in self.reading.rows[:MAX_ROWS]]

    def lines(self) -> list[str]:
        rd = self.reading
        out = []
        if rd.status == READING_CLOSED:
            out.append(f"The {rd.engine} client is closed, so its workers were not asked: "
                       "make a new client, or name an open one (%gpumem cluster NAME).")
        elif rd.status != ROW_OK:
            where = f" {printable(rd.scheduler)}" if rd.scheduler else ""
            out.append(f"The {rd.engine} scheduler{where} did not answer: "
                       f"{printable(rd.detail)}. Its workers' figures are unknown.")
        devices = rd.devices()
        workers = {r.worker for r in rd.rows}
        if devices:
            used = [d.used_bytes for d in devices if d.used_bytes is not None]
            total = [d.total_bytes for d in devices if d.total_bytes is not None]
            out.append(f"{len(workers)} worker(s) on {len(devices)} GPU(s), each GPU counted "
                       f"once by UUID: {format_bytes(sum(used) if used else None)} used of "
                       f"{format_bytes(sum(total) if total else None)}.")
            shared = [d for d in devices if len(d.workers) > 1]
            out.extend(printable(cut(
                f"  {_short_uuid(d.uuid)} ({cut(d.gpu_name or 'GPU', MAX_CELL)} on "
                f"{cut(d.host or '?', MAX_CELL)}): {format_bytes(d.used_bytes)} used, shared by "
                f"workers {', '.join(d.workers)}", 200))
                for d in shared[:MAX_SHARED_LINES])
            if len(shared) > MAX_SHARED_LINES:
                out.append(f"  … and {len(shared) - MAX_SHARED_LINES} more shared GPU(s).")
        elif rd.status == ROW_OK:
            out.append(f"{len(workers)} worker(s), none with a GPU gpumem_nb could read.")
        if len(rd.rows) > MAX_ROWS:
            unreadable = sum(r.status not in (ROW_OK, ROW_UNKNOWN) for r in rd.rows[MAX_ROWS:])
            out.append(f"The table shows {MAX_ROWS} of {len(rd.rows)} rows; the other "
                       f"{len(rd.rows) - MAX_ROWS} ({unreadable} of them not ok) are counted "
                       "above but left out. %gpumem cluster -o returns every row.")
        out.extend(printable(cut(n, 300)) for n in rd.notes)
        return out

    def __str__(self) -> str:
        parts = []
        if self.reading.rows:
            parts.append(text_table(HEADERS, self.rows()))
        parts.extend(self.lines())
        return "\n".join(parts)

    def _repr_html_(self) -> str:
        table = html_table(HEADERS, self.rows()) if self.reading.rows else ""
        return table + html_lines(self.lines())
