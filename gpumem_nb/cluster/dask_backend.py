"""The Dask collector: ``Client.run`` calls gpumem_nb's ``report`` in every worker. The only
module that imports ``distributed``.

``Client.run`` is Dask's own out-of-band call: it reaches each worker process directly, takes
no task slot and leaves nothing on the cluster (no plugin, no agent of ours). Bounded twice:

- ``callback_timeout`` bounds the call on the client's event loop (a scheduler or worker that
  does not answer: the call is cancelled there);
- the call runs on a thread of ours, joined with the same timeout, so a client whose own loop
  is stuck cannot hold the cell either.

One request is out at a time: a second caller (``%gpumem cluster`` while the chart's feed is
collecting) waits on the one already out, within its own timeout, and reads its answer; it
neither doubles the broadcast nor gets a row of "unknown" for the other's sake.

An asynchronous client (``await Client(..., asynchronous=True)``) answers only on its own
event loop, which in a notebook is the kernel's: busy running the very cell that asks. Such a
client is asked through a synchronous client of ours to the same scheduler (its own loop
thread, the user's security settings), made on first use and closed with the collector.

A worker whose answer is an error says which: no gpumem_nb there (the function cannot be
loaded), or what it raised.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .. import userexc
from .._version import __version__
from ..units import cut
from . import (
    READING_CLOSED,
    ROW_ERROR,
    ROW_NO_GPUMEM,
    ROW_UNKNOWN,
    ClusterReading,
    WorkerGpu,
    natural_key,
)
from . import answer as answer_mod
from .worker import report

__all__ = [
    "CLOSE_WAIT_S",
    "INSTALL_HINT",
    "MAX_VERSION_NOTES",
    "DaskCollector",
    "client_closed",
    "default_client",
    "is_client",
]

INSTALL_HINT = ("%gpumem cluster needs Dask's distributed: pip install 'gpumem-nb[cluster]' "
                "(or pip install 'dask[distributed]')")
# Notes naming other gpumem_nb versions among the workers: a few, then a count (a bounded
# output, however many versions a cluster mixes).
MAX_VERSION_NOTES = 3
CLOSE_WAIT_S = 0.5  # how long closing our own client may hold an unload


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


def is_client(obj: object) -> bool:
    try:
        import distributed
    except ImportError:
        return False
    try:  # isinstance reads obj.__class__, which an object may make raise
        return isinstance(obj, distributed.Client)
    except Exception:
        return False


def client_closed(client: object) -> bool:
    try:
        return str(getattr(client, "status", "")) in ("closed", "closing")
    except Exception:
        return False


def _asynchronous(client: object) -> bool:
    # The mode the client was made in: its public ``asynchronous`` answers for the calling
    # thread's loop, which is not the question here.
    try:
        return bool(getattr(client, "_asynchronous", False))
    except Exception:
        return False


@dataclass
class _Request:
    """One ``Client.run`` broadcast, out on a thread of ours."""

    thread: threading.Thread
    box: dict[str, object] = field(default_factory=dict)

    @property
    def out(self) -> bool:
        return self.thread.is_alive()


class DaskCollector:
    engine = "dask"

    def __init__(self, client: Any) -> None:
        self.client = client
        self._inflight: _Request | None = None
        # Per worker and device, the last answer's rows: names for the rows of a scheduler
        # that does not answer. Replaced by each answer, so retired workers leave it.
        self._known: dict[str, WorkerGpu] = {}
        self._lock = threading.Lock()
        self._own: Any = None  # our synchronous client, for an asynchronous one

    @property
    def scheduler(self) -> str:
        try:
            return str(self.client.scheduler.address)
        except Exception:
            return ""

    @property
    def closed(self) -> bool:
        return client_closed(self.client)

    def close(self) -> None:
        """Forget the workers and close our own client, if one was made; the user's client
        is theirs to close."""
        with self._lock:
            self._known = {}
            own, self._own = self._own, None
        if own is not None:
            _close_soon(own)

    def collect(self, timeout_s: float) -> ClusterReading:
        now = time.monotonic()
        deadline = now + timeout_s
        if self.closed:
            self.close()
            return ClusterReading(t_s=now, rows=(), scheduler=self.scheduler,
                                  status=READING_CLOSED, detail="the Dask client is closed")
        req = None
        for _attempt in range(2):
            with self._lock:
                joined = self._inflight is not None and self._inflight.out
                if not joined:
                    self._inflight = self._send(timeout_s)
                req = self._inflight
            assert req is not None
            req.thread.join(max(deadline - time.monotonic(), 0.0) + 0.05)
            # The request another caller sent gave up (its own, shorter, timeout) while this
            # call still has time: ask once more.
            if not (joined and not req.out and "error" in req.box
                    and deadline - time.monotonic() > 0.1):
                break
        assert req is not None
        if req.out:
            return self._unknown(now, f"no answer within {timeout_s:g} s")
        if "error" in req.box:
            e = req.box["error"]
            why = f"no answer within {timeout_s:g} s" if isinstance(
                e, TimeoutError) else f"{type(e).__name__}: {e}"
            return self._unknown(now, why[:200])
        answers = req.box.get("answers")
        if not isinstance(answers, dict):
            return self._unknown(now, "the client gave an unreadable answer")
        rows: list[WorkerGpu] = []
        left_out = 0
        versions: dict[str, list[str]] = {}
        with self._lock:
            for position, (address, answer) in enumerate(answers.items()):
                try:
                    where = str.__str__(address) if isinstance(address, str) else str(address)
                    got, cut_devices = self._rows(where, answer)
                    other = answer_mod.other_version(answer)
                    if other is not None:
                        other = str.__str__(other)
                except Exception as e:
                    # Answers are checked field by field (cluster.answer); this is the
                    # backstop for what no check foresaw (an exception whose text raises, a
                    # key of a str subclass), so one worker is one unreadable row, never a
                    # traceback in %gpumem cluster.
                    got, cut_devices, other = [WorkerGpu(
                        worker=f"worker {position}", status=answer_mod.ROW_UNREADABLE,
                        detail=f"the answer could not be read ({userexc.type_name(e)})")], 0, None
                rows.extend(got)
                left_out += cut_devices
                if other is not None:
                    versions.setdefault(other, []).append(got[0].name or got[0].worker)
            self._known = {f"{r.worker}/{r.device}": r for r in rows}
        rows.sort(key=_order)
        listed = answer_mod.MAX_TEXT
        notes = [f"{len(names)} worker(s) run another gpumem_nb ({v}) than this kernel's "
                 f"{__version__}: {cut(', '.join(sorted(names, key=natural_key)), listed)}"
                 ". Their rows may read as unreadable: install the same version there."
                 for v, names in sorted(versions.items())[:MAX_VERSION_NOTES]]
        if len(versions) > MAX_VERSION_NOTES:
            notes.append(f"{len(versions) - MAX_VERSION_NOTES} more gpumem_nb version(s) "
                         "among the workers were not listed.")
        if left_out:
            notes.append(f"{left_out} device(s) beyond {answer_mod.MAX_DEVICES} per worker "
                         "were left out.")
        return ClusterReading(t_s=now, rows=tuple(rows), scheduler=self.scheduler,
                              notes=tuple(notes))

    def _send(self, timeout_s: float) -> _Request:
        box: dict[str, object] = {}

        def work() -> None:
            try:
                answers = self._run_client(timeout_s).run(report, on_error="return",
                                                          callback_timeout=timeout_s)
                if inspect.isawaitable(answers):  # an asynchronous client after all
                    close = getattr(answers, "close", None)
                    if callable(close):
                        close()  # never awaited: closed, so no warning is left behind
                    raise RuntimeError("the client answered asynchronously")
                box["answers"] = answers
            except BaseException as e:  # handed to the caller
                box["error"] = e

        req = _Request(threading.Thread(target=work, name="gpumem_nb-cluster", daemon=True), box)
        req.thread.start()
        return req

    def _run_client(self, timeout_s: float) -> Any:
        """The client to call ``run`` on: the user's, or (for an asynchronous one) ours."""
        if not _asynchronous(self.client):
            return self.client
        with self._lock:
            own = self._own
        if own is not None and not client_closed(own):
            return own
        import distributed

        own = distributed.Client(self.scheduler, set_as_default=False, asynchronous=False,
                                 security=getattr(self.client, "security", None),
                                 timeout=max(timeout_s, 1.0))
        with self._lock:
            old, self._own = self._own, own
        if old is not None:
            _close_soon(old)
        return own

    def _rows(self, address: str, answer: object) -> tuple[list[WorkerGpu], int]:
        """The rows of one worker's answer, and how many of its devices were left out."""
        if isinstance(answer, BaseException):
            # Through userexc: the worker's exception may be any class, its text may raise.
            text = f"{userexc.type_name(answer)}: {userexc.text(answer)[:1000]}"
            # The worker could not load the function: Dask hands back the ImportError itself,
            # or (raised before the call, while unpickling) an Exception carrying its text.
            missing = "gpumem_nb" in text and (isinstance(answer, ImportError)
                                               or "No module named" in text)
            row = WorkerGpu(worker=address, name=self._name(address),
                            status=ROW_NO_GPUMEM if missing else ROW_ERROR,
                            detail=("install gpumem-nb in the workers' environment"
                                    if missing else cut(text, 120)))
            return [row], 0
        return answer_mod.rows(address, answer, self._name(address))

    def _name(self, address: str) -> str:
        return next((r.name for r in self._known.values() if r.worker == address), "")

    def _unknown(self, now: float, why: str) -> ClusterReading:
        """The workers last seen, every figure unknown: never a stale number shown as now."""
        with self._lock:
            known = list(self._known.values())
        rows = sorted((WorkerGpu(worker=r.worker, name=r.name, host=r.host, pid=r.pid,
                                 device=r.device, uuid=r.uuid, gpu_name=r.gpu_name,
                                 status=ROW_UNKNOWN, detail=why) for r in known), key=_order)
        return ClusterReading(t_s=now, rows=tuple(rows), scheduler=self.scheduler,
                              status=ROW_UNKNOWN, detail=why)


def _order(r: WorkerGpu) -> tuple[tuple[tuple[int, int, str], ...], int]:
    return (natural_key(r.name or r.worker), r.device if r.device is not None else -1)


def _close_soon(client: Any) -> None:
    """Close a client of ours without holding the caller past ``CLOSE_WAIT_S``: a scheduler
    that does not answer makes ``close`` wait for its own timeout, on its own thread."""
    def work() -> None:
        with contextlib.suppress(Exception):  # closing what we made: nothing of the user's
            client.close(timeout=2)

    thread = threading.Thread(target=work, name="gpumem_nb-cluster-close", daemon=True)
    thread.start()
    thread.join(CLOSE_WAIT_S)
