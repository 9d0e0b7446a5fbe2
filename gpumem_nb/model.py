"""Typed records shared by every layer.

Memory is always an ``int`` number of bytes, times are ``float`` seconds. ``None`` means
"not known" (a field NVML does not support, a process NVML cannot see), never zero: a zero
would be a claim, and the product promises to be honest about what it cannot see.

This module depends on nothing but the standard library, so every other module can use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "CAUSE_CACHE",
    "CAUSE_LIVE_TENSORS",
    "CAUSE_OUTSIDE",
    "ROLE_DATALOADER",
    "ROLE_LAUNCHED",
    "ROLE_MULTIPROCESSING",
    "ROLE_OTHER",
    "STATUS_ERROR",
    "STATUS_LOST",
    "STATUS_NO_NVML",
    "STATUS_OK",
    "AllocatorInfo",
    "AllocatorReading",
    "CellDevice",
    "CellMark",
    "CellRecord",
    "CellStart",
    "ChildProcess",
    "DeviceSample",
    "Holder",
    "NvmlReading",
    "Sample",
    "SourceStatus",
    "Verdict",
]

# Status words a device reading can carry. Plain strings keep the records JSON-friendly.
STATUS_OK = "ok"
STATUS_LOST = "lost"
STATUS_ERROR = "error"
# No NVML at all (a ROCm build, a container without libnvidia-ml, a driver too old), while
# torch's allocator is up: the device is torch's, and NVML's columns are unknown.
STATUS_NO_NVML = "no NVML"

# What a child process of this kernel is, where it can be told (``sources/processes.py``).
ROLE_DATALOADER = "DataLoader worker"
# torch.multiprocessing, torchrun, notebook_launcher, ddp_notebook:
ROLE_LAUNCHED = "launched worker"
ROLE_MULTIPROCESSING = "multiprocessing child"
ROLE_OTHER = "child process"


@dataclass(frozen=True)
class ChildProcess:
    """A process descended from this kernel that holds memory on a GPU (NVML lists it)."""

    pid: int
    nbytes: int | None  # NVML's figure for it on one device; None when NVML cannot say
    role: str = ROLE_OTHER
    cmdline: str = ""
    # From its environment (RANK, LOCAL_RANK, WORLD_SIZE) or its launcher, when known.
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None

    @property
    def label(self) -> str:
        """"PID 4242, launched worker rank 1 of 2": who it is, in a few words."""
        ranks = ""
        if self.rank is not None:
            ranks = f" rank {self.rank}" + (f" of {self.world_size}" if self.world_size else "")
        elif self.local_rank is not None:
            ranks = f" local rank {self.local_rank}"
        return f"PID {self.pid}, {self.role}{ranks}"


@dataclass(frozen=True)
class NvmlReading:
    """One device as NVML sees it, at one instant."""

    nvml_index: int
    name: str
    uuid: str
    pci_bus_id: str
    total_bytes: int | None
    used_bytes: int | None
    # Memory the driver keeps for itself; only the v2 memory call reports it separately.
    driver_reserved_bytes: int | None = None
    # This process's usage: None when NVML cannot attribute it (PID not visible).
    process_bytes: int | None = None
    # Sum of the other processes NVML lists, this kernel's children excepted; None when unknown.
    other_processes_bytes: int | None = None
    status: str = STATUS_OK
    detail: str = ""
    # This kernel's descendants among the processes NVML lists (DataLoader workers, launched
    # DDP workers, an inference engine's processes), and their sum: 0 when NVML lists none,
    # None when it cannot tell (no listing, or another PID namespace).
    children: tuple[ChildProcess, ...] = ()
    children_bytes: int | None = None


@dataclass(frozen=True)
class AllocatorReading:
    """PyTorch's caching allocator for one device, from a single stats read."""

    allocated_bytes: int
    reserved_bytes: int
    active_bytes: int
    inactive_split_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    num_alloc_retries: int
    num_ooms: int
    # Cumulative counts of allocations and frees: equal counts in two readings prove nothing
    # was allocated or freed between them, which lets the hooks reuse an idle reading.
    allocations: int = 0
    frees: int = 0

    def same_state_as(self, other: AllocatorReading | None) -> bool:
        return (other is not None and self.allocations == other.allocations
                and self.frees == other.frees and self.reserved_bytes == other.reserved_bytes
                and self.allocated_bytes == other.allocated_bytes
                and self.peak_allocated_bytes == other.peak_allocated_bytes)


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """Everything known about one CUDA device (numbered as torch numbers it) at one instant."""

    index: int
    nvml: NvmlReading | None
    allocator: AllocatorReading | None

    @property
    def outside_pytorch_bytes(self) -> int | None:
        """This process's device memory that PyTorch's cache does not account for.

        The CUDA context and other libraries' own allocations (CuPy, JAX, NCCL, a custom
        ``cudaMalloc``) live here; cuBLAS and cuDNN workspaces do not, because ATen takes them
        from the caching allocator. Known only when NVML attributes memory to this process.
        """
        if self.nvml is None or self.nvml.process_bytes is None:
            return None
        reserved = self.allocator.reserved_bytes if self.allocator else 0
        return max(self.nvml.process_bytes - reserved, 0)


@dataclass(frozen=True)
class Sample:
    """One reading of every source."""

    t_s: float  # monotonic clock, for arithmetic
    wall_s: float  # wall clock, for display only
    rss_bytes: int | None
    devices: tuple[DeviceSample, ...] = ()
    # When the NVML figures were read, if not at ``t_s`` (the hooks reuse the sampler's).
    nvml_t_s: float | None = None

    def device(self, index: int) -> DeviceSample | None:
        for d in self.devices:
            if d.index == index:
                return d
        return None


@dataclass(frozen=True)
class AllocatorInfo:
    """How the allocator is configured; read once torch has initialized CUDA."""

    backend: str  # "native" or "cudaMallocAsync"
    conf: str  # the effective PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF, "" when unset
    conf_var: str  # which environment variable held it


@dataclass(frozen=True)
class SourceStatus:
    """One plain line per source, for status displays."""

    nvml: str
    torch: str
    gpu_count: int
    allocator: AllocatorInfo | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def has_gpu(self) -> bool:
        return self.gpu_count > 0


@dataclass(frozen=True)
class CellDevice:
    """One device's memory across one cell."""

    index: int
    allocated_before_bytes: int | None
    allocated_after_bytes: int | None
    reserved_before_bytes: int | None
    reserved_after_bytes: int | None
    # Exact when the cell raised the process-wide peak, when peaks were reset at its start
    # (``--peak reset``), or when CUDA came up during the cell; else a lower bound.
    peak_allocated_bytes: int | None
    peak_exact: bool
    nvml_used_before_bytes: int | None
    nvml_used_after_bytes: int | None
    nvml_peak_bytes: int | None  # highest NVML "used" sampled during the cell
    process_before_bytes: int | None
    process_after_bytes: int | None
    # What this kernel's child processes held on the device (NVML), at either end.
    children_before_bytes: int | None = None
    children_after_bytes: int | None = None
    # Whether ``nvml_peak_bytes`` rests on a reading taken during or after the cell. False:
    # only the reading at its start was known (cells run back to back, as in Run All, end
    # before the sampler reads again), so the figure is a lower bound, shown with "≥".
    nvml_peak_measured: bool = True

    @property
    def idle(self) -> bool:
        """Nothing of this process's on this device, before or after, and no change: a
        second GPU the notebook never touches."""
        held = (self.allocated_before_bytes, self.allocated_after_bytes,
                self.reserved_before_bytes, self.reserved_after_bytes,
                self.process_before_bytes, self.process_after_bytes)
        return not any(held) and not self.nvml_delta_bytes

    @property
    def allocated_delta_bytes(self) -> int | None:
        return _delta(self.allocated_before_bytes, self.allocated_after_bytes)

    @property
    def reserved_delta_bytes(self) -> int | None:
        return _delta(self.reserved_before_bytes, self.reserved_after_bytes)

    @property
    def process_delta_bytes(self) -> int | None:
        return _delta(self.process_before_bytes, self.process_after_bytes)

    @property
    def nvml_delta_bytes(self) -> int | None:
        return _delta(self.nvml_used_before_bytes, self.nvml_used_after_bytes)


def _delta(before: int | None, after: int | None) -> int | None:
    """``after - before``; unknown when either is. (An allocator that was not up before a
    cell reads 0 there, not None: see ``analysis.cell_devices``.)"""
    if after is None or before is None:
        return None
    return after - before


@dataclass(frozen=True)
class CellRecord:
    """What one top-level cell did to memory."""

    execution_count: int | None
    cell_key: str
    source_preview: str
    start_wall_s: float
    duration_s: float
    devices: tuple[CellDevice, ...]
    rss_before_bytes: int | None
    rss_after_bytes: int | None
    raised: bool = False
    error: str = ""

    @property
    def rss_delta_bytes(self) -> int | None:
        return _delta(self.rss_before_bytes, self.rss_after_bytes)

    def shown_devices(self) -> tuple[CellDevice, ...]:
        """The devices worth a row in a report: idle ones are left out (exports keep all),
        unless every device is idle, when the first stands for them."""
        active = tuple(d for d in self.devices if not d.idle)
        return active or self.devices[:1]


# Causes of re-run growth, in the order they are checked.
# The name of what only something Python cannot see keeps (a holder of kind "unseen"), after
# the path from the object it holds where the search could say it.
UNSEEN_NAME = "referenced from where Python cannot see"
CAUSE_LIVE_TENSORS = "live tensors"
CAUSE_CACHE = "cache"
CAUSE_OUTSIDE = "outside PyTorch"


@dataclass(frozen=True)
class Holder:
    """Something in the session that keeps memory alive."""

    name: str  # how the user can reach it: "y", "Out[5]", "traceback: f() local x"
    kind: str  # "variable", "output cache", "traceback", "module", "optimizer state", ...
    device: str  # "cuda:0", "cpu"
    nbytes: int  # the tensors' own storage; what their autograd graph keeps is graph_bytes
    detail: str = ""
    # One of its tensors has ``grad_fn``: it keeps an autograd graph alive, and with it every
    # tensor that graph saved for backward (see graph.py: sized without unpacking anything).
    holds_graph: bool = False
    graph_nodes: int | None = None  # nodes walked from its grad_fns; None: not walked
    graph_nodes_capped: bool = False  # the walk stopped at its budget: at least graph_nodes
    # The saved tensors on ``device`` only its graph keeps (not counted under another holder,
    # parameters never); None when no graph was walked. A lower bound when capped.
    graph_bytes: int | None = None
    graph_bytes_capped: bool = False
    graph_unsized: int = 0  # saved tensors behind hooks (or an unknown torch): not sized
    nodes: int = 0  # autograd nodes it keeps on their own (a list of grad_fns), not as tensors
    # Where inside it the bytes are, from its name through attributes, items or closures, with
    # the class of what holds them: "model_kwargs['past_key_values'] (DynamicCache)".
    path: str = ""
    # The object walk stopped at its time or object budget inside it: nbytes is a lower bound.
    walk_capped: bool = False
    arrays: bool = False  # numpy/cupy-like arrays, not torch tensors
    array_module: str = ""  # the arrays' library ("cupy"): whose pool a `del` returns them to
    # Its cut checked against the retention graph (holders/verify.py): True, ``code`` frees
    # it (extended where the walk's names missed a reference); False, no one line does;
    # None, not checked. ``cut_note`` says what else keeps it, or why it was not checked.
    cut_checked: bool | None = None
    cut_note: str = ""
    # What that cut frees where the check found less than all of its bytes freed (the rest
    # kept by a thread, or from where Python cannot see); None: all of them, or not checked.
    cut_freed_bytes: int | None = None
    # The public call that empties the container every path to its bytes runs through
    # (``reg.clear()`` for a registry, ``d.clear()`` for a deque): the fix that keeps the
    # object; "" where there is none (holders/retention.py).
    clear_code: str = ""
    # A module's bytes beyond its parameters, gradients and buffers (hooks' closures, plain
    # attributes), wherever they are: split among several, no one path names them.
    contents_bytes: int = 0
    # (address, bytes) of each of its own tensors' storages on a GPU: which memory pool they
    # are in (a CUDA graph's outputs are in its private pool) is read from these.
    storages: tuple[tuple[int, int], ...] = field(default=(), compare=False, repr=False)
    # Every other reference that keeps the same bytes alive: all of them must go for the bytes
    # to be freed (`del ds` alone frees nothing while `dl.dataset` is `ds`).
    also_held_by: tuple[str, ...] = ()
    # What frees it, as a user types it, where one line does ("del ds, dl",
    # "featcache.store.clear()", "import gc; gc.collect()"); "" where none does.
    code: str = ""
    # Of its bytes, its modules' gradients: `zero_grad(set_to_none=True)` frees them and keeps
    # the model.
    grad_bytes: int = 0
    # A single tensor that views a small part of a large storage: its own bytes, where
    # `.clone()` would keep only those.
    view_bytes: int | None = None
    # Garbage: the classes in the reference cycles that keep it. Not searched: why.
    classes: tuple[str, ...] = ()
    why: str = ""
    # Found by the retention search, up from the tensor, not by the walk down from the names.
    searched: bool = False

    @property
    def label(self) -> str:
        """Its name and, where one object inside holds nearly all of it, the path there."""
        return f"{self.name} → {self.path.lstrip()}" if self.path else self.name

    @property
    def held_bytes(self) -> int:
        """What letting go of this holder would free: its tensors and its graph's."""
        return self.nbytes + (self.graph_bytes or 0)


@dataclass(frozen=True)
class CellStart:
    """A running cell on one device, for weighing what the cell itself allocated."""

    allocated_bytes: int | None  # PyTorch's allocated bytes when the cell started
    # The same cell's last run that ended without an error: its peak above its own start.
    previous_peak_bytes: int | None = None
    previous_peak_exact: bool = False


@dataclass(frozen=True)
class Verdict:
    """A flagged re-run accumulation and its likely cause."""

    cell_key: str
    execution_count: int | None
    runs: int
    device: int
    growth_bytes: int  # this run's growth of the measure named by ``cause``
    cause: str
    raised: bool = False  # the run ended in an exception (its traceback may hold the memory)
    holders: tuple[Holder, ...] = ()
    message: str = ""


@dataclass
class CellMark:
    """A cell's start on the timeline; its count is filled in when the cell ends (shown as
    ``[*]`` meanwhile, as Jupyter shows a running cell)."""

    t_s: float
    execution_count: int | None = None
