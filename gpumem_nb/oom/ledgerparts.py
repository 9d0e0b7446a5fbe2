"""The failure's split of allocated bytes (``ledger.py``'s parts, as the explanation gives
them): the holders on the GPU, the failing computation's working set, each private pool's
tensors that no holder keeps, and what a collection freed after the failure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..ledger import Ledger, ledger
from ..model import Holder
from .causes import cell_working_set_bytes, pool_owner_text
from .facts import OomFacts, PoolUse
from .rawpart import with_raw_blocks

__all__ = ["explanation_ledger", "pool_parts"]


def explanation_ledger(f: OomFacts, judged: Sequence[Holder]) -> Ledger | None:
    """The failure's split of allocated bytes: every holder on the GPU (the session's, the
    running backward's, the failed call's), the failing cell's own working set beyond them
    (at the failure), and each private pool's tensors."""
    if f.allocated_bytes is None:
        return None
    device = f"cuda:{f.device}"
    computation = 0
    if f.measured_at == "failure":
        computation = cell_working_set_bytes(f, judged) or 0
        # What the running backward's inputs hold is listed among the holders already.
    elif not f.previous_error:
        # Explained after the fact: what was allocated at the failure and is free now was
        # freed by the failing computation as its frames unwound (its temporaries), or by a
        # collection measured while the error was handled (garbage); no other code ran in
        # between, and no earlier traceback was replaced that could have held it. The failed
        # call's locals are among the holders already (kind "failed call").
        computation = max((f.released_since_bytes or 0) - (f.collected_bytes or 0), 0)
    on_gpu = [h for h in judged if h.device.startswith("cuda")]
    parts = pool_parts(f.pools, on_gpu)
    if f.collected_bytes and (f.measured_at == "failure" or not f.previous_error):
        # Allocated at the failure, gone before anything looked: what a collection freed.
        parts = (*parts, ("reference cycles that a collection freed after the failure "
                          "(garbage)", f.collected_bytes))
    led = ledger(device, f.allocated_bytes, on_gpu, computation_bytes=computation,
                 pools=parts, workspaces_bytes=f.workspaces_bytes)
    return with_raw_blocks(led, f.raw_blocks) if f.raw_blocks else led


def pool_parts(pools: Iterable[PoolUse], holders: Sequence[Holder]) -> tuple[tuple[str, int], ...]:
    """Each pool's part of the ledger: its allocated bytes less what the holders keep in it.
    A pool's tensors that a holder keeps (a CUDA graph's static outputs, kept in a variable)
    are that holder's: counted under both, the parts added up to more than was allocated."""
    return tuple((f"the pool of {pool_owner_text(p)}",
                  max(p.allocated_bytes - sum(n for h in holders for a, n in h.storages
                                              if p.holds(a)), 0))
                 for p in pools)
