"""The facts at the failure: the numbers a verdict rests on (``OomFacts``), read by the
observer at the failure or from the message and readings after it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..holders.rawblocks import RawBlock
from ..model import (
    ChildProcess,
)

__all__ = ["POOL_GRAPH", "POOL_USER", "OomFacts", "PoolUse", "ProcessUse"]


@dataclass(frozen=True)
class ProcessUse:
    pid: int
    nbytes: int | None
    what: str = ""  # "a Jupyter kernel", "python train.py"
    child: ChildProcess | None = None  # set when the process descends from this kernel

    @property
    def label(self) -> str:
        if self.child is not None:
            pid, _, what = self.child.label.partition(", ")
            return f"{pid} (this kernel's {what})"
        return f"PID {self.pid}" + (f" ({self.what})" if self.what else "")


POOL_GRAPH = "CUDA graph"
POOL_USER = "torch.cuda.MemPool"


@dataclass(frozen=True)
class PoolUse:
    """A memory pool other than the default, from the snapshot's ``segment_pool_id``: CUDA
    graphs (``torch.cuda.graph``, and ``torch.compile(mode="reduce-overhead")``'s graph trees)
    get ids ``(n, 0)`` from ``graph_pool_handle``, a user's ``torch.cuda.MemPool`` ``(0, n)``.
    Its free blocks serve only that pool's allocations, and ``empty_cache`` cannot release
    them while the pool's owner lives."""

    pool_id: tuple[int, int]
    kind: str  # POOL_GRAPH or POOL_USER
    reserved_bytes: int
    allocated_bytes: int
    owner: str = ""  # the variable that keeps it, where one was found
    graph_trees: bool = False  # torch.compile's CUDA graph trees are loaded
    # Its segments' (address, bytes): a holder's tensors inside are counted as the holder's.
    ranges: tuple[tuple[int, int], ...] = field(default=(), compare=False, repr=False)

    def holds(self, address: int) -> bool:
        return any(start <= address < start + size for start, size in self.ranges)

    @property
    def free_bytes(self) -> int:
        return max(self.reserved_bytes - self.allocated_bytes, 0)


@dataclass(frozen=True)
class OomFacts:
    """The numbers a verdict rests on. ``measured_at`` says when they were read: "failure"
    (the allocator's observer, every tensor still alive) or "after" (the error message plus
    readings taken when the cell ended)."""

    device: int
    requested_bytes: int | None
    total_bytes: int | None
    free_bytes: int | None
    allowed_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    this_process_bytes: int | None = None  # NVML: everything this process holds
    other_processes: tuple[ProcessUse, ...] = ()
    others_unknown: bool = False  # NVML could not attribute processes (containers, no NVML)
    backend: str = "native"
    expandable_segments: bool = False
    largest_free_block_bytes: int | None = None  # inside PyTorch's segments, at the failure
    # The default pool's segments with nothing allocated in them, at the failure: the native
    # allocator releases these and retries before it fails a default-pool request.
    idle_segments_bytes: int | None = None
    private_pool_bytes: int | None = None
    precision_bytes: int = 0
    measured_at: str = "failure"
    released_since_bytes: int | None = None  # allocated at the failure minus allocated now
    # Reachable from nothing the holder scan walks: garbage in reference cycles, such as a
    # replaced traceback, or objects it cannot enter. Measured "after": allocated now minus
    # what the holders keep. At the "failure": allocated when the failing cell started minus
    # what the holders keep (they include what the cell itself stored, so it is not
    # overstated), and only when every holder's graph was sized in full.
    unreachable_bytes: int | None = None
    previous_error: str = ""  # the cell before this one raised this (its traceback replaced)
    # What Python's garbage collections freed between the failure and the explanation
    # (``gc.callbacks``, PyTorch's allocated bytes before and after each): tensors that only a
    # collection could free were garbage in reference cycles at the failure.
    collected_bytes: int | None = None
    collections: int = 0
    # Cells that raised before this one, since the extension was loaded: a traceback a later
    # error replaced waits for the garbage collector, so only then is garbage plausible.
    earlier_errors: int = 0
    # The failing cell's own working set: PyTorch's allocated bytes at the failure minus at
    # the cell's start (what the cell made and still held), and the same cell's previous
    # run's peak above its own start, when it ran before.
    cell_bytes: int | None = None
    cell_start_bytes: int | None = None  # PyTorch's allocated bytes when the cell started
    cell_previous_peak_bytes: int | None = None
    cell_previous_peak_exact: bool = False
    # Explained after the fact: what this error's own traceback holds (the failed call's
    # locals and their graphs) belongs to the computation, not to the session.
    computation_bytes: int | None = None
    grad_enabled: bool | None = None  # autograd on where the allocation failed
    # NVML's least figure for this process while PyTorch's cache held nothing on this GPU:
    # the CUDA context as measured here (with whatever else the process held then).
    idle_process_bytes: int | None = None
    # Memory pools other than the default (CUDA graphs, MemPool), at the failure.
    pools: tuple[PoolUse, ...] = ()
    # Some holder's object or graph walk was cut by its bounds: what is "not found" may be
    # theirs, so it is never a verdict.
    walk_capped: bool = False
    # Where it failed, from the traceback's frames (site.py).
    site: Any = None
    # cuBLAS workspaces among the allocated bytes, from the allocator's snapshot (ledger.py).
    workspaces_bytes: int = 0
    # Objects ``gc.freeze()`` moved to the permanent generation (``gc.get_freeze_count()``):
    # neither the collector nor the holder search (``gc.get_objects``/``get_referrers``) sees
    # them, so what they hold is "not found" and no ``gc.collect()`` frees it.
    frozen_objects: int = 0
    # Read after the failure where the holders left bytes "not found": the default pool's
    # allocated blocks no tensor lies over, each with where its pointer is kept if anywhere
    # (``rawpart.py``).
    raw_blocks: tuple[RawBlock, ...] = ()

    @property
    def pools_free_bytes(self) -> int:
        return sum(p.free_bytes for p in self.pools)

    @property
    def pool_reuses_unallocated(self) -> bool:
        """Under cudaMallocAsync the driver's pool serves new tensors from the memory it holds
        unused (it remaps pages, so its holes do not fragment), and it keeps what it grew
        while trying a request that failed: on the H200 a failed 107.82 GiB request left the
        pool holding 77.84 GiB unused, every byte that had been free. Those bytes are room the
        request had, not a reason it failed."""
        return self.backend == "cudaMallocAsync"

    @property
    def unallocated_bytes(self) -> int | None:
        """Reserved by PyTorch but not allocated. At a native OOM the allocator has already
        released every unsplit cached block, so this is memory inside segments that still hold
        live tensors: fragmentation."""
        if self.reserved_bytes is None or self.allocated_bytes is None:
            return None
        return max(self.reserved_bytes - self.allocated_bytes - self.pools_free_bytes, 0)

    @property
    def outside_pytorch_bytes(self) -> int | None:
        if self.this_process_bytes is None:
            return None
        return max(self.this_process_bytes - (self.reserved_bytes or 0), 0)

    @property
    def others_bytes(self) -> int:
        return sum(p.nbytes or 0 for p in self.other_processes)

    @property
    def children_bytes(self) -> int:
        """Of ``others_bytes``, what this kernel's own child processes hold."""
        return sum(p.nbytes or 0 for p in self.other_processes if p.child is not None)

    @property
    def headroom_bytes(self) -> int | None:
        """What the allocator could still get: CUDA's free memory (plus, under
        cudaMallocAsync, what its pool holds unused), and under a memory fraction no more
        than the cap minus what PyTorch already holds (reserved natively; the async backend
        checks its cap against allocated bytes)."""
        if self.free_bytes is None:
            return None
        room = self.free_bytes
        used = self.reserved_bytes
        if self.pool_reuses_unallocated:
            room += self.unallocated_bytes or 0
            used = self.allocated_bytes
        if self.allowed_bytes is not None and used is not None:
            return min(room, max(self.allowed_bytes - used, 0))
        return room

    @property
    def larger_than_gpu(self) -> bool:
        """The request is more than the GPU's whole memory: no cleanup or setting fits it."""
        return (self.requested_bytes is not None and self.total_bytes is not None
                and self.requested_bytes > self.total_bytes + self.precision_bytes)

    @property
    def shortfall_bytes(self) -> int | None:
        """How much more free memory the request needed."""
        if self.requested_bytes is None or self.headroom_bytes is None:
            return None
        return max(self.requested_bytes - self.headroom_bytes, 0)
