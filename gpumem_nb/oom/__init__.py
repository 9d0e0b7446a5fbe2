"""Explain a CUDA out-of-memory error in the cell that hit it, one job to a file:

- ``message``: the parser, every format PyTorch has printed, into one ``OomMessage``;
- ``facts``: the numbers at the failure (``OomFacts``);
- ``causes``: ``classify``, the causes most specific first, decided from measured numbers;
- ``advice``: the ``OomExplanation`` and ``next_steps``, what to do and what each step frees;
- ``site``: where it failed, from the traceback's frames (the module, a backward, generation);
- ``watch``: the runtime (``OomWatch``): the allocator's OOM observer, the readings at the
  failure, and turning a failing cell into an explanation.

Nothing here imports torch or IPython.
"""

from __future__ import annotations

from ..errtext import error_str
from .advice import (
    Action,
    OomExplanation,
    SiteAtFailure,
    child_advice,
    next_steps,
    pool_action,
)
from .causes import (
    CAUSE_FRAGMENTATION,
    CAUSE_GARBAGE,
    CAUSE_HELD,
    CAUSE_IMPOSSIBLE,
    CAUSE_OTHER_PROCESSES,
    CAUSE_OUTSIDE,
    CAUSE_POOL,
    CAUSE_PRIVATE_POOL,
    CAUSE_UNKNOWN,
    CAUSE_WORKING_SET,
    CONTEXT_ALLOWANCE_BYTES,
    KIND_FAILED_CALL,
    KIND_RUNNING,
    UNREACHABLE,
    UNREACHABLE_AT_START,
    Cause,
    cell_working_set_bytes,
    classify,
    garbage_plausible,
    held_holders,
    pool_owner_text,
)
from .event import OomEvent, with_counted_ooms
from .facts import (
    POOL_GRAPH,
    POOL_USER,
    OomFacts,
    PoolUse,
    ProcessUse,
)
from .message import (
    FORM_ASYNC,
    FORM_CLASSIC,
    FORM_DRIVER,
    FORM_NATIVE,
    FORM_SIZE_CHECK,
    FORM_UNKNOWN,
    WINDOW_CHARS,
    GiB,
    MiB,
    OomMessage,
    _window,
    find_cuda_oom,
    first_line,
    is_cuda_oom,
    parse_oom_message,
)
from .processes import describe_pid
from .scans import EXPLAIN_GRAPH_BUDGET_S, OomHost
from .segments import pool_id_of, pools_in
from .site import (
    CacheUse,
    FailureSite,
    failure_site,
    mark_running,
    module_paths,
)
from .watch import OomWatch

__all__ = [
    "CAUSE_FRAGMENTATION",
    "CAUSE_GARBAGE",
    "CAUSE_HELD",
    "CAUSE_IMPOSSIBLE",
    "CAUSE_OTHER_PROCESSES",
    "CAUSE_OUTSIDE",
    "CAUSE_POOL",
    "CAUSE_PRIVATE_POOL",
    "CAUSE_UNKNOWN",
    "CAUSE_WORKING_SET",
    "CONTEXT_ALLOWANCE_BYTES",
    "EXPLAIN_GRAPH_BUDGET_S",
    "FORM_ASYNC",
    "FORM_CLASSIC",
    "FORM_DRIVER",
    "FORM_NATIVE",
    "FORM_SIZE_CHECK",
    "FORM_UNKNOWN",
    "KIND_FAILED_CALL",
    "KIND_RUNNING",
    "POOL_GRAPH",
    "POOL_USER",
    "UNREACHABLE",
    "UNREACHABLE_AT_START",
    "WINDOW_CHARS",
    "Action",
    "CacheUse",
    "Cause",
    "FailureSite",
    "GiB",
    "MiB",
    "OomEvent",
    "OomExplanation",
    "OomFacts",
    "OomHost",
    "OomMessage",
    "OomWatch",
    "PoolUse",
    "ProcessUse",
    "SiteAtFailure",
    "_window",
    "cell_working_set_bytes",
    "child_advice",
    "classify",
    "describe_pid",
    "error_str",
    "failure_site",
    "find_cuda_oom",
    "first_line",
    "garbage_plausible",
    "held_holders",
    "is_cuda_oom",
    "mark_running",
    "module_paths",
    "next_steps",
    "parse_oom_message",
    "pool_action",
    "pool_id_of",
    "pool_owner_text",
    "pools_in",
    "with_counted_ooms",
]
