"""Each holder's autograd graph sized (``graph.py``: its saved tensors, never unpacked), once
every holder has taken its own tensors, and the holders whose graphs save another holder's
tensors noted as one more reference to them."""

from __future__ import annotations

from typing import Any

from ..graph import GraphSize, GraphWalker
from .facts import TensorFacts
from .peek import is_a
from .reading import type_name
from .tally import HolderTally, Tally

__all__ = ["graph_walker", "size_graphs"]

# Nodes kept on their own are sized one at a time up to this many per holder (each with its
# own path); the rest together.
_NODES_APART = 64


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
            if f.nodes:
                _size_nodes(f, walker, tally, walked_by)
                continue
            if not f.roots:
                continue
            size = walker.size(f.roots)
            walked_by[size.walk] = f.name
            _note_shared(size, f.name, tally, walked_by)
            if size.capped and not size.nodes:
                continue  # the time for graphs ran out before this one: not walked
            # Added to, not set: the graphs of nodes this holder keeps on their own may have
            # been sized into it already (``_size_nodes``).
            f.graph_nodes = (f.graph_nodes or 0) + size.nodes
            f.graph_capped = f.graph_capped or size.capped
            f.graph_unsized += size.hooked + size.unknown
            f.graph_bytes = (f.graph_bytes or 0) + size.bytes_by_device.get(f.device, 0)
            for device, nbytes in size.bytes_by_device.items():
                if device == f.device:
                    continue
                # A graph can save tensors on another device (a CPU copy): those bytes
                # are the same holder's there.
                other = tally.on_device(f.name, f.kind, device)
                other.graph_bytes = (other.graph_bytes or 0) + nbytes
                other.graph_capped = other.graph_capped or size.capped
            f.roots.clear()
    finally:
        for slot in [k for k, f in found.items() if not f.device]:
            waiting = found.pop(slot)  # nodes of no device yet: sized above, or not at all
            waiting.nodes.clear()
            tally.by_name[waiting.name].remove(waiting)
        for f in found.values():
            f.roots.clear()  # no graph outlives the scan


def _size_nodes(waiting: HolderTally, walker: GraphWalker, tally: Tally,
                walked_by: dict[int, str]) -> None:
    """The graphs of the autograd nodes one holder keeps on their own, the first
    ``_NODES_APART`` one at a time, so that each node's path gets what its graph keeps, and
    the rest in one walk under the path they share (a list of 100,000 ``grad_fn``s cost 75 ms
    more one at a time). The bytes go to the holder's tally on each device the graphs saved
    tensors on (made for it where the holder had none). A node the time for graphs ran out
    before is not silent: the holder's graph is then said at least (``≥``)."""
    name = waiting.name
    nodes = waiting.nodes
    groups: list[tuple[list[Any], tuple[str, ...]]] = [([n], p) for n, p in nodes[:_NODES_APART]]
    rest = nodes[_NODES_APART:]
    if rest:
        groups.append(([n for n, _ in rest], _common_prefix([p for _, p in rest])))
    cut = False
    made: list[HolderTally] = []
    for group, path in groups:
        size = walker.size(group)
        walked_by.setdefault(size.walk, name)
        _note_shared(size, name, tally, walked_by)
        cut = cut or size.capped
        if size.capped and not size.nodes:
            continue  # the time for graphs ran out before this one: not walked
        for device, nbytes in size.bytes_by_device.items():
            f = tally.on_device(name, waiting.kind, device)
            if not f.classes:  # made here: the walk's classes and cut are the holder's
                f.classes.update(waiting.classes)
                f.walk_capped = f.walk_capped or waiting.walk_capped
            if f not in made:
                made.append(f)
            f.graph_bytes = (f.graph_bytes or 0) + nbytes
            f.graph_nodes = (f.graph_nodes or 0) + size.nodes
            f.graph_capped = f.graph_capped or size.capped
            f.graph_unsized += size.hooked + size.unknown
            f.node_count += len(group)
            f.node_bytes += nbytes
            f.first_node = f.first_node or type_name(type(group[0]))
            for k in range(1, len(path) + 1):
                f.paths[path[:k]] = f.paths.get(path[:k], 0) + nbytes
        group.clear()
    if cut:
        for f in made:
            f.graph_capped = True
    waiting.nodes.clear()


def _note_shared(size: GraphSize, name: str, tally: Tally, walked_by: dict[int, str]) -> None:
    """What a graph walk for holder ``name`` met that another holder counted first makes
    ``name`` one more reference to that holder's bytes: nodes an earlier walk counted (two
    outputs of one forward), and saved tensors a holder owns (`del x` frees nothing while
    this graph saves x)."""
    owners = [walked_by.get(w) for w in size.shared_walks]
    owners += [tally.seen_by.get(key) for key in size.shared]
    for owner in owners:
        if owner is not None and owner != name:
            tally.also.setdefault(owner, {})[name] = None


def _common_prefix(paths: list[tuple[str, ...]]) -> tuple[str, ...]:
    """The steps every path starts with."""
    out: list[str] = []
    for steps in zip(*paths, strict=False):
        if any(s != steps[0] for s in steps):
            break
        out.append(steps[0])
    return tuple(out)
