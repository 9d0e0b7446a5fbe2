"""The Dask collector: ``Client.run`` calls gpumem_nb's ``report`` in every worker. The only
module that imports ``distributed``.

``Client.run`` is Dask's own out-of-band call: it reaches each worker process directly, takes
no task slot and leaves nothing on the cluster (no plugin, no agent of ours). Bounded twice:

- ``callback_timeout`` bounds the call on the client's event loop (a scheduler or worker that
  does not answer: the call is cancelled there);
- the call runs on a thread of ours, joined with the same timeout, so a client whose own loop
  is stuck cannot hold the cell either. While such a call is still out, no second one is sent.

A worker whose answer is an error says which: no gpumem_nb there (the function cannot be
loaded), or what it raised.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from . import (
    ROW_ERROR,
    ROW_NO_GPUMEM,
    ROW_NO_NVML,
    ROW_OK,
    ROW_UNKNOWN,
    ClusterReading,
    WorkerGpu,
)
from .worker import report

INSTALL_HINT = ("%gpumem cluster needs Dask's distributed: pip install 'gpumem-nb[cluster]' "
                "(or pip install 'dask[distributed]')")


def default_client() -> Any:
    """The current ``distributed.Client``; ``LookupError`` when there is none, ``ImportError``
    (with the install line) when Dask's distributed is not installed."""
    try:
        import distributed
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    try:
        return distributed.default_client()
    except ValueError as e:
        raise LookupError("no Dask client in this kernel: make one (from distributed import "
                          "Client; client = Client(...)) or name yours: %gpumem cluster NAME"
                          ) from e


def is_client(obj: Any) -> bool:
    try:
        import distributed
    except ImportError:
        return False
    return isinstance(obj, distributed.Client)


class DaskCollector:
    engine = "dask"

    def __init__(self, client: Any) -> None:
        self.client = client
        self._inflight: threading.Thread | None = None
        self._known: dict[str, WorkerGpu] = {}  # per worker, the last rows' identity
        self._lock = threading.Lock()

    @property
    def scheduler(self) -> str:
        try:
            return str(self.client.scheduler.address)
        except Exception:
            return ""

    @property
    def closed(self) -> bool:
        return str(getattr(self.client, "status", "")) in ("closed", "closing")

    def close(self) -> None:
        """Forget the client; the user's client is theirs to close."""
        self._known.clear()

    def collect(self, timeout_s: float) -> ClusterReading:
        now = time.monotonic()
        if self.closed:
            return self._unknown(now, "the Dask client is closed")
        with self._lock:
            if self._inflight is not None and self._inflight.is_alive():
                return self._unknown(now, "the previous request has not been answered yet")
            box: dict[str, Any] = {}

            def work() -> None:
                try:
                    box["answers"] = self.client.run(report, on_error="return",
                                                     callback_timeout=timeout_s)
                except BaseException as e:  # handed to the caller below
                    box["error"] = e

            thread = threading.Thread(target=work, name="gpumem_nb-cluster", daemon=True)
            thread.start()
            self._inflight = thread
        thread.join(timeout_s + 0.05)
        if thread.is_alive():
            return self._unknown(now, f"no answer within {timeout_s:g} s")
        if "error" in box:
            e = box["error"]
            why = f"no answer within {timeout_s:g} s" if isinstance(
                e, TimeoutError) else f"{type(e).__name__}: {e}"
            return self._unknown(now, why[:200])
        rows: list[WorkerGpu] = []
        for address, answer in box.get("answers", {}).items():
            rows.extend(self._rows(str(address), answer))
        rows.sort(key=lambda r: (r.name or r.worker, r.device if r.device is not None else -1))
        return ClusterReading(t_s=now, rows=tuple(rows), scheduler=self.scheduler)

    def _rows(self, address: str, answer: Any) -> list[WorkerGpu]:
        if isinstance(answer, BaseException):
            text = f"{type(answer).__name__}: {answer}"
            # The worker could not load the function: Dask hands back the ImportError itself,
            # or (raised before the call, while unpickling) an Exception carrying its text.
            missing = "gpumem_nb" in text and (isinstance(answer, ImportError)
                                               or "No module named" in text)
            row = WorkerGpu(worker=address, name=self._name(address),
                            status=ROW_NO_GPUMEM if missing else ROW_ERROR,
                            detail=("install gpumem-nb in the workers' environment"
                                    if missing else text[:120]))
            return [row]
        if not isinstance(answer, dict):
            return [WorkerGpu(worker=address, status=ROW_ERROR, detail="an unreadable answer")]
        base: dict[str, Any] = dict(worker=address, name=str(answer.get("name") or ""),
                    host=str(answer.get("host") or ""), pid=answer.get("pid"))
        devices = answer.get("devices") or []
        if not devices:
            nvml = str(answer.get("nvml") or "")
            status = ROW_OK if nvml == "ok" else ROW_NO_NVML
            rows = [WorkerGpu(**base, status=status,
                              detail=nvml if status != ROW_OK else "no GPU visible")]
        else:
            rows = [WorkerGpu(
                **base, device=d.get("index"), uuid=str(d.get("uuid") or ""),
                gpu_name=str(d.get("name") or ""), used_bytes=d.get("used_bytes"),
                total_bytes=d.get("total_bytes"), process_bytes=d.get("process_bytes"),
                allocated_bytes=d.get("allocated_bytes"),
                reserved_bytes=d.get("reserved_bytes"),
                peak_allocated_bytes=d.get("peak_allocated_bytes"),
                status=ROW_OK if d.get("status", "ok") == "ok" else ROW_ERROR,
                detail="" if d.get("status", "ok") == "ok" else str(d.get("detail"))[:80],
            ) for d in devices]
        for r in rows:
            self._known[f"{r.worker}/{r.device}"] = r
        return rows

    def _name(self, address: str) -> str:
        return next((r.name for r in self._known.values() if r.worker == address), "")

    def _unknown(self, now: float, why: str) -> ClusterReading:
        """The workers last seen, every figure unknown: never a stale number shown as now."""
        rows = tuple(WorkerGpu(worker=r.worker, name=r.name, host=r.host, pid=r.pid,
                               device=r.device, uuid=r.uuid, gpu_name=r.gpu_name,
                               status=ROW_UNKNOWN, detail=why)
                     for r in sorted(self._known.values(), key=lambda r: (r.worker,
                                                                          r.device or 0)))
        return ClusterReading(t_s=now, rows=rows, scheduler=self.scheduler,
                              status=ROW_UNKNOWN, detail=why)
