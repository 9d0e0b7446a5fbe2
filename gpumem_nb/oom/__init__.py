"""Explain a CUDA out-of-memory error in the cell that hit it, one job to a file:

- ``message``: the parser, every format PyTorch has printed, into one ``OomMessage``;
- ``facts``: the numbers at the failure (``OomFacts``);
- ``causes``: ``classify``, the causes most specific first, decided from measured numbers;
- ``advice``: the ``OomExplanation`` and ``next_steps``, what to do and what each step frees;
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
)
from .causes import (
    CAUSE_FRAGMENTATION,
    CAUSE_HELD,
    CAUSE_IMPOSSIBLE,
    CAUSE_OTHER_PROCESSES,
    CAUSE_OUTSIDE,
    CAUSE_POOL,
    CAUSE_UNKNOWN,
    CAUSE_WORKING_SET,
    CONTEXT_ALLOWANCE_BYTES,
    KIND_FAILED_CALL,
    UNREACHABLE,
    UNREACHABLE_AT_START,
    Cause,
    cell_working_set_bytes,
    classify,
    garbage_plausible,
    held_holders,
)
from .facts import (
    OomFacts,
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
from .watch import (
    EXPLAIN_GRAPH_BUDGET_S,
    OomEvent,
    OomHost,
    OomWatch,
    describe_pid,
    with_counted_ooms,
)

__all__ = [
    "CAUSE_FRAGMENTATION",
    "CAUSE_HELD",
    "CAUSE_IMPOSSIBLE",
    "CAUSE_OTHER_PROCESSES",
    "CAUSE_OUTSIDE",
    "CAUSE_POOL",
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
    "UNREACHABLE",
    "UNREACHABLE_AT_START",
    "WINDOW_CHARS",
    "Action",
    "Cause",
    "GiB",
    "MiB",
    "OomEvent",
    "OomExplanation",
    "OomFacts",
    "OomHost",
    "OomMessage",
    "OomWatch",
    "ProcessUse",
    "SiteAtFailure",
    "_window",
    "cell_working_set_bytes",
    "child_advice",
    "classify",
    "describe_pid",
    "error_str",
    "find_cuda_oom",
    "first_line",
    "garbage_plausible",
    "held_holders",
    "is_cuda_oom",
    "next_steps",
    "parse_oom_message",
    "with_counted_ooms",
]
