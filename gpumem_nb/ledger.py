"""Conservation: the bytes PyTorch has allocated on one GPU, split into who holds them.

One split for ``%gpumem who``, ``%gpumem cleanup --dry-run`` and the OOM explainer, read
from the same holder scan (``holders.Scanner``, which gives each storage to one holder):

- the named holders' own tensors;
- what their autograd graphs keep (saved tensors nothing listed holds);
- the failing computation (at an OOM: what the failing cell allocated and no holder keeps);
- the tensors in each memory pool other than the default (CUDA graphs, MemPool);
- "not found": the rest. A lower bound on nothing: where a walk was cut, the holders' figures
  are lower bounds and "not found" may be theirs, which is said, and it is never a cause.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .model import Holder
from .units import format_bytes

# "not found" is shown when it is more than this share of what is allocated.
SHOW_NOT_FOUND_SHARE = 0.01


@dataclass(frozen=True)
class Ledger:
    device: str  # "cuda:0"
    allocated_bytes: int
    holders_bytes: int  # the holders' own tensors
    graphs_bytes: int  # what their autograd graphs keep
    computation_bytes: int = 0
    pools: tuple[tuple[str, int], ...] = ()  # (label, allocated bytes in it)
    capped: bool = False  # a walk was cut: holder figures are lower bounds

    @property
    def pools_bytes(self) -> int:
        return sum(n for _, n in self.pools)

    @property
    def attributed_bytes(self) -> int:
        return min(self.holders_bytes + self.graphs_bytes + self.computation_bytes
                   + self.pools_bytes, self.allocated_bytes)

    @property
    def not_found_bytes(self) -> int:
        return max(self.allocated_bytes - self.attributed_bytes, 0)

    @property
    def shows_not_found(self) -> bool:
        return self.not_found_bytes > SHOW_NOT_FOUND_SHARE * self.allocated_bytes

    def line(self) -> str:
        at_least = "≥" if self.capped else ""
        parts = [f"{at_least}{format_bytes(self.holders_bytes)} the holders' own tensors"]
        if self.graphs_bytes:
            parts.append(f"{at_least}{format_bytes(self.graphs_bytes)} their autograd graphs")
        if self.computation_bytes:
            parts.append(f"{format_bytes(self.computation_bytes)} the failing computation")
        parts += [f"{format_bytes(n)} in {label}" for label, n in self.pools if n]
        text = (f"Of {format_bytes(self.allocated_bytes)} allocated on {self.device}: "
                + ", ".join(parts))
        if self.shows_not_found:
            share = self.not_found_bytes / self.allocated_bytes
            text += (f"; not found: {format_bytes(self.not_found_bytes)} ({share:.0%})"
                     + (", which the cut walk may not have reached" if self.capped else
                        ": `%gpumem who --gc` also searches every object the garbage "
                        "collector tracks"))
        return text + "."


def on_device(h: Holder, device: str) -> bool:
    return h.device == device or (device.endswith(":0") and h.device == "cuda")


def ledger(device: str, allocated_bytes: int, holders: Iterable[Holder], *,
           computation_bytes: int = 0, pools: Sequence[tuple[str, int]] = ()) -> Ledger:
    """The split of ``allocated_bytes`` on ``device`` among these holders (each storage is in
    one holder already: the scan attributes it once)."""
    own = graphs = 0
    capped = False
    for h in holders:
        if not on_device(h, device):
            continue
        own += h.nbytes
        graphs += h.graph_bytes or 0
        capped = capped or h.walk_capped or h.graph_bytes_capped or bool(h.graph_unsized) \
            or (h.holds_graph and h.graph_bytes is None)
    return Ledger(device=device, allocated_bytes=allocated_bytes, holders_bytes=own,
                  graphs_bytes=graphs, computation_bytes=computation_bytes,
                  pools=tuple(pools), capped=capped)


# Each GPU's memory pools other than the default, as the ledger's (label, bytes) parts.
PoolParts = Callable[[Sequence[Holder]], Mapping[int, Sequence[tuple[str, int]]]]


def ledgers_of(sample: Any, holders: Sequence[Holder],
               pools: PoolParts | None = None) -> tuple[Ledger, ...]:
    """One ledger per GPU of a reading (``model.Sample``) with allocator figures, with each
    GPU's private pools where ``pools`` reads them (the OOM explainer's own reading: `who`,
    `cleanup --dry-run` and the explanation split the same bytes the same way)."""
    parts: Mapping[int, Sequence[tuple[str, int]]] = {}
    if pools is not None:
        try:
            parts = pools(holders)
        except Exception:
            parts = {}
    out = []
    for d in getattr(sample, "devices", ()) or ():
        al = getattr(d, "allocator", None)
        if al is None or al.allocated_bytes is None:
            continue
        out.append(ledger(f"cuda:{d.index}", int(al.allocated_bytes), holders,
                          pools=parts.get(d.index, ())))
    return tuple(out)
