"""The explainer's scans of the session at an OOM: what it needs from the monitor
(``OomHost``), the time its scans give autograd graphs, when the retention search runs for
what the walk did not reach and which of its finds the explanation names, and each large
holder's ``del`` line checked against the retention graph."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Protocol

from ..analysis import holder_advice
from ..cleanup import CleanupReport, CleanupRequest
from ..model import Holder, Sample
from ..sources.torch import TorchDebug
from .causes import held_holders
from .pieces import Pieces

__all__ = [
    "CUT_CHECK_MIN_BYTES",
    "EXPLAIN_GRAPH_BUDGET_S",
    "REST_FLOOR_BYTES",
    "REST_SHARE",
    "OomHost",
    "add_searched",
    "check_cuts",
    "rest_min_bytes",
    "scan_rest",
    "searched_holders",
]


class OomHost(Protocol):
    """What the explainer needs from the monitor."""

    shell: Any
    source: Any

    def scan(self, include_gc: bool = False,
             graph_budget_s: float | None = None,
             rest_min_bytes: int | None = None,
             allocated_bytes: int | None = None) -> list[Holder]: ...

    def read(self) -> Sample: ...

    def cleanup(self, request: CleanupRequest) -> CleanupReport: ...


# The explainer's two scans (in the observer, then the dry run after the failure) each get this
# long for autograd graphs, so that the whole explanation stays within its 50 ms.
EXPLAIN_GRAPH_BUDGET_S = 0.015
# The retention search runs at an OOM when the GPU tensors the walk did not reach come to more
# than this share of what was allocated (the explanation's "not found" bound).
REST_SHARE = 0.02
# ... and to at least this much. With next to nothing allocated (an impossible request, other
# processes or another library holding the GPU), 2% of it is a few bytes, and the search
# walked the whole heap for them: 210-400 ms on the H200 in a bare torch process
# (benchmarks/results/gpu_tests_b_f6f6186_h200.log), where the walk alone takes 1 ms. No
# holder this small is what ran a GPU out of memory.
REST_FLOOR_BYTES = 64 << 20
CUT_CHECK_MIN_BYTES = 256 << 20  # a holder smaller than this is not worth the search


def rest_min_bytes(allocated_bytes: int) -> int:
    """What the GPU tensors the walk did not reach must come to for the retention search to
    run at an OOM."""
    return max(int(REST_SHARE * allocated_bytes), REST_FLOOR_BYTES)


def scan_rest(host: OomHost, rest_min_bytes: int | None,
              allocated_bytes: int | None) -> list[Holder]:
    """The host's scan with the retention search for what the walk leaves unexplained; a
    stand-in host that takes no such arguments scans as before."""
    try:
        return host.scan(graph_budget_s=EXPLAIN_GRAPH_BUDGET_S, rest_min_bytes=rest_min_bytes,
                         allocated_bytes=allocated_bytes)
    except TypeError:
        return host.scan(graph_budget_s=EXPLAIN_GRAPH_BUDGET_S)


def searched_holders(found: Iterable[Holder], device: int,
                     previous_error: bool) -> tuple[Holder, ...]:
    """The search's finds that the explanation names on the failing GPU. Not what it could
    not search; what only something unseen keeps is named in the split, never a cause
    (``causes._NOT_HELD``); not garbage where the previous error's replaced traceback
    explains it (IPython's frames keep that in a reference cycle: ``causes._held`` tells its
    story)."""
    skip = ("not searched",) + (("garbage",) if previous_error else ())
    return tuple(h for h in found if h.searched and h.kind not in skip
                 and h.device in (f"cuda:{device}", "cuda"))


def check_cuts(host: OomHost, pieces: Pieces, device: int) -> None:
    """Each large held holder whose advice is a ``del`` line, that line checked against
    the retention graph (``holders/verify.py``): a module's global, a running thread or
    cycles that also keep the bytes join the line or say why no line frees them. After
    the failure: the holders lived through it."""
    check = getattr(host, "check_cuts", None)
    if check is None:
        return
    lines: dict[str, str] = {}
    for h in held_holders(pieces.judged, device)[:5]:
        if h.kind not in ("variable", "container") or h.held_bytes < CUT_CHECK_MIN_BYTES:
            continue
        code = holder_advice(h).code
        if code.startswith("del "):
            lines[h.name] = code
    if not lines:
        return
    try:
        # Keyed by name and device: one variable is a holder per device (an optimizer's
        # CUDA state and its step counts on the CPU), and by name alone the CPU holder's
        # checked copy replaced the CUDA one: 34 GiB of `sched.optimizer`'s state fell out
        # of the H200's explanation as "not found".
        done = {(h.name, h.device): h for h in check(pieces.judged, lines)
                if h.name in lines}
    except Exception:
        return  # the advice stays as the walk gave it
    pieces.judged = tuple(done.get((h.name, h.device), h) for h in pieces.judged)
    pieces.holders = tuple(done.get((h.name, h.device), h) for h in pieces.holders)


def add_searched(host: OomHost, torch: TorchDebug, pieces: Pieces) -> None:
    """With the observer (whose walk ran before the exception unwound): what the walk
    from the names cannot reach, found up from the tensors themselves
    (``holders/retention.py``): a module's global, a class attribute, a queue or a data
    frame's object column, a live thread's locals, garbage in reference cycles. Searched
    after the failure, when only the computation's temporaries are gone: whatever it
    finds lived through the failure. Run when what PyTorch has allocated now is more
    than the walk accounts for by ``REST_SHARE`` of what was allocated at the failure."""
    f = pieces.facts
    if f.allocated_bytes is None:
        return
    now = torch.read(f.device)
    # cuBLAS's workspaces are allocated blocks no Python object holds: a search for their
    # holder walked the whole heap for nothing (2.5 s beside CuPy on the H100).
    found = scan_rest(host, rest_min_bytes(f.allocated_bytes),
                      now.allocated_bytes - f.workspaces_bytes if now is not None
                      else None)
    known = {h.name for h in pieces.judged}
    extra = tuple(h for h in searched_holders(found, f.device, bool(f.previous_error))
                  if h.name not in known)
    if not extra:
        return
    pieces.holders = (*pieces.holders, *extra)
    pieces.judged = (*pieces.judged, *extra)
    if f.unreachable_bytes is not None:
        # What only something unseen keeps stays "reachable from nothing the scan
        # walks" for the cause; the ledger names it apart.
        pieces.facts = replace(f, unreachable_bytes=max(
            f.unreachable_bytes - sum(h.held_bytes for h in extra if h.kind != "unseen"),
            0))
