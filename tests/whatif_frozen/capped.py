"""What a replay capped far below its peak gave before the release pass kept its
releasable blocks apart (``BlockPool.releasable``): every field of each replay, and the
events whose request ran out, for ``test_whatif_frozen``'s capped cases. The outcomes in
``capped_outcomes.json`` were written by ``freeze`` from the model of commit a7fde16, whose
last retry before each OOM walked every free block of every pool. Never rewrite them to
follow a change: a change that makes them disagree changes what the what-if predicts.

    python -c "from tests.test_whatif_frozen import freeze_capped; freeze_capped()"
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpumem_nb.whatif.allocator import DeviceCachingAllocator

# The package's ``replay`` is the function: the module is read from sys.modules.
replay_module = importlib.import_module("gpumem_nb.whatif.replay")
OUTCOMES = Path(__file__).with_name("capped_outcomes.json")


class _Counted(DeviceCachingAllocator):
    """The model, noting the event of each request that ran out (``now`` is the event the
    replay is at, on the inline loops' general steps and on the per-event path alike)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.oom_events: list[int] = []

    def _malloc(self, *args: Any) -> Any:
        block, oom = super()._malloc(*args)
        if oom:
            self.oom_events.append(self.now)
        return block, oom


@contextmanager
def counting() -> Iterator[list[_Counted]]:
    """Replays made meanwhile use ``_Counted``; the models made are listed."""
    made: list[_Counted] = []
    was = replay_module.DeviceCachingAllocator

    def make(*args: Any, **kw: Any) -> _Counted:
        m = _Counted(*args, **kw)
        made.append(m)
        return m

    replay_module.DeviceCachingAllocator = make  # type: ignore[assignment,misc]
    try:
        yield made
    finally:
        replay_module.DeviceCachingAllocator = was  # type: ignore[misc]


def outcome(run: Callable[[], Any]) -> dict[str, Any]:
    """``run()`` replays once: its fields and the events that ran out, with a digest of all
    of it (the changes of reserved and the demand records are long) and the figures a
    failure is read by."""
    with counting() as made:
        r = run()
    (model,) = made
    ooms = model.oom_events
    record = {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}
    record["oom_events"] = ooms
    blob = json.dumps(record, sort_keys=True, default=list).encode()
    return {"digest": hashlib.sha256(blob).hexdigest(),
            "peak_reserved_bytes": r.peak_reserved_bytes,
            "end_reserved_bytes": r.end_reserved_bytes,
            "num_alloc_retries": r.num_alloc_retries, "segment_frees": r.segment_frees,
            "ooms": len(ooms), "first_ooms": ooms[:5], "last_oom": ooms[-1] if ooms else None}


def load() -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = json.loads(OUTCOMES.read_text())
    return data


def write(outcomes: dict[str, dict[str, Any]]) -> None:
    OUTCOMES.write_text(json.dumps(outcomes, indent=1, sort_keys=True) + "\n")
