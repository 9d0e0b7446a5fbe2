"""Conservation: the bytes PyTorch has allocated on one GPU, split into who holds them.

One split for ``%gpumem who``, ``%gpumem cleanup --dry-run`` and the OOM explainer, read
from the same holder scan (``holders.Scanner``, which gives each storage to one holder):

- the named holders' own tensors;
- what their autograd graphs keep (saved tensors nothing listed holds);
- the failing computation (at an OOM: what the failing cell allocated and no holder keeps);
- the tensors in each memory pool other than the default (CUDA graphs, MemPool);
- cuBLAS's workspaces, which ATen caches per (handle, stream) in the caching allocator
  (``workspace_blocks_bytes``): found in the allocator's snapshot, never by a size alone;
- "not found": the rest. A lower bound on nothing: where a walk was cut, the holders' figures
  are lower bounds and "not found" may be theirs, which is said, and it is never a cause.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .model import UNSEEN_NAME, Holder
from .units import format_bytes

__all__ = [
    "SHOW_NOT_FOUND_SHARE",
    "Ledger",
    "PoolParts",
    "cublas_workspace_sizes",
    "ledger",
    "ledgers_of",
    "on_device",
    "workspace_blocks_bytes",
]

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
    workspaces_bytes: int = 0  # cuBLAS / cuBLASLt workspaces (workspace_blocks_bytes)
    # Holders' numpy/CuPy-like arrays on a GPU: real GPU memory, but not PyTorch's allocator's,
    # so never a part of allocated_bytes (a 60 GiB CuPy array was said to be 60 GiB "of
    # 65 MiB allocated"). Said beside the split.
    arrays_bytes: int = 0
    # Live tensors only something Python cannot see refers to (a C extension's object, a
    # running frame): found, but with no name a user can act on.
    invisible_bytes: int = 0
    # The largest of those, by the object something unseen holds and the path down from it.
    invisible_name: str = ""
    # Allocated blocks no tensor lies over whose addresses a module or a variable keeps as
    # ints (raw allocations: ``rawpart.py``): named, out of "not found".
    raw_bytes: int = 0
    raw_text: str = ""
    # Of "not found": blocks no tensor the search found lies over, no pointer to them found.
    uncovered_bytes: int = 0
    uncovered_text: str = ""

    @property
    def pools_bytes(self) -> int:
        return sum(n for _, n in self.pools)

    @property
    def attributed_bytes(self) -> int:
        return min(self.holders_bytes + self.graphs_bytes + self.computation_bytes
                   + self.pools_bytes + self.workspaces_bytes + self.invisible_bytes
                   + self.raw_bytes,
                   self.allocated_bytes)

    @property
    def named_bytes(self) -> int:
        """What has a name: a path from a root, a graph's holder, the computation, a pool's
        owner, cuBLAS's workspaces; not what only something unseen keeps."""
        return max(self.attributed_bytes - self.invisible_bytes, 0)

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
        if self.invisible_bytes:
            what = f": {self.invisible_name}" if self.invisible_name else \
                " (a C extension, a running frame)"
            parts.append(f"{format_bytes(self.invisible_bytes)} referenced only from where "
                         f"Python cannot see{what}")
        if self.workspaces_bytes:
            parts.append(f"{format_bytes(self.workspaces_bytes)} cuBLAS workspaces "
                         "(torch._C._cuda_clearCublasWorkspaces() frees them until the next "
                         "matmul)")
        if self.raw_bytes:
            parts.append(f"{format_bytes(self.raw_bytes)} in {self.raw_text}")
        text = (f"Of {format_bytes(self.allocated_bytes)} allocated on {self.device}: "
                + ", ".join(parts))
        if self.shows_not_found:
            share = self.not_found_bytes / self.allocated_bytes
            text += (f"; not found: {format_bytes(self.not_found_bytes)} ({share:.0%})"
                     + (", which the cut walk may not have reached" if self.capped else
                        ": `%gpumem who --gc` also searches every object the garbage "
                        "collector tracks"))
            if self.uncovered_bytes:
                text += (f"; of it, {format_bytes(self.uncovered_bytes)} in "
                         f"{self.uncovered_text}")
        if self.arrays_bytes:
            text += (f"; besides, {format_bytes(self.arrays_bytes)} in the holders' arrays on a "
                     "GPU (CuPy-like), outside PyTorch's allocator")
        return text + "."


def on_device(h: Holder, device: str) -> bool:
    return h.device == device or (device.endswith(":0") and h.device == "cuda")


def ledger(device: str, allocated_bytes: int, holders: Iterable[Holder], *,
           computation_bytes: int = 0, pools: Sequence[tuple[str, int]] = (),
           workspaces_bytes: int = 0) -> Ledger:
    """The split of ``allocated_bytes`` on ``device`` among these holders (each storage is in
    one holder already: the scan attributes it once)."""
    own = graphs = arrays = invisible = 0
    capped = False
    unseen: list[Holder] = []
    for h in holders:
        if not on_device(h, device):
            continue
        if h.arrays:  # another library's memory: not in allocated_bytes
            arrays += h.nbytes
            continue
        if h.kind == "unseen":
            invisible += h.nbytes
            unseen.append(h)
            continue
        if h.kind == "not searched":  # left in "not found", which then says it was cut
            capped = True
            continue
        own += h.nbytes
        graphs += h.graph_bytes or 0
        capped = capped or h.walk_capped or h.graph_bytes_capped or bool(h.graph_unsized) \
            or (h.holds_graph and h.graph_bytes is None)
    # Workspaces claim only what nothing else accounts for: a block of a workspace's size
    # that a holder's tensor owns is counted once, as the holder's.
    rest = allocated_bytes - own - graphs - computation_bytes - sum(n for _, n in pools) \
        - invisible
    return Ledger(device=device, allocated_bytes=allocated_bytes, holders_bytes=own,
                  graphs_bytes=graphs, computation_bytes=computation_bytes,
                  pools=tuple(pools), capped=capped,
                  workspaces_bytes=max(min(workspaces_bytes, rest), 0), arrays_bytes=arrays,
                  invisible_bytes=invisible,
                  invisible_name=_unseen_name(unseen))


_UNSEEN_SUFFIX = f", {UNSEEN_NAME}"


def _unseen_name(unseen: Sequence[Holder]) -> str:
    """The largest unseen holder's path, where the search could name the object held."""
    named = [h for h in unseen if h.name.endswith(_UNSEEN_SUFFIX)]
    if not named:
        return ""
    top = max(named, key=lambda h: h.nbytes)
    more = f" and {len(unseen) - 1} more group{'s' if len(unseen) > 2 else ''}" \
        if len(unseen) > 1 else ""
    return top.name.removesuffix(_UNSEEN_SUFFIX) + more


# Each GPU's memory pools other than the default, as the ledger's (label, bytes) parts.
PoolParts = Callable[[Sequence[Holder]], Mapping[int, Sequence[tuple[str, int]]]]


def ledgers_of(sample: Any, holders: Sequence[Holder],
               segments: Sequence[Mapping[str, Any]] | None = None,
               pools: PoolParts | None = None) -> tuple[Ledger, ...]:
    """One ledger per GPU of a reading (``model.Sample``) with allocator figures; with the
    allocator's segments (``TorchSource.segments_snapshot``), cuBLAS's workspaces too, and
    each GPU's private pools where ``pools`` reads them (the OOM explainer's own reading:
    `who`, `cleanup --dry-run` and the explanation split the same bytes the same way)."""
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
        try:
            ws = workspace_blocks_bytes(segments or (), int(d.index))
        except (TypeError, ValueError, AttributeError):  # segments of another shape
            ws = 0
        out.append(ledger(f"cuda:{d.index}", int(al.allocated_bytes), holders,
                          pools=parts.get(d.index, ()), workspaces_bytes=ws))
    return tuple(out)


# PyTorch's sizes (aten/src/ATen/cuda/CublasHandlePool.cpp): cuBLAS's workspace is
# CUBLAS_WORKSPACE_CONFIG's ":SIZE_KiB:COUNT" pairs summed (size x count), else 32 MiB on
# compute capability 9, 10 and 12 (Hopper, Blackwell) and 4096 KiB x 2 + 16 KiB x 8 elsewhere;
# cuBLASLt's is CUBLASLT_WORKSPACE_SIZE KiB, else 1 MiB, at most cuBLAS's. Newer sources share
# cuBLAS's workspace with cuBLASLt by default (TORCH_CUBLASLT_UNIFIED_WORKSPACE): then there is
# no separate cuBLASLt block, which a count of 0 of them covers. Each is allocated from the
# caching allocator, once per (handle, stream), and kept until
# torch._C._cuda_clearCublasWorkspaces().
_CUBLAS_DEFAULTS_BYTES = (4096 * 8 * 1024, 4096 * 1024 * 2 + 16 * 1024 * 8)
_CUBLASLT_DEFAULT_BYTES = 1024 * 1024


def cublas_workspace_sizes(env: Mapping[str, str] | None = None) -> frozenset[int]:
    """The sizes a cuBLAS or cuBLASLt workspace block can have in this process."""
    cublas, lt = _workspace_sizes(os.environ if env is None else env)
    return frozenset([*cublas, *(min(lt, c) for c in cublas)])


def _workspace_sizes(env: Mapping[str, str]) -> tuple[tuple[int, ...], int]:
    """(cuBLAS's possible sizes, cuBLASLt's size) from the environment, as ATen reads it."""
    cublas: tuple[int, ...] = _CUBLAS_DEFAULTS_BYTES
    config = env.get("CUBLAS_WORKSPACE_CONFIG")
    if config:
        pairs = re.findall(r":([0-9]+):([0-9]+)", config)
        if pairs:
            cublas = (sum(int(a) * 1024 * int(b) for a, b in pairs),)
    lt = _CUBLASLT_DEFAULT_BYTES
    with_lt = env.get("CUBLASLT_WORKSPACE_SIZE")
    if with_lt:
        with contextlib.suppress(ValueError):
            lt = int(with_lt) * 1024
    return cublas, lt


# Workspaces ATen keeps at once: one per (handle, stream), a few streams at most; and what
# else a remainder of workspaces may hold (a few small tensors no holder names).
_WORKSPACES_MAX = 8
_WORKSPACE_SLACK_BYTES = 64 * 1024


def workspaces_in_remainder(remainder_bytes: int, env: Mapping[str, str] | None = None) -> int:
    """Under cudaMallocAsync, whose snapshot has no blocks: the part of the allocated bytes no
    holder accounts for that is cuBLAS / cuBLASLt workspaces, where that remainder is some
    number of one cuBLAS workspace size and of cuBLASLt's (``cublas_workspace_sizes``) to
    within ``_WORKSPACE_SLACK_BYTES`` (a few small tensors); 0 where it is not (then something
    else holds it, and it stays "not found"). One cuBLAS size at a time: a card has one."""
    if remainder_bytes <= 0:
        return 0
    cublas, lt = _workspace_sizes(os.environ if env is None else env)
    best = 0
    for size in cublas:
        for n in range(1, _WORKSPACES_MAX + 1):
            for m in range(_WORKSPACES_MAX + 1):
                total = n * size + m * min(lt, size)
                if 0 <= remainder_bytes - total < _WORKSPACE_SLACK_BYTES and total > best:
                    best = total
    return best


def workspace_blocks_bytes(segments: Iterable[Mapping[str, Any]], device: int,
                           sizes: frozenset[int] | None = None) -> int:
    """The bytes of the allocator's live blocks that are cuBLAS workspaces, from a snapshot's
    segments: blocks in the default pool whose requested size is exactly a workspace's
    (``cublas_workspace_sizes``) and, where history was recorded, allocated with no Python
    frame (ATen allocates them from C++, inside the first matmul on a stream). The ledger
    counts them only within what no holder accounts for."""
    sizes = cublas_workspace_sizes() if sizes is None else sizes
    total = 0
    for seg in segments:
        if seg.get("device", device) != device or \
                tuple(seg.get("segment_pool_id", (0, 0)) or (0, 0)) != (0, 0):
            continue
        for b in seg.get("blocks", ()) or ():
            if b.get("state") != "active_allocated":
                continue
            requested = b.get("requested_size", b.get("size"))
            if requested not in sizes:
                continue
            frames = b.get("frames") or ()
            if any(str(fr.get("filename", "")).endswith(".py") for fr in frames
                   if isinstance(fr, Mapping)):
                continue  # allocated from Python: a tensor of that size, not a workspace
            total += int(b.get("size", requested) or 0)
    return total
