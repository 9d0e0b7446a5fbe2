"""The scan's tally: each storage counted once, under the first holder that reached it, in
attribution order (a user variable, then the output cache, then the stored traceback, then
what only the retention search found), and each holder's tally made into a ``Holder``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..model import Holder
from .facts import TensorFacts, TensorInfo
from .peek import top_module

__all__ = ["HolderTally", "Tally", "cuda_bytes", "holder_of", "path_of"]

# A holder's path goes down to the object inside it that keeps this share of its bytes.
_PATH_SHARE = 0.9


@dataclass
class HolderTally:
    name: str
    kind: str
    device: str
    nbytes: int = 0
    tensors: int = 0
    first: str = ""
    graph: str = ""  # the first tensor with grad_fn, described
    graph_nodes: int | None = None
    graph_capped: bool = False
    graph_bytes: int | None = None
    graph_unsized: int = 0
    roots: list[Any] = field(default_factory=list)  # the grad_fns of its tensors
    root_ids: set[int] = field(default_factory=set)
    # Autograd nodes the walk reached on their own (not as a tensor's grad_fn), with their
    # paths: their graphs are sized one by one, so that each path gets its bytes.
    nodes: list[tuple[Any, tuple[str, ...]]] = field(default_factory=list)
    node_count: int = 0  # such nodes whose graphs keep bytes on this device
    first_node: str = ""  # the first one's class
    node_bytes: int = 0  # what their graphs keep here (within graph_bytes)
    details: list[str] = field(default_factory=list)
    # bytes under each path prefix (a tuple of steps), to name where inside the bytes are
    paths: dict[tuple[str, ...], int] = field(default_factory=dict)
    classes: dict[tuple[str, ...], str] = field(default_factory=dict)
    walk_capped: bool = False
    arrays: bool = False
    torch_tensors: bool = False
    storages: list[tuple[int, int]] = field(default_factory=list)  # (address, bytes) on GPUs
    grad_bytes: int = 0  # of nbytes, parameters' gradients (zero_grad frees them)
    view_bytes: int | None = None  # a lone tensor's own elements, where it views a larger storage
    array_module: str = ""  # the top-level module of its arrays' class


class Tally:
    """One scan's holders, keyed by name and device, and who counted each storage first."""

    def __init__(self, facts: TensorFacts) -> None:
        self.facts = facts
        self.found: dict[str, HolderTally] = {}
        self.seen: set[tuple[str, int]] = set()  # storage keys counted
        self.seen_by: dict[tuple[str, int], str] = {}  # and the holder that counted each
        # Holder -> the other holders that also reach its bytes: `del` it alone frees nothing.
        self.also: dict[str, dict[str, None]] = {}
        self.by_name: dict[str, list[HolderTally]] = {}
        # id(node) -> the holder that took an autograd node kept on its own: a second holder
        # reaching the same node is one more reference to what its graph saved.
        self.node_owner: dict[int, str] = {}

    def note_also(self, owner: str | None, name: str) -> None:
        """Holder ``name`` also reaches what ``owner`` holds."""
        if owner is not None and owner != name:
            self.also.setdefault(owner, {})[name] = None

    def add(self, name: str, kind: str, t: object, path: tuple[str, ...], info: TensorInfo,
            grad: bool) -> None:
        """One tensor the walk of holder ``name`` reached at ``path``; ``grad``: a gradient."""
        device, nbytes, key = info
        if key in self.seen:
            self.note_also(self.seen_by.get(key), name)
            return
        self.seen.add(key)
        self.seen_by[key] = name
        f = self.on_device(name, kind, device)
        f.nbytes += nbytes
        f.tensors += 1
        if grad:
            f.grad_bytes += nbytes
        facts = self.facts
        if f.tensors == 1 and not path:
            own = facts.own_bytes(t)
            f.view_bytes = own if own is not None and own < nbytes else None
        else:
            f.view_bytes = None
        if facts.is_torch(t):
            f.torch_tensors = True
            if device.startswith("cuda"):
                f.storages.append((key[1], nbytes))
        else:
            f.arrays = True
            if not f.array_module:
                f.array_module = top_module(type(t))
        for k in range(1, len(path) + 1):
            prefix = path[:k]
            f.paths[prefix] = f.paths.get(prefix, 0) + nbytes
        grad_fn = facts.grad_fn(t)
        if f.tensors == 1:
            f.first = facts.describe(t, grad_fn)
        if grad_fn is not None:
            if not f.graph:
                f.graph = f.first if f.tensors == 1 else facts.describe(t, grad_fn)
            if id(grad_fn) not in f.root_ids:
                f.root_ids.add(id(grad_fn))
                f.roots.append(grad_fn)

    def on_device(self, name: str, kind: str, device: str) -> HolderTally:
        """Holder ``name``'s tally on ``device``, made (empty) where it has none yet."""
        slot = f"{name}\0{device}"
        f = self.found.get(slot)
        if f is None:
            f = self.found[slot] = HolderTally(name=name, kind=kind, device=device)
            self.by_name.setdefault(name, []).append(f)
        return f

    def add_node(self, name: str, kind: str, node: object, path: tuple[str, ...]) -> None:
        """An autograd node the walk of holder ``name`` reached on its own at ``path``. Its
        graph's device is known only once it is sized (``autograd.py``), so it waits in a
        holder of no device until then."""
        f = self.on_device(name, kind, "")
        if id(node) not in f.root_ids:
            f.root_ids.add(id(node))
            f.nodes.append((node, path))
            self.node_owner.setdefault(id(node), name)

    def close(self, name: str, classes: dict[tuple[str, ...], str], cut: bool) -> None:
        """Holder ``name``'s walk is done: the classes along its paths, and whether a bound cut
        it. This name's holders only: a pass over every holder per holder made a namespace of
        1,000 tensors spend a third of its scan here."""
        for f in self.by_name.get(name, ()):
            if f.name == name:
                f.classes.update(classes)
                if cut:
                    f.walk_capped = True

    def gpu_bytes(self) -> int:
        """What the walk found on GPUs in PyTorch's allocator: tensors and their graphs."""
        return sum(f.nbytes + (f.graph_bytes or 0) for f in self.found.values()
                   if f.device.startswith("cuda") and not f.arrays)


def path_of(f: HolderTally) -> str:
    """Down from the holder's name while one step keeps nearly all of its bytes, to the
    object that holds them, with that object's class."""
    total = f.nbytes + f.node_bytes
    if not f.paths or not total:
        return ""
    here: tuple[str, ...] = ()
    while True:
        best = max((p for p in f.paths if len(p) == len(here) + 1 and p[:len(here)] == here),
                   key=lambda p: f.paths[p], default=None)
        if best is None or f.paths[best] < _PATH_SHARE * total:
            break
        here = best
    if not here:
        return ""
    # The deepest object along the way whose class is known names what holds the bytes.
    text = "".join(here).lstrip(".")
    for k in range(len(here), 0, -1):
        cls = f.classes.get(here[:k])
        if cls is not None:
            text = "".join(here[:k]).lstrip(".") + f" ({cls})"
            break
    return text


def holder_of(f: HolderTally) -> Holder:
    """The scan's record of one holder. What its graph keeps is in the ``graph_*`` fields
    (``analysis.held_text`` says it), not in ``detail``."""
    what = "arrays" if f.arrays and not f.torch_tensors else "tensors"
    if f.tensors == 1:
        detail = f.first
    elif f.tensors:
        detail = f"{f.tensors} {what}" + (f"; one has {f.graph.split(', ', 1)[-1]}"
                                          if f.graph else "")
    elif f.node_count:
        detail = (f"{f.node_count} autograd nodes ({f.first_node}, ...): the tensors their "
                  "graphs saved" if f.node_count > 1 else
                  f"an autograd node ({f.first_node}): the tensors its graph saved")
    else:
        detail = "tensors its autograd graph saved on this device"
    return Holder(name=f.name, kind=f.kind, device=f.device, nbytes=f.nbytes, detail=detail,
                  holds_graph=bool(f.graph) or f.graph_bytes is not None,
                  graph_nodes=f.graph_nodes, graph_nodes_capped=f.graph_capped,
                  graph_bytes=f.graph_bytes, graph_bytes_capped=f.graph_capped,
                  graph_unsized=f.graph_unsized, path=path_of(f), walk_capped=f.walk_capped,
                  arrays=f.arrays and not f.torch_tensors, storages=tuple(f.storages),
                  grad_bytes=f.grad_bytes, view_bytes=f.view_bytes,
                  array_module=f.array_module, nodes=f.node_count,
                  contents_bytes=(sum(n for p, n in f.paths.items() if len(p) == 1)
                                  if f.kind == "module" else 0))


def cuda_bytes(holders: Iterable[Holder]) -> int:
    """What these holders keep on GPUs, their autograd graphs' saved tensors included."""
    return sum(h.held_bytes for h in holders if h.device.startswith("cuda"))
