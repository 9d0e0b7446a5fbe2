"""The explainer's scans of the session at an OOM: what it needs from the monitor
(``OomHost``), the time its scans give autograd graphs, when the retention search runs for
what the walk did not reach, and which of that search's finds the explanation names."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from ..cleanup import CleanupReport, CleanupRequest
from ..model import Holder, Sample


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
