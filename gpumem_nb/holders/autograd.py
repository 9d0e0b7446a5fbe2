"""Each holder's autograd graph sized (``graph.py``: its saved tensors, never unpacked), once
every holder has taken its own tensors, and the holders whose graphs save another holder's
tensors noted as one more reference to them."""

from __future__ import annotations

from ..graph import GraphWalker
from .facts import TensorFacts
from .peek import is_a
from .tally import HolderTally, Tally

__all__ = ["graph_walker", "size_graphs"]


def graph_walker(tally: Tally, facts: TensorFacts, budget_s: float) -> GraphWalker:
    """A walker of the holders' graphs within ``budget_s``: a storage the tally counted is a
    holder's own, and a parameter is the model's, not the graph's."""
    return GraphWalker(facts.info, tally.seen,
                       exclude=lambda t: is_a(t, facts.param_type), budget_s=budget_s)


def size_graphs(tally: Tally, walker: GraphWalker) -> None:
    """Every holder's graphs, in attribution order, once all holders have taken their own
    tensors: a saved tensor a variable or a module also holds is theirs, not the graph's."""
    found = tally.found
    walked_by: dict[int, str] = {}  # a walk's number -> the holder it sized
    try:
        for f in list(found.values()):
            if not f.roots:
                continue
            size = walker.size(f.roots)
            walked_by[size.walk] = f.name
            for w in size.shared_walks:
                # This graph reaches nodes an earlier holder's graph counted (two outputs
                # of one forward): that holder's `del` alone frees none of them.
                owner = walked_by.get(w)
                if owner is not None and owner != f.name:
                    tally.also.setdefault(owner, {})[f.name] = None
            if size.capped and not size.nodes:
                continue  # the time for graphs ran out before this one: not walked
            f.graph_nodes = size.nodes
            f.graph_capped = size.capped
            f.graph_unsized = size.hooked + size.unknown
            f.graph_bytes = size.bytes_by_device.get(f.device, 0)
            for key in size.shared:
                # `del x` frees nothing while this graph saves x: f is one more
                # reference to x's bytes.
                owner = tally.seen_by.get(key)
                if owner is not None and owner != f.name:
                    tally.also.setdefault(owner, {})[f.name] = None
            for device, nbytes in size.bytes_by_device.items():
                if device == f.device:
                    continue
                # A graph can save tensors on another device (a CPU copy): those bytes
                # are the same holder's there.
                other = found.setdefault(f"{f.name}\0{device}",
                                         HolderTally(name=f.name, kind=f.kind, device=device))
                other.graph_bytes = (other.graph_bytes or 0) + nbytes
                other.graph_capped = other.graph_capped or size.capped
            f.roots.clear()
    finally:
        for f in found.values():
            f.roots.clear()  # no graph outlives the scan
