"""Explain a CUDA out-of-memory error in the cell that hit it.

Three layers, each testable alone:

1. ``parse_oom_message``: every format PyTorch has printed (torch 1.x's ``(GPU 0; ... total
   capacity; ...)``, 2.1's "capacty", 2.2+'s sentences, the ``cudaMallocAsync`` backend's
   table, driver and library "out of memory" errors) read into one ``OomMessage``.
2. ``classify``: the cause, most specific first, decided from measured numbers (the message
   only fills gaps): impossible on this GPU, fragmentation, other processes, this process
   outside PyTorch, memory held by things the user can let go of.
3. ``OomWatch``: the runtime. It registers PyTorch's OOM observer once per process (never
   creating a CUDA context, kept across ``%reload_ext``), records the allocator's state at
   the failure, when every tensor is still alive, and turns a failing cell into an
   ``OomExplanation`` with what to do next. Ordinary cells cost one attribute check.

Nothing here imports torch or IPython.
"""

from __future__ import annotations

import contextlib
import html
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from . import userexc
from .analysis import held_text, holder_action
from .cleanup import CleanupReport, CleanupRequest
from .errtext import error_str
from .holders import exception_chain, last_value
from .model import (
    ROLE_DATALOADER,
    ROLE_LAUNCHED,
    AllocatorReading,
    CellStart,
    ChildProcess,
    Holder,
    Sample,
)
from .report import html_table
from .sources.processes import roles_to_learn
from .sources.torch import TorchDebug, alloc_conf
from .units import format_bytes, printable

GiB = 1 << 30
MiB = 1 << 20

# ------------------------------------------------------------------------------------------
# 1. The message
# ------------------------------------------------------------------------------------------
FORM_NATIVE = "native"  # torch >= 2.1: "GPU 0 has a total capacity of ..."
FORM_CLASSIC = "native (torch < 2.1)"  # "(GPU 0; 15.78 GiB total capacity; ...)"
FORM_ASYNC = "cudaMallocAsync"  # "Allocation on device 0 would exceed allowed memory."
FORM_SIZE_CHECK = "size check"  # "Tried to allocate more than 1EB memory."
FORM_DRIVER = "CUDA runtime or library"  # "CUDA error: out of memory", cuBLAS/cuDNN
FORM_UNKNOWN = "unrecognised"

# c10's format_size prints "N bytes", or two decimals of KiB/MiB/GiB.
#
# Every pattern here runs on the text of any exception a cell raises, so each must take time
# linear in the text, whatever it holds (issue 16: a 1,200-space run once froze the kernel for
# seconds in a pattern that backtracked cubically). The rules that keep it so:
# - a number starts only where no digit or point precedes it (the lookbehind), so a run of
#   digits is tried from its first digit only, not from each of its n positions;
# - every "anything up to" is bounded ({0,N}), never ``[^)]*`` or ``.*?`` followed by more
#   pattern, which retries from every start;
# - no two adjacent quantifiers can share characters (``\s+(.*?)\s*$`` was the cubic one).
# And long messages are read only at their head and tail (``_window``).
_NUMBER = r"(?<![0-9.])([0-9]+(?:\.[0-9]+)?)"
_SIZE = _NUMBER + r"[ \t]*(bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB)"
_UNIT = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
         "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
# NVML's "not available" and the async backend's "no limit" are 2**64 - 1, printed as
# 17179869184.00 GiB. Anything this large is a sentinel, not a measurement.
_SENTINEL_BYTES = 1 << 62
_EB = 1 << 60
# A real OOM message is under 2 KiB; a longer text (a user's error quoting a log) is read
# only this far from each end, so parsing costs the same for 10 kB and 10 MB.
WINDOW_CHARS = 4096
_GAP = "\n\x00\n"  # joins head and tail: no pattern can match across it
# Device indexes and PIDs: more digits than this is not a device or a process.
_MAX_INDEX_DIGITS = 9
# Python refuses int() on more than 4300 digits; a size this long is a sentinel anyway.
_MAX_SIZE_DIGITS = 30
# Exceptions of a cell's chain looked at for an OOM (the cell's own, what caused it, ...).
_OOM_CHAIN_CAP = 8

_NATIVE_HEAD = re.compile(
    r"Tried to allocate " + _SIZE + r"\.\s{1,16}GPU ([0-9]+) has a total capac(?:i)?ty of "
    + _SIZE + r" of which " + _SIZE + r" is free\.")
_CLASSIC_HEAD = re.compile(
    r"Tried to allocate " + _SIZE + r"\s{0,16}\(GPU ([0-9]+);([^()]{0,512})\)")
_CLASSIC_PART = re.compile(r"\s*" + _SIZE + r"\s+(.*)", re.S)
_OTHER_PROC = re.compile(r"\bProcess ([0-9]+) has " + _SIZE + r" memory in use\.")
_THIS_PROC = re.compile(r"\b[Tt]his process has " + _SIZE + r" memory in use\.")
_ALLOWED = re.compile(_SIZE + r" allowed;")
_OF_ALLOCATED = re.compile(
    r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch,"
    r"(?:\s{0,16}with " + _SIZE + r" allocated in private pools(?: \([^)]{0,200}\))?,)?"
    r"\s{0,16}and " + _SIZE + r" is reserved by PyTorch but unallocated")
_ASYNC_HEAD = re.compile(r"Allocation on device ([0-9]+) would exceed allowed memory")
_ASYNC_FIELDS = {
    "allocated": re.compile(r"Currently allocated\s{0,64}:\s{0,64}" + _SIZE),
    "requested": re.compile(r"Requested\s{0,64}:\s{0,64}" + _SIZE),
    "total": re.compile(r"Device limit\s{0,64}:\s{0,64}" + _SIZE),
    "free": re.compile(r"Free \(according to CUDA\)\s{0,64}:\s{0,64}" + _SIZE),
    "limit": re.compile(r"PyTorch limit[^:]{0,200}:\s{0,64}" + _SIZE),
}
_DRIVER = re.compile(
    r"CUDA error: out of memory|CUDA driver error: out of memory|cudaErrorMemoryAllocation"
    r"|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|CUFFT_ALLOC_FAILED"
    r"|CUSOLVER_STATUS_ALLOC_FAILED|CURAND_STATUS_ALLOCATION_FAILED")
_CUDA_OOM = re.compile(r"CUDA out of memory|would exceed allowed memory\. \(out of memory\)")
_NOT_CUDA = re.compile(r"\b(?:XPU|MPS backend|MTIA|HPU) out of memory")
# How a RuntimeError that *is* an allocator or driver OOM begins (torch < 1.13 raised the
# allocator's as a plain RuntimeError; torch.AcceleratorError and library errors still are).
# A message that only quotes one further in is someone's own error, not an OOM.
_OOM_START = re.compile(
    r"\s{0,16}(?:CUDA out of memory"
    r"|Allocation on device [0-9]+ would exceed allowed memory"
    r"|(?:CUDA|CUDA driver|cuBLAS|CUBLAS|cuDNN|CUDNN|cuFFT|cuSOLVER|cusolver|cuRAND|curand)"
    r" error: (?:out of memory|cudaErrorMemoryAllocation|[A-Z_]{0,40}ALLOC(?:ATION)?_FAILED)"
    r"|cudaErrorMemoryAllocation"
    r"|(?:CUBLAS_STATUS|CUDNN_STATUS|CUFFT|CUSOLVER_STATUS|CURAND_STATUS)_ALLOC(?:ATION)?_FAILED)")


def _window(text: str) -> str:
    """The head and tail of a long text, where an OOM message's figures are."""
    if len(text) <= 2 * WINDOW_CHARS + len(_GAP):
        return text
    return text[:WINDOW_CHARS] + _GAP + text[-WINDOW_CHARS:]


def _index(digits: str) -> int | None:
    """A device index or PID as printed; None when it is too long to be one."""
    return int(digits) if len(digits) <= _MAX_INDEX_DIGITS else None


def _bytes(number: str, unit: str) -> tuple[int | None, int]:
    """(bytes or None for a sentinel, rounding error of the printed figure)."""
    whole, _, decimals = number.partition(".")
    if len(whole) > _MAX_SIZE_DIGITS:  # beyond any sentinel (and beyond float's range)
        return None, 0
    scale = _UNIT[unit]
    value = round(float(f"{whole}.{decimals[:_MAX_SIZE_DIGITS] or '0'}") * scale)
    shown = min(len(decimals), _MAX_SIZE_DIGITS)
    precision = int(scale * 0.5 * 10 ** -shown) if scale > 1 else 0
    return (None if value >= _SENTINEL_BYTES else value), precision


@dataclass(frozen=True)
class OomMessage:
    """What an OOM error's text says. Every figure is optional: formats differ by version."""

    form: str
    device: int | None = None
    requested_bytes: int | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    allowed_bytes: int | None = None
    allocated_bytes: int | None = None  # allocated by PyTorch
    reserved_bytes: int | None = None  # PyTorch's whole reservation (torch < 2.1 prints it)
    unallocated_bytes: int | None = None  # reserved by PyTorch but unallocated
    private_pool_bytes: int | None = None  # CUDA graphs' pools
    this_process_bytes: int | None = None  # NVML's figure for the failing process
    other_processes: tuple[tuple[int, int | None], ...] = ()
    precision_bytes: int = 0  # the largest rounding error among the printed figures

    @property
    def reserved_total_bytes(self) -> int | None:
        if self.reserved_bytes is not None:
            return self.reserved_bytes
        if self.allocated_bytes is not None and self.unallocated_bytes is not None:
            return self.allocated_bytes + self.unallocated_bytes
        return None


def parse_oom_message(text: str) -> OomMessage | None:
    """Read any CUDA OOM message PyTorch has printed; None when ``text`` is not one.

    Takes time linear in ``text`` and reads at most ``WINDOW_CHARS`` from each end of it."""
    text = _window(text)
    if _NOT_CUDA.search(text):
        return None
    figures: dict[str, Any] = {}
    precision = [0]

    def size(m: re.Match[str] | None, group: int = 1) -> int | None:
        if m is None:
            return None
        value, err = _bytes(m.group(group), m.group(group + 1))
        precision[0] = max(precision[0], err)
        return value

    head = _NATIVE_HEAD.search(text)
    if head is not None:
        figures.update(form=FORM_NATIVE, requested_bytes=size(head, 1),
                       device=_index(head.group(3)), total_bytes=size(head, 4),
                       free_bytes=size(head, 6))
        of = _OF_ALLOCATED.search(text)
        if of is not None:
            figures.update(allocated_bytes=size(of, 1), unallocated_bytes=size(of, 5))
            if of.group(3):
                figures["private_pool_bytes"] = size(of, 3)
        figures["allowed_bytes"] = size(_ALLOWED.search(text))
        figures["this_process_bytes"] = size(_THIS_PROC.search(text))
        others = ((_index(m.group(1)), size(m, 2)) for m in _OTHER_PROC.finditer(text))
        figures["other_processes"] = tuple((pid, n) for pid, n in others if pid is not None)
    elif (classic := _CLASSIC_HEAD.search(text)) is not None:
        figures.update(form=FORM_CLASSIC, requested_bytes=size(classic, 1),
                       device=_index(classic.group(3)))
        for part in classic.group(4).split(";"):
            m = _CLASSIC_PART.match(part)
            if m is None:
                continue
            what = " ".join(m.group(3).split())
            key = {"total capacity": "total_bytes", "already allocated": "allocated_bytes",
                   "free": "free_bytes", "allowed": "allowed_bytes",
                   "reserved in total by PyTorch": "reserved_bytes",
                   # torch <= 1.3 called the cached-but-unused part "cached"
                   "cached": "unallocated_bytes"}.get(what)
            if key is not None:
                figures[key] = size(m)
    elif (a := _ASYNC_HEAD.search(text)) is not None:
        found = {k: size(r.search(text)) for k, r in _ASYNC_FIELDS.items()}
        figures.update(form=FORM_ASYNC, device=_index(a.group(1)),
                       allocated_bytes=found["allocated"], requested_bytes=found["requested"],
                       total_bytes=found["total"], free_bytes=found["free"],
                       allowed_bytes=found["limit"])
    elif "Tried to allocate more than 1EB" in text:
        figures.update(form=FORM_SIZE_CHECK, requested_bytes=_EB)
    elif _DRIVER.search(text):
        figures.update(form=FORM_DRIVER)
    elif _CUDA_OOM.search(text):
        figures.update(form=FORM_UNKNOWN)
    else:
        return None
    return OomMessage(precision_bytes=precision[0], **figures)


def first_line(text: str, limit: int) -> str:
    """The first non-blank line of ``text``, at most ``limit`` characters, in time bounded by
    ``limit`` whatever the text's length."""
    head = text[: limit + 4096].lstrip()
    return head[: limit + 1].splitlines()[0][:limit] if head else ""


def _torch_oom_type(exc: BaseException) -> bool:
    """``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError`` before 2.5) or a subclass,
    recognised by name and module so that torch is never imported (and read through
    ``userexc``, so that a metaclass's ``__name__`` or ``__module__`` is never run)."""
    for cls in userexc.mro(type(exc)):
        module = userexc.class_module(cls)
        if userexc.class_name(cls) == "OutOfMemoryError" and isinstance(module, str) and (
                module == "torch" or module.startswith("torch.")):
            return True
    return False


def is_cuda_oom(exc: BaseException) -> bool:
    """Whether ``exc`` itself is an allocator or driver out-of-memory error: by type, or a
    ``RuntimeError`` whose message begins like one. A user's own error that merely quotes
    "CUDA out of memory" is not. Its text is asked for only when the type leaves the answer
    open."""
    if _torch_oom_type(exc):
        return not _NOT_CUDA.search(_window(error_str(exc)))
    if not issubclass(type(exc), RuntimeError):
        return False
    text = error_str(exc)
    return _OOM_START.match(text) is not None and parse_oom_message(text) is not None


def find_cuda_oom(exc: BaseException | None) -> BaseException | None:
    """The CUDA OOM in ``exc`` or in what it chains to (a wrapper's ``__cause__``, the error
    it was raised while handling), else None.

    ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError`` before 2.5) is recognised by
    type; the ``RuntimeError`` of torch < 1.13, ``torch.AcceleratorError`` and library errors
    by how their text begins.
    """
    for e in userexc.chain(exc, _OOM_CHAIN_CAP):
        if is_cuda_oom(e):
            return e
    return None


# ------------------------------------------------------------------------------------------
# 2. Facts and causes
# ------------------------------------------------------------------------------------------
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
        return max(self.reserved_bytes - self.allocated_bytes, 0)

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
    def shortfall_bytes(self) -> int | None:
        """How much more free memory the request needed."""
        if self.requested_bytes is None or self.headroom_bytes is None:
            return None
        return max(self.requested_bytes - self.headroom_bytes, 0)


CAUSE_IMPOSSIBLE = "impossible"
CAUSE_FRAGMENTATION = "fragmentation"
CAUSE_POOL = "cached by the cudaMallocAsync pool"
CAUSE_OTHER_PROCESSES = "other processes"
CAUSE_OUTSIDE = "outside PyTorch"
CAUSE_HELD = "held by your session"
CAUSE_WORKING_SET = "working set"
CAUSE_UNKNOWN = "unknown"

# The CUDA context: memory every CUDA process holds outside PyTorch (518-610 MiB measured on
# the H200). Only what goes beyond it counts as a cause. cuBLAS and cuDNN workspaces are not
# outside: ATen takes them from the caching allocator, so they are in ``allocated``.
CONTEXT_ALLOWANCE_BYTES = 1 * GiB
# Held objects and other processes are listed when they matter this much, even when alone
# they would not have made the request fit.
_NOTABLE_BYTES = 256 * MiB
_HELD_KINDS_FIRST = ("output cache", "traceback")
# The failing call's own traceback, when the explanation comes after the fact: the
# computation's working set, not something the session keeps.
KIND_FAILED_CALL = "failed call"
# The cell's working set is the verdict when it is this many times every other cause: then
# freeing anything else would let this one request through, not the computation.
_DWARFS = 4
# A next step freeing less than this share of what was missing is not worth a line.
_WORTH_A_LINE = 0.01


@dataclass(frozen=True)
class Cause:
    kind: str
    nbytes: int | None  # the memory this cause accounts for
    summary: str
    covers: bool = False  # letting go of this alone would have made the request fit
    details: tuple[str, ...] = ()


def held_holders(holders: Iterable[Holder], device: int) -> list[Holder]:
    """What the session holds on ``device`` (with their graphs), the accidental holders (Out,
    a traceback) first; the failing call's own locals are the computation's, not listed."""
    on = [h for h in holders if h.device in (f"cuda:{device}", "cuda") and h.held_bytes > 0
          and h.kind != KIND_FAILED_CALL]
    return sorted(on, key=lambda h: (h.kind not in _HELD_KINDS_FIRST, -h.held_bytes, h.name))


def classify(facts: OomFacts, holders: Sequence[Holder] = ()) -> tuple[Cause, ...]:
    """Every cause that applies, most specific first. The first one that alone covers the
    shortfall is the verdict; the others are listed as contributing."""
    f = facts
    req = f.requested_bytes
    slack = f.precision_bytes
    if req is None:
        return (Cause(CAUSE_UNKNOWN, None,
                      "The error does not say how much was asked, so only the readings "
                      "below can be shown."),)
    if f.total_bytes is not None and req > f.total_bytes + slack:
        return (Cause(CAUSE_IMPOSSIBLE, req,
                      f"Impossible on this GPU: {format_bytes(req)} is more than the GPU's "
                      f"whole memory ({format_bytes(f.total_bytes)}). No cleanup can make it "
                      "fit.", covers=True),)
    if f.allowed_bytes is not None and req > f.allowed_bytes + slack:
        return (Cause(CAUSE_IMPOSSIBLE, req,
                      f"Impossible under this process's cap: {format_bytes(req)} is more than "
                      f"the {format_bytes(f.allowed_bytes)} that "
                      "torch.cuda.set_per_process_memory_fraction allows.", covers=True),)
    need = f.shortfall_bytes
    causes: list[Cause] = []
    # Under a memory-fraction cap that PyTorch has reached, memory elsewhere on the GPU
    # cannot help; only what PyTorch itself holds can.
    held_now = f.allocated_bytes if f.pool_reuses_unallocated else f.reserved_bytes
    capped = f.allowed_bytes is not None and held_now is not None and \
        f.allowed_bytes - held_now + slack < req

    def covers(nbytes: int | None) -> bool:
        return need is not None and nbytes is not None and nbytes > 0 and \
            nbytes + slack >= need

    def covers_outside(nbytes: int | None) -> bool:
        return not capped and covers(nbytes)

    split = f.unallocated_bytes
    if f.pool_reuses_unallocated:
        if need is not None and need <= slack and split:
            # The pool's unused memory plus what was free would have fit, yet the driver did
            # not serve it: that memory is the cause, and empty_cache is the cure. Freeing
            # something else alone helps if it covers what the driver itself lacked.
            need = max((req - (f.free_bytes or 0)), 0)
            causes.append(Cause(
                CAUSE_POOL, split,
                f"The cudaMallocAsync pool held {format_bytes(split)} it was not using, with "
                f"{format_bytes(f.free_bytes)} free besides: together enough for "
                f"{format_bytes(req)}, yet the driver did not serve it from the pool (memory "
                "freed on another stream and not yet reusable, or the pool's address range "
                "cut up). torch.cuda.empty_cache() returns the pool's unused memory to the "
                "driver.", covers=True))
    elif split and (covers(split) or split >= _NOTABLE_BYTES):
        causes.append(_fragmentation(f, split, covers(split)))
    if f.other_processes and (covers(f.others_bytes) or f.others_bytes >= _NOTABLE_BYTES):
        causes.append(Cause(
            CAUSE_OTHER_PROCESSES, f.others_bytes,
            _others_summary(f)
            + (" (it would not help: this process is at its memory-fraction cap)."
               if capped else "."),
            covers=covers_outside(f.others_bytes),
            details=tuple(f"{p.label}: {format_bytes(p.nbytes)}"
                          for p in sorted(f.other_processes, key=lambda p: -(p.nbytes or 0)))))
    outside = f.outside_pytorch_bytes
    if outside is not None and outside > CONTEXT_ALLOWANCE_BYTES and (
            covers_outside(outside) or outside >= _NOTABLE_BYTES):
        causes.append(Cause(
            CAUSE_OUTSIDE, outside,
            f"This process holds {format_bytes(outside)} outside PyTorch's allocator: the "
            f"CUDA context{_context_measured(f)}, and other libraries' own allocations (CuPy, "
            "JAX, NCCL, a custom cudaMalloc).",
            covers=covers_outside(outside)))
    causes.extend(_held(f, holders, covers))
    grown = f.cell_bytes if f.cell_bytes is not None else f.computation_bytes
    if grown:
        # Stranded bytes stand between the computation and success only when they are of
        # the computation's scale: a cell that has consumed many times them (a loop keeping
        # every step's graph) would fail again a request later. Unless, usable, they would
        # have served _DWARFS or more requests of this size: then they are what failed,
        # whatever the cell made before (20 GiB in 1 GiB holes against a 2 GiB request). The
        # cell's bytes are not proof of a growing computation anyway: its start is the last
        # reading before it, so what ran between cells after that reading counts as its own.
        causes = [_demoted(c, f) if c.kind in (CAUSE_FRAGMENTATION, CAUSE_POOL) and c.covers
                  and grown >= _DWARFS * (c.nbytes or 0)
                  and _requests_served(f, c) < _DWARFS else c for c in causes]
    working = _dominant_working_set(f, causes, holders, need)
    if working is not None:
        # Whatever else covers this request's shortfall would only let this one request
        # through: the computation keeps asking. Those causes stay listed, not as the verdict.
        causes = [_demoted(c, f) for c in causes]
        causes.insert(0, working)
    elif not any(c.covers for c in causes):
        causes.insert(0, _working_set(f, causes, need))
    # Most specific first, among those that alone would have been enough.
    return tuple(sorted(causes, key=lambda c: not c.covers))


def cell_working_set_bytes(f: OomFacts, holders: Sequence[Holder] = ()) -> int | None:
    """What the failing cell allocated and still held at the failure, none of it held by the
    session: the cell's allocated bytes since its start, at most what PyTorch had allocated
    beyond everything the session's holders account for (a tensor an earlier cell made and
    this cell freed does not make the cell's own figure smaller than it is)."""
    own = f.cell_bytes
    if own is None:
        return f.computation_bytes
    if f.allocated_bytes is not None:
        session = sum(h.held_bytes for h in held_holders(holders, f.device))
        own = min(own, max(f.allocated_bytes - session, 0))
    return max(own, f.computation_bytes or 0)


def _dominant_working_set(f: OomFacts, causes: Sequence[Cause], holders: Sequence[Holder],
                          need: int | None) -> Cause | None:
    working = cell_working_set_bytes(f, holders)
    if working is None or need is None or working < max(need, _NOTABLE_BYTES):
        return None
    biggest = max(causes, key=lambda c: c.nbytes or 0, default=None)
    other = (biggest.nbytes or 0) if biggest is not None else 0
    if working < _DWARFS * other:
        return None
    gpu = (f" ({working / f.total_bytes:.0%} of the GPU's {format_bytes(f.total_bytes)})"
           if f.total_bytes else "")
    past = ""
    prev = f.cell_previous_peak_bytes
    if prev:
        times = working / prev
        past = (f"; its previous run peaked {'at' if f.cell_previous_peak_exact else 'at least at'}"
                f" {format_bytes(prev)} above its start"
                + (f", {times:.0f}× less" if times >= 2 else ""))
    besides = (f" Nothing else comes close: the next largest cause below is "
               f"{format_bytes(other)}." if biggest is not None else "")
    return Cause(
        CAUSE_WORKING_SET, working,
        f"The failing cell's own working set: it had allocated {format_bytes(working)} since "
        f"it started{gpu}, and still held it when {format_bytes(f.requested_bytes)} more was "
        f"asked{past}. The computation is too large for this GPU as it is.{besides}",
        covers=True)


def _requests_served(f: OomFacts, stranded: Cause) -> int:
    """How many requests of the failing size the stranded bytes, were they usable, and the
    room the allocator had besides would have served (under cudaMallocAsync that room
    already counts the pool's unused bytes)."""
    room = (f.headroom_bytes or 0) + (0 if f.pool_reuses_unallocated else stranded.nbytes or 0)
    return room // max(f.requested_bytes or 0, 1)


def _demoted(c: Cause, f: OomFacts) -> Cause:
    if not c.covers:
        return c
    if c.kind in (CAUSE_FRAGMENTATION, CAUSE_POOL):
        more = _requests_served(f, c) - 1
        served = (f"this request and {more} more of its size" if more > 0
                  else "this one request")
        return replace(c, covers=False, summary=c.summary + f" Usable, it would have let "
                       f"{served} through, not the computation.")
    return replace(c, covers=False)


def _context_measured(f: OomFacts) -> str:
    """The context's size where this session measured it, else nothing: it differs between
    GPUs, drivers and CUDA versions, so no figure from elsewhere is quoted."""
    if not f.idle_process_bytes:
        return ""
    return (f" (NVML listed this process at {format_bytes(f.idle_process_bytes)} while "
            "PyTorch held nothing on this GPU)")


def _others_summary(f: OomFacts) -> str:
    kids = f.children_bytes
    n = sum(1 for p in f.other_processes if p.child is not None)
    if n and kids == f.others_bytes:
        each = "each " if n > 1 else ""
        return (f"This kernel's own child process{'es' if n > 1 else ''} "
                f"hold{'' if n > 1 else 's'} {format_bytes(kids)} of this GPU, {each}with a "
                "CUDA context of its own besides what it allocated")
    text = f"Other processes hold {format_bytes(f.others_bytes)} of this GPU"
    if n:
        text += (f", {format_bytes(kids)} of it this kernel's own child process"
                 f"{'es' if n > 1 else ''}")
    return text


def _fragmentation(f: OomFacts, split: int, covering: bool) -> Cause:
    largest = f.largest_free_block_bytes
    piece = (f", the largest free piece {format_bytes(largest)}"
             if largest is not None else "")
    return Cause(
        CAUSE_FRAGMENTATION, split,
        f"Fragmentation: {format_bytes(split)} sat free inside PyTorch's cache{piece}, but in "
        "pieces of segments that still hold live tensors, so the allocator could neither use "
        f"them for {format_bytes(f.requested_bytes)} nor give them back to the driver.",
        covers=covering)


def _held(f: OomFacts, holders: Sequence[Holder],
          covers: Callable[[int | None], bool]) -> list[Cause]:
    out: list[Cause] = []
    released, unreachable = f.released_since_bytes or 0, f.unreachable_bytes or 0
    gone = released + unreachable
    if f.previous_error and gone >= _NOTABLE_BYTES:
        # Explained after the fact (no observer): this error has replaced the previous
        # cell's stored traceback. What it held is either free already or, because IPython's
        # frames and results form a reference cycle, waiting for the garbage collector.
        if released and unreachable:
            state = (f"{format_bytes(released)} of it is free again and "
                     f"{format_bytes(unreachable)} waits for the garbage collector")
        else:
            state = "now free again" if released else "now waiting for the garbage collector"
        if f.earlier_errors > 1:
            # Tracebacks replaced before the previous cell's wait the same way: the bytes
            # cannot be told apart by error.
            story = (f"The tracebacks of earlier errors, the last the previous cell's "
                     f"({f.previous_error}), kept their failed calls' locals until later "
                     "errors replaced them")
        else:
            story = (f"The previous cell's error ({f.previous_error}) kept its traceback, and "
                     "with it the failed call's locals, until this error replaced it")
        out.append(Cause(
            CAUSE_HELD, gone, f"{story}: {format_bytes(gone)}, {state}.", covers=covers(gone),
            details=("measured after the error: PyTorch's allocated bytes at the failure "
                     "(from the message) and now, minus everything reachable from your "
                     "variables, Out and the stored traceback",)))
    elif unreachable >= _NOTABLE_BYTES:
        # Garbage only where a replaced traceback could be waiting for the collector; with
        # none there is no cycle to expect, and most often the scan just does not look where
        # they are held.
        at_start = f.measured_at == "failure" and f.cell_start_bytes is not None
        head = (f"When this cell started, PyTorch already held {format_bytes(f.cell_start_bytes)}"
                f"; {format_bytes(unreachable)} of it is reachable from nothing the scan walks"
                if at_start else
                f"{format_bytes(unreachable)} is allocated but reachable from nothing the scan "
                "walks")
        out.append(Cause(
            CAUSE_HELD, unreachable,
            head + " (your variables, Out, the stored traceback, and the autograd graphs "
            "behind them): objects it does not look inside, such as your own classes' "
            "attributes, closures or a library's caches"
            + (", or the traceback of an earlier error that a later one replaced, waiting "
               "for the garbage collector (IPython's frames keep it in a reference cycle)"
               if garbage_plausible(f) else "") + ".",
            covers=covers(unreachable),
            details=(UNREACHABLE_AT_START if at_start else UNREACHABLE,)))
    held = held_holders(holders, f.device)
    total = sum(h.held_bytes for h in held)
    if held and (covers(total) or total >= _NOTABLE_BYTES):
        when = "at the failure" if f.measured_at == "failure" else "now"
        out.append(Cause(
            CAUSE_HELD, total,
            f"Your session holds {format_bytes(total)} on this GPU ({when}) in things you can "
            "let go of: " + ", ".join(f"{h.name} {held_text(h)}" for h in held[:5])
            + (f" and {len(held) - 5} more" if len(held) > 5 else "") + ".",
            covers=covers(total),
            details=tuple(f"{h.name} ({h.kind}): {held_text(h)}"
                          + (f", {h.detail}" if h.detail else "") for h in held[:10])))
    return out


UNREACHABLE = ("allocated now, minus what your variables, Out, the stored traceback and their "
               "autograd graphs hold")
UNREACHABLE_AT_START = ("measured at the failure: allocated when this cell started, minus what "
                        "your variables, Out, the stored traceback and their autograd graphs "
                        "held")


def garbage_plausible(f: OomFacts) -> bool:
    """Whether a replaced traceback can be among the unreachable bytes: at the failure the
    previous error's traceback is still stored (and scanned), so an older error is needed;
    after the failure this error has replaced every earlier one."""
    return f.earlier_errors >= (2 if f.measured_at == "failure" else 1)


def _working_set(f: OomFacts, causes: Sequence[Cause], need: int | None) -> Cause:
    together = sum(c.nbytes or 0 for c in causes)
    if causes and need is not None and together + f.precision_bytes >= need:
        return Cause(
            CAUSE_WORKING_SET, together,
            f"No single cause frees the {format_bytes(need)} missing; together the ones below "
            "would.")
    missing = f" {format_bytes(need)} more than was free" if need is not None else " more"
    working = f.cell_bytes if f.cell_bytes is not None else f.computation_bytes
    own = (f" The failing cell had allocated {format_bytes(working)} of it since it started."
           if working else "")
    return Cause(
        CAUSE_WORKING_SET, need,
        f"The computation itself needs{missing}, and nothing gpumem_nb can see would free "
        f"enough: PyTorch's live tensors are the working set of the code that ran.{own}")


# ------------------------------------------------------------------------------------------
# The explanation
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Action:
    text: str
    nbytes: int | None = None  # what it would free, when known


@dataclass(frozen=True)
class SiteAtFailure:
    """An allocation site live at the failure (from ``%%gpumem --trace``)."""

    label: str
    nbytes: int


@dataclass(frozen=True)
class OomExplanation:
    facts: OomFacts
    causes: tuple[Cause, ...]
    actions: tuple[Action, ...]
    error: str  # the error's first line
    form: str  # which message format it was
    source: str  # where the numbers came from
    holders: tuple[Holder, ...] = ()
    sites_at_failure: tuple[SiteAtFailure, ...] = ()
    added_s: float = 0.0  # time the explainer added to the failing cell
    observer_s: float = 0.0  # of which spent in the allocator's observer
    notes: tuple[str, ...] = ()
    # Where the added time went, stage by stage ("observer", "read", "processes", "scan",
    # "classify", "dry_run"): the 50 ms budget is met on the GPU, where NVML and the
    # allocator cost what no fake shows, so the GPU tests print this.
    stage_s: dict[str, float] = field(default_factory=dict)

    def stages_text(self) -> str:
        return " ".join(f"{k} {v * 1e3:.1f}" for k, v in self.stage_s.items()) + " (ms)"

    @property
    def cause(self) -> str:
        return self.causes[0].kind if self.causes else CAUSE_UNKNOWN

    @property
    def verdict(self) -> str:
        return self.causes[0].summary if self.causes else ""

    def header(self) -> str:
        f = self.facts
        parts = [f"gpumem: CUDA out of memory on GPU {f.device}."]
        if f.requested_bytes is not None:
            parts.append(f"Asked {format_bytes(f.requested_bytes)};")
        if f.total_bytes is not None:
            parts.append(f"the GPU has {format_bytes(f.total_bytes)} in total, "
                         f"{format_bytes(f.free_bytes)} free"
                         + (f", {format_bytes(f.allowed_bytes)} allowed to this process"
                            if f.allowed_bytes is not None else "") + ".")
        if f.allocated_bytes is not None:
            split = f.unallocated_bytes
            cached = ""
            if split and f.pool_reuses_unallocated:
                cached = (f"; its cudaMallocAsync pool held {format_bytes(split)} more, unused, "
                          "which it reuses for new tensors (counted as room for this request)")
            elif split is not None:
                cached = (f" and {format_bytes(split)} reserved but unallocated"
                          + (" (it could not release that)" if split else ""))
            parts.append(f"PyTorch had {format_bytes(f.allocated_bytes)} allocated{cached}.")
        return " ".join(parts)

    def lines(self) -> list[str]:
        out = [self.header()]
        for i, c in enumerate(self.causes):
            out.append(("Cause: " if i == 0 else "Also: ") + c.summary)
            out.extend(f"    {d}" for d in c.details)
        if self.sites_at_failure:
            out.append("Live at the failure (from --trace), by allocation site:")
            out.extend(f"    {format_bytes(s.nbytes):>11}  {s.label}"
                       for s in self.sites_at_failure)
        if self.actions:
            out.append("What to do next:")
            out.extend(f"  - {a.text}" for a in self.actions)
        out.extend(self.notes)
        out.append(f"({self.source}; the explanation added {self.added_s * 1e3:.1f} ms.)")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        esc = html.escape
        body = [f"<div><b>{esc(self.header())}</b></div>"]
        for i, c in enumerate(self.causes):
            label = "Cause" if i == 0 else "Also"
            body.append(f"<div><b>{label}:</b> {esc(c.summary)}</div>")
            if c.details:
                body.append("<ul>" + "".join(f"<li>{esc(d)}</li>" for d in c.details)
                            + "</ul>")
        if self.sites_at_failure:
            body.append(html_table(
                ("live at the failure", "allocation site"),
                [[format_bytes(s.nbytes), s.label] for s in self.sites_at_failure]))
        if self.actions:
            body.append("<div><b>What to do next:</b></div><ul>"
                        + "".join(f"<li>{esc(a.text)}</li>" for a in self.actions) + "</ul>")
        body += [f"<div>{esc(n)}</div>" for n in self.notes]
        body.append(f"<div style='color:#777'>{esc(self.source)}; the explanation added "
                    f"{self.added_s * 1e3:.1f} ms.</div>")
        return ("<div class='gpumem-nb gpumem-oom' style='border-left:4px solid #d62728;"
                "padding-left:8px'>" + "".join(body) + "</div>")


def next_steps(facts: OomFacts, causes: Sequence[Cause], holders: Sequence[Holder],
               dry_run: CleanupReport | None) -> tuple[Action, ...]:
    """What to do, in the causes' order, with what each step would free. A step that would
    free less than 1% of what was missing (of the working set, when that is the verdict) is
    not listed."""
    f = facts
    kinds = [c.kind for c in causes]
    if CAUSE_IMPOSSIBLE in kinds:  # nothing else can help
        return (Action(
            "Make this one allocation smaller: process the data in chunks, lower the batch "
            "size or resolution, use bf16/fp16 or 8-bit weights, or shard across GPUs."),)
    verdict = causes[0] if causes else None
    dominant = verdict is not None and verdict.kind == CAUSE_WORKING_SET and verdict.covers
    out: list[Action] = []
    if dominant:
        out.append(_workload_action(f))
    for c in causes:
        if dominant and not c.covers and c.kind != CAUSE_HELD:
            continue  # it would not let the computation through
        if c.kind in (CAUSE_FRAGMENTATION, CAUSE_POOL) and not c.covers:
            continue  # its cure reclaims too little to matter here
        if c.kind == CAUSE_POOL:
            out.append(Action("%gpumem cleanup runs torch.cuda.empty_cache(), which returns the "
                              f"cudaMallocAsync pool's {format_bytes(c.nbytes)} of unused "
                              "memory to the driver; then run the cell again.", c.nbytes))
        elif c.kind == CAUSE_FRAGMENTATION:
            out.append(_fragmentation_action(f))
        elif c.kind == CAUSE_OTHER_PROCESSES:
            for p in sorted(f.other_processes, key=lambda p: -(p.nbytes or 0))[:5]:
                if p.child is not None:
                    out.append(Action(f"{p.label} holds {format_bytes(p.nbytes)}: "
                                      f"{child_advice(p.child)}", p.nbytes))
                    continue
                hint = ("shut that kernel down (JupyterLab: Running Terminals and Kernels)"
                        if "Jupyter kernel" in p.what else "stop it, or wait for it to end")
                out.append(Action(f"{p.label} holds {format_bytes(p.nbytes)}: {hint}.",
                                  p.nbytes))
        elif c.kind == CAUSE_OUTSIDE:
            out.append(Action(
                "Release what other libraries hold in this process (CuPy: "
                "cupy.get_default_memory_pool().free_all_blocks(); JAX: set "
                "XLA_PYTHON_CLIENT_PREALLOCATE=false before it starts).", c.nbytes))
        elif c.kind == CAUSE_HELD and c.details[:1] in ((UNREACHABLE,), (UNREACHABLE_AT_START,)):
            if garbage_plausible(f):
                out.append(Action("%gpumem cleanup runs gc.collect() first: it frees what a "
                                  "replaced traceback still holds, and reports how much.",
                                  c.nbytes))
            out.append(Action("%gpumem who --gc also searches every object the garbage "
                              "collector tracks, and names what holds these tensors.",
                              c.nbytes))
        elif c.kind == CAUSE_HELD and c.details and c.details[0].startswith("measured after"):
            what = ("%gpumem cleanup runs gc.collect(), which frees what the replaced "
                    "traceback still holds; then run the cell again."
                    if f.unreachable_bytes else
                    "Run the cell again: what the replaced traceback held is free now.")
            out.append(Action(what, c.nbytes))
        elif c.kind == CAUSE_HELD:
            out.extend(_held_actions(holders, f.device))
        elif c.kind == CAUSE_WORKING_SET and not dominant and not any(
                x.covers for x in causes[1:]):
            out.append(_workload_action(f))
    if not any(c.kind == CAUSE_HELD and c.details
               and c.details[0] not in (UNREACHABLE, UNREACHABLE_AT_START)
               and not c.details[0].startswith("measured after") for c in causes):
        out.extend(_held_actions(holders, f.device))  # small holders, still worth a line
    split = f.unallocated_bytes or 0
    if f.pool_reuses_unallocated and split >= _NOTABLE_BYTES and CAUSE_POOL not in kinds:
        # Not a cause (the pool could use it), but after an OOM the pool keeps what it grew
        # while trying, and only empty_cache gives that back to anyone else.
        out.append(Action(f"The cudaMallocAsync pool still holds {format_bytes(split)} unused "
                          "(part of it may be what it reserved while trying this request): "
                          "PyTorch reuses it, other processes and libraries cannot until "
                          "%gpumem cleanup runs torch.cuda.empty_cache().", split))
    scale = (verdict.nbytes if dominant and verdict is not None else None) or \
        f.shortfall_bytes or 0
    out = [a for a in out if a.nbytes is None or a.nbytes >= _WORTH_A_LINE * scale]
    if dry_run is not None:
        out.extend(_dry_run_actions(dry_run))
    return tuple(out)


def _workload_action(f: OomFacts) -> Action:
    text = ("Make the step smaller: a smaller batch or sequence length (activations grow with "
            "both), activation checkpointing (torch.utils.checkpoint), or bf16/fp16 autocast "
            "(torch.autocast)")
    if f.grad_enabled:
        text += ("; if this is inference, run it under torch.no_grad() or "
                 "torch.inference_mode(): autograd is on here, so every layer's activations "
                 "are kept for a backward pass")
    if f.cell_previous_peak_bytes:
        text += (f". Its last run peaked at {format_bytes(f.cell_previous_peak_bytes)} above "
                 "its start: size the step from what fitted")
    return Action(text + ".")


def child_advice(child: ChildProcess) -> str:
    """How to make one of this kernel's child processes let go of the GPU, by what it is.
    Advice only: gpumem_nb never signals or kills a process."""
    if child.role == ROLE_DATALOADER:
        return ("a DataLoader worker should hold no GPU memory; its Dataset or collate_fn "
                "creates CUDA tensors. Let the loop finish or del the loader's iterator (with "
                "persistent_workers=True the workers live as long as the DataLoader: del it), "
                "and move to the GPU in the main process.")
    if child.role == ROLE_LAUNCHED:
        return ("a distributed worker this kernel launched. Let the launch finish: the "
                "training function should end with torch.distributed.destroy_process_group(); "
                "if it hangs, interrupt the kernel, and the launcher stops its workers.")
    return ("release the object that started it, in this kernel: for an inference engine "
            "such as vLLM, del llm, then gc.collect() and "
            "torch.distributed.destroy_process_group(); for a multiprocessing pool, "
            "pool.close() and pool.join() (pool.terminate() if it hangs).")


def _held_actions(holders: Sequence[Holder], device: int) -> list[Action]:
    held = held_holders(holders, device)
    outs = [h for h in held if h.kind == "output cache"]
    out = []
    if len(outs) > 1:  # one line for the output cache: one command clears it all
        total = sum(h.held_bytes for h in outs)
        graphs = " with their graphs" if any(h.graph_bytes for h in outs) else ""
        names = ", ".join(h.name for h in outs[:4]) + (" and more" if len(outs) > 4 else "")
        out.append(Action(f"%gpumem cleanup --out clears {names} ({format_bytes(total)}"
                          f"{graphs}); end a line with `;` or assign its result, and Out will "
                          "not keep it.", total))
        held = [h for h in held if h.kind != "output cache"]
    return out + [Action(holder_action(h), h.held_bytes) for h in held[:5]]


def _fragmentation_action(f: OomFacts) -> Action:
    if not f.expandable_segments:
        return Action(
            "Restart the kernel with PYTORCH_ALLOC_CONF=expandable_segments:True set before "
            "torch starts CUDA (os.environ in the first cell, before import torch): a segment "
            "then maps and unmaps pages as needed, so memory freed inside it can be "
            "returned or reused for a larger block instead of staying stranded.")
    return Action(
        "expandable_segments is already on, so that setting will not help: free long-lived "
        "tensors made between large ones, or restart the kernel.")


def _dry_run_actions(report: CleanupReport) -> list[Action]:
    """``%gpumem cleanup --dry-run``'s estimates, as one line."""
    steps = {s.step: s for s in report.steps}
    parts = []
    tb = steps.get("last exception")
    if tb is not None and tb.freed_allocated_bytes:
        parts.append(f"{format_bytes(tb.freed_allocated_bytes)} held by this error's "
                     "traceback (the failed call's locals and their autograd graphs)")
    cache = steps.get("empty_cache")
    if cache is not None and cache.freed_reserved_bytes:
        parts.append(cache.brief or f"up to {format_bytes(cache.freed_reserved_bytes)} "
                     "returned by empty_cache")
    outs = steps.get("output cache")
    if outs is not None and outs.freed_allocated_bytes:
        parts.append(f"with --out, {format_bytes(outs.freed_allocated_bytes)} held by Out")
    if not parts:
        return []
    total = sum(x or 0 for x in (tb.freed_allocated_bytes if tb else 0,
                                  outs.freed_allocated_bytes if outs else 0))
    return [Action("%gpumem cleanup --dry-run estimates: " + "; ".join(parts) + ".",
                   total or None)]


# ------------------------------------------------------------------------------------------
# 3. The runtime: the observer, counting, explaining a failing cell
# ------------------------------------------------------------------------------------------
class OomHost(Protocol):
    """What the explainer needs from the monitor."""

    shell: Any
    source: Any

    def scan(self, include_gc: bool = False,
             graph_budget_s: float | None = None) -> list[Holder]: ...

    def read(self) -> Sample: ...

    def cleanup(self, request: CleanupRequest) -> CleanupReport: ...


class _Trampoline:
    """What PyTorch holds as the OOM observer: forwards to whichever handler the current load
    of gpumem_nb installed. PyTorch cannot detach observers, so this one object is registered
    once per process and only its ``handler`` changes across loads and reloads. Kept trivial
    on purpose: an instance made by an older copy of this module must keep working."""

    def __init__(self) -> None:
        self.handler: Callable[[int, int, int, int], None] | None = None

    def __call__(self, device: int, alloc: int, limit: int, free: int) -> None:
        handler = self.handler
        if handler is None:
            return
        # Raising here would replace the user's OOM with our error.
        with contextlib.suppress(BaseException):
            handler(device, alloc, limit, free)


@dataclass
class OomEvent:
    """The allocator's state when its observer fired: before the exception, every tensor
    still alive."""

    device: int
    requested_bytes: int
    limit_bytes: int  # the memory-fraction cap when set, else the device total
    free_bytes: int
    wall_s: float
    generation: int
    reading: AllocatorReading | None = None
    processes: list[tuple[int, int | None]] | None = None
    holders: tuple[Holder, ...] | None = None
    largest_free_block_bytes: int | None = None
    expandable_segments: bool | None = None
    grad_enabled: bool | None = None  # on the allocating thread (a backward runs on its own)
    cell: CellStart | None = None
    cost_s: float = 0.0
    stage_s: dict[str, float] = field(default_factory=dict)


def describe_pid(pid: int) -> str:
    """A few words about a process from /proc (same PID namespace only); "" if unknown."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return ""
    if not argv:
        return ""
    joined = " ".join(argv)
    if "ipykernel" in joined:
        conn = next((a for a in argv if a.endswith(".json")), "")
        name = os.path.basename(conn)[: -len(".json")] if conn else ""
        return "a Jupyter kernel" + (f" {name}" if name else "")
    # One line: a ``python -c`` script's newlines would break the explanation's lines; any
    # other control character (a terminal escape) is printed as its escape.
    text = printable(" ".join(" ".join([os.path.basename(argv[0]), *argv[1:3]]).split()))
    return text if len(text) <= 60 else text[:57] + "..."


def with_counted_ooms(sample: Sample, counts: Mapping[int, int]) -> Sample:
    """``sample`` with each device's OOM count at least what gpumem_nb counted itself: the
    cudaMallocAsync backend leaves ``num_ooms`` at 0."""
    devices = []
    for d in sample.devices:
        n = counts.get(d.index, 0)
        if d.allocator is not None and n > d.allocator.num_ooms:
            d = replace(d, allocator=replace(d.allocator, num_ooms=n))
        devices.append(d)
    return replace(sample, devices=tuple(devices))


@dataclass
class _Pieces:
    """Everything read for one explanation, gathered before classifying."""

    facts: OomFacts
    holders: tuple[Holder, ...]  # as scanned (the dry run reuses them)
    source: str
    # As judged: the failing call's own traceback set apart (kind KIND_FAILED_CALL).
    judged: tuple[Holder, ...] = ()
    observer_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    sample: Sample | None = None  # a full reading made after the failure, for the dry run
    stage_s: dict[str, float] = field(default_factory=dict)


class OomWatch:
    """One loaded extension's OOM explainer. ``on_cell_result`` is the only per-cell call."""

    def __init__(self, host: OomHost, torch: TorchDebug | None = None,
                 show: Callable[[Any], Any] = print,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.host = host
        self.torch = torch if torch is not None else TorchDebug()
        self.show = show
        self.clock = clock
        self.last: OomExplanation | None = None
        self.counts: dict[int, int] = {}
        self.events: deque[OomEvent] = deque(maxlen=32)
        self.observer_status = "not attached: CUDA is not initialized yet"
        self._observer: Any = None
        self._attach_tried = False
        self._closed = False
        self._generation = 0
        self._scanned_generation = -1
        self._previous_error = ""
        self._errors = 0  # cells that raised, since this load
        self._lock = threading.Lock()
        # More lines for the explanation, from features the caller sets per cell (the
        # allocator what-if of a traced cell). Given the facts; a hook that fails adds none.
        self.extra_lines: Callable[[OomFacts], Sequence[str]] | None = None

    # -- the observer ------------------------------------------------------------------------
    def ensure_attached(self) -> None:
        """Register the observer once CUDA is up; a no-op afterwards (one attribute check).
        Never after ``close``: the process-wide observer would keep an unloaded monitor
        alive (a ``%%gpumem`` cell that ran ``%unload_ext`` explains its own result after)."""
        if self._attach_tried or self._closed or not self.torch.initialized:
            return
        self._attach_tried = True
        observer, why = self.torch.oom_observer(_Trampoline)
        if observer is None:
            # torch's reason, up to its first sentence ("cudaMallocAsync does not yet
            # support attachOutOfMemoryObserver.")
            self.observer_status = f"not available: {why.split('. ')[0].rstrip('.')}"
            return
        observer.handler = self._on_oom
        self._observer = observer
        self.observer_status = "attached"

    def close(self) -> None:
        """Unload: the process keeps the registered observer; it stops calling us."""
        self._closed = True
        obs = self._observer
        if obs is not None and getattr(obs, "handler", None) == self._on_oom:
            obs.handler = None
        self._observer = None

    def _on_oom(self, device: int, alloc: int, limit: int, free: int) -> None:
        """Inside the allocator's OOM path, before the exception: read what only exists now.
        Several can fire for one cell (cuDNN retries smaller workspaces); the session is
        scanned once per cell."""
        t0 = self.clock()
        with self._lock:
            self.counts[device] = self.counts.get(device, 0) + 1
            generation = self._generation
            scan = self._scanned_generation != generation
            self._scanned_generation = generation
        event = OomEvent(device=device, requested_bytes=int(alloc), limit_bytes=int(limit),
                         free_bytes=int(free), wall_s=time.time(), generation=generation)
        event.reading = self.torch.read(device)
        event.grad_enabled = self.torch.grad_enabled()
        event.cell = self._cell_start(device)
        t = self.clock()
        event.stage_s["observer_read"] = t - t0
        event.processes = self._processes(device)
        event.stage_s["observer_processes"] = self.clock() - t
        if scan:
            t = self.clock()
            event.holders = tuple(self.host.scan(graph_budget_s=EXPLAIN_GRAPH_BUDGET_S))
            event.stage_s["observer_scan"] = self.clock() - t
        if not self.torch.history_enabled() and \
                self.torch.allocator_backend() != "cudaMallocAsync":
            # Without recorded history the snapshot is just segments and blocks: cheap. The
            # async pool has no segments to read a fragmentation verdict from.
            t = self.clock()
            snap, _ = self.torch.memory_snapshot()
            if snap is not None:
                event.largest_free_block_bytes, event.expandable_segments = \
                    _segment_facts(snap, device)
            event.stage_s["observer_segments"] = self.clock() - t
        event.cost_s = self.clock() - t0
        self.events.append(event)

    def _cell_start(self, device: int) -> CellStart | None:
        fn = getattr(self.host, "cell_start", None)
        if fn is None:
            return None
        try:
            start: CellStart | None = fn(device)
            return start
        except Exception:
            return None

    def _processes(self, device: int) -> list[tuple[int, int | None]] | None:
        src = self.host.source
        nvml = getattr(src, "nvml", None)
        ids = src.device_ids() if hasattr(src, "device_ids") else []
        if nvml is None or not hasattr(nvml, "processes") or device >= len(ids):
            return None
        gate = getattr(self.host, "read_gate", None)
        if gate is not None and gate.hung_s() is not None:
            return None  # NVML hangs (sources/gate.py): this call would hang the cell with it
        try:
            result: list[tuple[int, int | None]] | None = nvml.processes(ids[device])
            return result
        except Exception:
            return None

    # -- per cell ----------------------------------------------------------------------------
    def on_cell_result(self, result: Any,
                       sites: Sequence[SiteAtFailure] = ()) -> OomExplanation | None:
        """Called once per finished cell. Costs nothing unless the cell raised a CUDA OOM."""
        self.ensure_attached()
        generation = self._generation
        with self._lock:
            self._generation += 1
        err = getattr(result, "error_in_exec", None)
        if not userexc.is_exception(err):
            self._previous_error = ""
            return None
        earlier, self._errors = self._errors, self._errors + 1
        previous, self._previous_error = self._previous_error, \
            f"{userexc.type_name(err)}: {first_line(error_str(err), 120)}"[:120]
        oom = find_cuda_oom(err)
        if oom is None:
            return None
        t0 = self.clock()
        explanation = self.explain(oom, generation=generation, previous_error=previous,
                                   sites=sites, cell_error=err, earlier_errors=earlier)
        explanation = replace(explanation, added_s=self.clock() - t0 + explanation.observer_s)
        self.last = explanation
        self.show(explanation)
        return explanation

    def explain(self, exc: BaseException, *, generation: int | None = None,
                previous_error: str = "", sites: Sequence[SiteAtFailure] = (),
                cell_error: BaseException | None = None,
                earlier_errors: int = 0) -> OomExplanation:
        text = error_str(exc)
        msg = parse_oom_message(text) or OomMessage(FORM_UNKNOWN)
        event = self._event_for(msg, generation)
        if event is None:
            # The observer did not see it (cudaMallocAsync, or before it was attached).
            device = msg.device if msg.device is not None else 0
            with self._lock:
                self.counts[device] = self.counts.get(device, 0) + 1
            pieces = self._from_message(msg, previous_error, cell_error or exc)
        else:
            pieces = self._from_event(event, msg)
        if earlier_errors:
            pieces.facts = replace(pieces.facts, earlier_errors=earlier_errors)
        stages = pieces.stage_s
        t = self.clock()
        causes = classify(pieces.facts, pieces.judged)
        stages["classify"] = self.clock() - t
        t = self.clock()
        try:
            dry = self.host.cleanup(self._dry_run_request(pieces, event))
        except Exception:
            dry = None
        stages["dry_run"] = self.clock() - t
        extra = self._extra_lines(pieces.facts, stages)
        if msg.form == FORM_DRIVER:
            pieces.notes.append(
                "This error comes from CUDA or a CUDA library, not from PyTorch's allocator: "
                "memory ran out outside the caching allocator (creating the CUDA context, a "
                "library's own allocation such as cuBLAS or cuDNN creating its handle, CuPy, "
                "JAX, NCCL or a custom cudaMalloc).")
        return OomExplanation(
            facts=pieces.facts, causes=causes,
            actions=next_steps(pieces.facts, causes, pieces.judged, dry),
            error=first_line(text, 300) or userexc.type_name(exc),
            form=msg.form, source=pieces.source, holders=pieces.holders,
            sites_at_failure=tuple(sites), observer_s=pieces.observer_s,
            notes=tuple(pieces.notes) + extra, stage_s=stages)

    def _extra_lines(self, facts: OomFacts, stages: dict[str, float]) -> tuple[str, ...]:
        hook = self.extra_lines
        if hook is None:
            return ()
        t = self.clock()
        try:
            return tuple(line for line in hook(facts) if line)
        except Exception:
            return ()
        finally:
            stages["extra"] = self.clock() - t

    def _dry_run_request(self, pieces: _Pieces, event: OomEvent | None) -> CleanupRequest:
        """The in-cell ``cleanup --dry-run``, reusing what was already read after the failure.

        Without the observer, the scan and the full reading were both made after the failure,
        exactly what the dry run would make again: they are handed over. The observer's scan
        is from before the exception unwound (the failing call's locals were live then, and
        the stored exception was the previous cell's), so after it the dry run still scans;
        only its reading is the cheap allocator-and-host one: its estimates use allocator
        figures only, never NVML's."""
        if event is None:
            return CleanupRequest(dry_run=True, clear_output=True, reuse_sample=pieces.sample,
                                  reuse_holders=pieces.holders)
        hot = getattr(self.host, "read_hot", None)
        sample: Sample | None = None
        if hot is not None:
            try:
                sample = hot()
            except Exception:
                sample = None
        return CleanupRequest(dry_run=True, clear_output=True, reuse_sample=sample,
                              graph_budget_s=EXPLAIN_GRAPH_BUDGET_S)

    def _event_for(self, msg: OomMessage, generation: int | None) -> OomEvent | None:
        """The observer's record of this error: the latest event of this cell that matches
        the message's device and size (the message prints sizes rounded)."""
        for ev in reversed(self.events):
            if generation is not None and ev.generation != generation:
                continue
            if msg.device is not None and ev.device != msg.device:
                continue
            if msg.requested_bytes is not None and abs(
                    ev.requested_bytes - msg.requested_bytes) > msg.precision_bytes + 1:
                continue
            return ev
        return None

    def _idle_bytes(self, device: int) -> int | None:
        """The source's measure of the CUDA context on ``device`` (``LiveSource``), if any."""
        known = getattr(self.host.source, "idle_process_bytes", None)
        value = known.get(device) if isinstance(known, Mapping) else None
        return value if isinstance(value, int) else None

    def _expandable(self, seen: bool | None) -> bool:
        if seen is not None:
            return seen
        return "expandable_segments:true" in alloc_conf()[0].replace(" ", "").lower()

    def _processes_facts(self, listed: Sequence[tuple[int, int | None]] | None,
                         from_message: Sequence[tuple[int, int | None]] = (),
                         this_from_message: int | None = None, *, ours_expected: bool,
                         ) -> tuple[int | None, tuple[ProcessUse, ...], bool]:
        """(this process's bytes, the others, whether the others are unknown)."""
        me = os.getpid()
        if listed is None:
            others = self._uses(from_message)
            return this_from_message, others, not from_message and this_from_message is None
        mine = [n for p, n in listed if p == me]
        if not mine and (ours_expected or any(
                not os.path.exists(f"/proc/{p}") for p, _ in listed)):
            # PyTorch holds memory here, yet our PID is not listed, or the PIDs do not exist
            # here: NVML shows another PID namespace (a container), so no listed process can
            # be told apart from this one.
            return None, (), True
        this = sum(n or 0 for n in mine) if mine and None not in mine else None
        others = self._uses([(p, n) for p, n in listed if p != me])
        return this, others, False

    def _uses(self, listed: Sequence[tuple[int, int | None]]) -> tuple[ProcessUse, ...]:
        """The other processes, this kernel's children named as such. Read on demand (the
        failed cell only): a few small /proc reads per listed process."""
        tree = getattr(self.host.source, "processes", None)
        children: dict[int, ChildProcess] = {}
        if tree is not None and listed and all(os.path.exists(f"/proc/{p}") for p, _ in listed):
            try:
                children = {c.pid: c for c in tree.children_of(listed)}
                unknown = roles_to_learn(children.values())
                if unknown and tree.learn_roles(unknown):
                    children = {c.pid: c for c in tree.children_of(listed)}
            except Exception:
                children = {}
        return tuple(ProcessUse(p, n, describe_pid(p) if p not in children else "",
                                child=children.get(p)) for p, n in listed)

    def _from_event(self, ev: OomEvent, msg: OomMessage) -> _Pieces:
        r = ev.reading
        total = self.torch.device_total_bytes(ev.device) or msg.total_bytes
        fraction = self.torch.memory_fraction(ev.device)
        allowed = msg.allowed_bytes
        if fraction is not None and fraction < 1.0:
            allowed = ev.limit_bytes
        t = self.clock()
        this, others, unknown = self._processes_facts(
            ev.processes, msg.other_processes, msg.this_process_bytes,
            ours_expected=bool(r and r.reserved_bytes))
        named_s = self.clock() - t
        holders = ev.holders
        if holders is None:  # a second OOM in the same cell: reuse the first one's scan
            holders = next((e.holders for e in reversed(self.events)
                            if e.generation == ev.generation and e.holders is not None), ())
        facts = OomFacts(
            device=ev.device, requested_bytes=ev.requested_bytes, total_bytes=total,
            free_bytes=ev.free_bytes, allowed_bytes=allowed,
            unreachable_bytes=_unaccounted_at_start(ev.cell, holders, ev.device),
            allocated_bytes=r.allocated_bytes if r else msg.allocated_bytes,
            reserved_bytes=r.reserved_bytes if r else msg.reserved_total_bytes,
            this_process_bytes=this, other_processes=others, others_unknown=unknown,
            backend=self.torch.allocator_backend() or "native",
            expandable_segments=self._expandable(ev.expandable_segments),
            largest_free_block_bytes=ev.largest_free_block_bytes,
            private_pool_bytes=msg.private_pool_bytes, measured_at="failure",
            grad_enabled=ev.grad_enabled, idle_process_bytes=self._idle_bytes(ev.device),
            **_cell_facts(ev.cell, r.allocated_bytes if r else msg.allocated_bytes))
        stages = {"observer": ev.cost_s}
        stages.update(ev.stage_s)
        stages["children"] = named_s  # naming the other processes (this kernel's children)
        return _Pieces(facts=facts, holders=tuple(holders), judged=tuple(holders),
                       source="Measured at the failure by the allocator's OOM observer",
                       observer_s=ev.cost_s, notes=self._unknown_note(unknown),
                       stage_s=stages)

    def _from_message(self, msg: OomMessage, previous_error: str,
                      error: BaseException) -> _Pieces:
        device = msg.device if msg.device is not None else 0
        stages: dict[str, float] = {}
        t = self.clock()
        now = self.host.read()
        stages["read"] = self.clock() - t
        d = now.device(device)
        al = d.allocator if d is not None else None
        backend = self.torch.allocator_backend() or (
            "cudaMallocAsync" if msg.form == FORM_ASYNC else "native")
        t = self.clock()
        listed = self._processes(device)
        stages["processes"] = self.clock() - t
        t = self.clock()
        this, others, unknown = self._processes_facts(
            listed, msg.other_processes, msg.this_process_bytes,
            ours_expected=bool(al and al.reserved_bytes))
        stages["children"] = self.clock() - t
        if this is None and d is not None and d.nvml is not None:
            this = d.nvml.process_bytes
        allocated = msg.allocated_bytes if msg.allocated_bytes is not None else (
            al.allocated_bytes if al else None)
        reserved = msg.reserved_total_bytes
        if reserved is None and al is not None:
            # The async message has no reservation: the pool's, read now, stands in.
            reserved = max(al.reserved_bytes, allocated or 0)
        released = unreachable = None
        t = self.clock()
        holders = tuple(self.host.scan(graph_budget_s=EXPLAIN_GRAPH_BUDGET_S))
        stages["scan"] = self.clock() - t
        judged = _failed_call_apart(holders, error)
        failed = [h for h in judged if h.kind == KIND_FAILED_CALL
                  and h.device in (f"cuda:{device}", "cuda")]
        computation = sum(h.held_bytes for h in failed) if failed else None
        # A failed call whose tensors carry graphs ran with autograd on; without graphs it
        # may have run under no_grad, or made nothing yet: unknown.
        grad = True if any(h.holds_graph for h in failed) else None
        if al is not None:
            if msg.allocated_bytes is not None:
                released = max(msg.allocated_bytes - al.allocated_bytes, 0)
            reachable = sum(h.held_bytes for h in held_holders(judged, device)) + \
                (computation or 0)
            unreachable = max(al.allocated_bytes - reachable, 0)
        total = self.torch.device_total_bytes(device) or msg.total_bytes  # exact, not printed
        facts = OomFacts(
            device=device, requested_bytes=msg.requested_bytes, total_bytes=total,
            free_bytes=msg.free_bytes, allowed_bytes=msg.allowed_bytes,
            allocated_bytes=allocated, reserved_bytes=reserved, this_process_bytes=this,
            other_processes=others, others_unknown=unknown, backend=backend,
            expandable_segments=self._expandable(None),
            private_pool_bytes=msg.private_pool_bytes, precision_bytes=msg.precision_bytes,
            measured_at="after", released_since_bytes=released,
            unreachable_bytes=unreachable, previous_error=previous_error,
            computation_bytes=computation, grad_enabled=grad,
            idle_process_bytes=self._idle_bytes(device),
            **_cell_facts(self._cell_start(device), allocated))
        why = f"OOM observer {self.observer_status}" \
            if self.observer_status != "attached" else "the OOM observer did not see this one"
        notes = self._unknown_note(unknown)
        return _Pieces(facts=facts, holders=holders, judged=judged,
                       source=f"From the error message and readings after it ({why})",
                       notes=notes, sample=now, stage_s=stages)

    @staticmethod
    def _unknown_note(unknown: bool) -> list[str]:
        if not unknown:
            return []
        return ["NVML could not attribute GPU memory to processes here (another PID "
                "namespace, such as a container, or no NVML), so other processes and memory "
                "outside PyTorch are not shown."]

    def no_oom_line(self) -> str:
        seen = sum(self.counts.values())
        caught = f" ({seen} caught by your own code, none reached a cell)" if seen else ""
        return (f"gpumem: no CUDA out-of-memory error has reached a cell yet{caught}. "
                f"OOM observer: {self.observer_status}.")


def _segment_facts(snapshot: Mapping[str, Any], device: int) -> tuple[int | None, bool | None]:
    """(largest free block inside PyTorch's segments, expandable segments on) from a
    snapshot taken at the failure."""
    largest: int | None = None
    expandable: bool | None = None
    for seg in snapshot.get("segments", ()):
        if seg.get("device", device) != device:
            continue
        if seg.get("is_expandable"):
            expandable = True
        for b in seg.get("blocks", ()):
            if b.get("state") == "inactive":
                largest = max(largest or 0, int(b.get("size", 0)))
    settings = snapshot.get("allocator_settings")
    if isinstance(settings, Mapping) and "expandable_segments" in settings:
        expandable = bool(settings["expandable_segments"]) or bool(expandable)
    return largest, expandable


# The explainer's two scans (in the observer, then the dry run after the failure) each get this
# long for autograd graphs, so that the whole explanation stays within its 50 ms.
EXPLAIN_GRAPH_BUDGET_S = 0.015


def _cell_facts(cell: CellStart | None, allocated: int | None) -> dict[str, Any]:
    """The failing cell's working-set facts, from its start and PyTorch's allocated bytes at
    the failure."""
    if cell is None:
        return {}
    own = None
    if cell.allocated_bytes is not None and allocated is not None:
        own = max(allocated - cell.allocated_bytes, 0)
    return {"cell_bytes": own, "cell_start_bytes": cell.allocated_bytes,
            "cell_previous_peak_bytes": cell.previous_peak_bytes,
            "cell_previous_peak_exact": cell.previous_peak_exact}


def _unaccounted_at_start(cell: CellStart | None, holders: Sequence[Holder],
                          device: int) -> int | None:
    """At the failure: what PyTorch had allocated when the failing cell started that none of
    the session's holders keeps (they are scanned at the failure, so they also hold what the
    cell stored: that can only make this smaller). Unknown when a holder's graph was not
    sized in full, which would make it larger than it is."""
    if cell is None or cell.allocated_bytes is None:
        return None
    held = held_holders(holders, device)
    if any(h.graph_bytes_capped or h.graph_unsized or (h.holds_graph and h.graph_bytes is None)
           for h in held):
        return None
    return max(cell.allocated_bytes - sum(h.held_bytes for h in held), 0)


def _failed_call_apart(holders: Sequence[Holder], error: BaseException) -> tuple[Holder, ...]:
    """The holders, with the failing call's own traceback marked as such: when the stored
    exception is this error, its frames' locals are the computation's working set (under
    cudaMallocAsync the explanation comes after the exception unwound), not memory the
    session keeps."""
    stored = last_value()
    if not isinstance(stored, BaseException) or not any(
            e is error for e in exception_chain(stored)):
        return tuple(holders)
    return tuple(replace(h, kind=KIND_FAILED_CALL) if h.kind == "traceback" else h
                 for h in holders)
