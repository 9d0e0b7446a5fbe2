"""The causes, most specific first, decided from measured numbers (the message only fills
gaps): impossible on this GPU, a memory pool other than the default, fragmentation, other
processes, this process outside PyTorch, memory held by things the user can let go of, the
failing computation itself."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from ..analysis import held_text
from ..model import (
    Holder,
)
from ..units import format_bytes
from .facts import POOL_USER, OomFacts, PoolUse
from .message import GiB, MiB

__all__ = [
    "CAUSE_FRAGMENTATION",
    "CAUSE_GARBAGE",
    "CAUSE_HELD",
    "CAUSE_IMPOSSIBLE",
    "CAUSE_OTHER_PROCESSES",
    "CAUSE_OUTSIDE",
    "CAUSE_POOL",
    "CAUSE_PRIVATE_POOL",
    "CAUSE_UNKNOWN",
    "CAUSE_WORKING_SET",
    "CONTEXT_ALLOWANCE_BYTES",
    "KIND_FAILED_CALL",
    "KIND_GARBAGE",
    "KIND_RUNNING",
    "OTHER_POOL_CACHE",
    "RAW_POINTERS",
    "UNREACHABLE",
    "UNREACHABLE_AT_START",
    "Cause",
    "cell_working_set_bytes",
    "classify",
    "frozen_text",
    "garbage_holders",
    "garbage_plausible",
    "held_holders",
    "pool_owner_text",
]

CAUSE_IMPOSSIBLE = "impossible"
CAUSE_FRAGMENTATION = "fragmentation"
CAUSE_PRIVATE_POOL = "memory pool"
CAUSE_POOL = "cached by the cudaMallocAsync pool"
CAUSE_OTHER_PROCESSES = "other processes"
CAUSE_OUTSIDE = "outside PyTorch"
CAUSE_HELD = "held by your session"
CAUSE_GARBAGE = "garbage in reference cycles"
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
# The running backward's own root and saved inputs (site.py): the computation, too.
KIND_RUNNING = "running backward"
# Found by the retention search but no holder a user lets go of by name: garbage is its own
# cause, and what Python cannot see or the search did not reach is never one.
KIND_GARBAGE = "garbage"
_NOT_HELD = (KIND_FAILED_CALL, KIND_RUNNING, KIND_GARBAGE, "unseen", "not searched")
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


def garbage_holders(holders: Iterable[Holder], device: int) -> list[Holder]:
    """Reference cycles nothing reaches, on ``device``, that hold tensors."""
    return [h for h in holders if h.device in (f"cuda:{device}", "cuda")
            and h.kind == KIND_GARBAGE and h.held_bytes > 0]


def held_holders(holders: Iterable[Holder], device: int) -> list[Holder]:
    """What the session holds on ``device`` (with their graphs), the accidental holders (Out,
    a traceback) first; the failing call's own locals are the computation's, not listed."""
    on = [h for h in holders if h.device in (f"cuda:{device}", "cuda") and h.held_bytes > 0
          and h.kind not in _NOT_HELD]
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
    if f.larger_than_gpu:
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

    for pool in sorted(f.pools, key=lambda p: -p.reserved_bytes):
        if covers(pool.reserved_bytes) or pool.reserved_bytes >= _NOTABLE_BYTES:
            causes.append(_pool_cause(pool, covers(pool.reserved_bytes)))
    split = f.unallocated_bytes
    if f.pool_reuses_unallocated:
        if need is not None and need <= slack and split:
            # Never the cause: PyTorch's cudaMallocAsync backend lets the driver
            # reuse memory freed on other streams (internal dependencies and opportunistic
            # reuse, both enabled in CUDAMallocAsyncAllocator.cpp) and the pool stitches freed
            # pieces (the H200 served 2 GiB from 1 GiB holes), and no recipe on the H200 left
            # the pool unable to serve a request its unused memory would fit; the one real
            # workload that was called so (generate(), 39 GiB unused) was its working set.
            causes.append(Cause(
                CAUSE_POOL, split,
                f"The cudaMallocAsync pool held {format_bytes(split)} it was not using; the "
                "driver reuses it for this process's requests, so it is room this request "
                "could use, not what failed. torch.cuda.empty_cache() gives it back to the "
                "driver for other processes.", covers=False))
    elif split and _free_piece_fits(f) and (covers(split) or split >= _NOTABLE_BYTES):
        causes.append(_other_pool_cache(f, split, covers(split)))
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
        #
        # The scale is the whole room the allocator had at the failure (``_room_bytes``), not
        # the stranded bytes alone: under cudaMallocAsync the pool's unused bytes also hold
        # what was free on the GPU (the pool keeps what it grew trying the failed request),
        # so only the room, free and stranded together, counts the same bytes on every
        # backend (H200, generate_batch_too_big: 96.5 GiB grown against a 41.6 GiB pool).
        causes = [_demoted(c, f) if c.kind == CAUSE_FRAGMENTATION and c.covers
                  and grown >= min(_DWARFS * (c.nbytes or 0), _room_bytes(f, c))
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
        session = sum(h.held_bytes for h in held_holders(holders, f.device)) + \
            sum(h.held_bytes for h in garbage_holders(holders, f.device)) + \
            (f.collected_bytes or 0)
        own = min(own, max(f.allocated_bytes - session, 0))
    return max(own, f.computation_bytes or 0)


def _dominant_working_set(f: OomFacts, causes: Sequence[Cause], holders: Sequence[Holder],
                          need: int | None) -> Cause | None:
    working = cell_working_set_bytes(f, holders)
    if working is None or need is None or working < max(need, _NOTABLE_BYTES):
        return None
    biggest = max(causes, key=lambda c: c.nbytes or 0, default=None)
    other = (biggest.nbytes or 0) if biggest is not None else 0
    # Stranded bytes already judged against the computation (demoted: usable, they would let
    # only a few more requests through) are no rival to it.
    rival = max((c.nbytes or 0 for c in causes
                 if c.covers or c.kind not in (CAUSE_FRAGMENTATION, CAUSE_POOL)), default=0)
    if working < _DWARFS * rival:
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


def _room_bytes(f: OomFacts, stranded: Cause) -> int:
    """The room the allocator had at the failure were the stranded bytes usable: what CUDA
    had free plus those bytes (under cudaMallocAsync the headroom already counts the pool's
    unused bytes)."""
    return (f.headroom_bytes or 0) + (0 if f.pool_reuses_unallocated else stranded.nbytes or 0)


def _requests_served(f: OomFacts, stranded: Cause) -> int:
    """How many requests of the failing size the stranded bytes, were they usable, and the
    room the allocator had besides would have served."""
    return _room_bytes(f, stranded) // max(f.requested_bytes or 0, 1)


def _demoted(c: Cause, f: OomFacts) -> Cause:
    if not c.covers:
        return c
    if c.kind == CAUSE_FRAGMENTATION:  # the pool's unused bytes never cover
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


def pool_owner_text(pool: PoolUse) -> str:
    if pool.kind == POOL_USER:
        return f"a torch.cuda.MemPool{f' ({pool.owner})' if pool.owner else ''}"
    if pool.owner:
        return f"the CUDA graph {pool.owner}"
    if pool.graph_trees:
        return "torch.compile(mode=\"reduce-overhead\")'s CUDA graph trees (or a CUDA graph)"
    return "a CUDA graph (torch.cuda.graph / CUDAGraph)"


def _pool_cause(pool: PoolUse, covering: bool) -> Cause:
    """Memory in a private pool: its own cause, never fragmentation. Its free blocks serve
    only the pool's own allocations (a graph's replays), and empty_cache cannot return them
    while the pool's owner lives."""
    return Cause(
        CAUSE_PRIVATE_POOL, pool.reserved_bytes,
        f"A private memory pool holds {format_bytes(pool.reserved_bytes)}: the pool of "
        f"{pool_owner_text(pool)} (pool id {pool.pool_id}), {format_bytes(pool.free_bytes)} of it "
        f"free but usable only by that pool's own allocations, "
        f"{format_bytes(pool.allocated_bytes)} its tensors. torch.cuda.empty_cache() cannot "
        "release it while its owner lives; expandable segments would not help.",
        covers=covering,
        details=(f"segments with segment_pool_id {pool.pool_id} in the allocator's snapshot "
                 "at the failure",))


# What the allocator may round a request up to, and more: a free piece at least this much
# larger than the request would have served it from the same pool.
_ROUNDING_BYTES = 20 * 2**20
OTHER_POOL_CACHE = ("a free piece of PyTorch's cache larger than the request, at the failure: "
                    "it is in a pool this request does not draw from")


def _free_piece_fits(f: OomFacts) -> bool:
    """A default-pool request would have been served: by a free piece larger than it, or by
    the wholly free segments the native allocator releases and retries with (with what CUDA
    had free). Not under expandable segments, whose pages are unmapped differently."""
    largest, req = f.largest_free_block_bytes, f.requested_bytes
    if req is None:
        return False
    if largest is not None and largest >= req + _ROUNDING_BYTES:
        return True
    idle = f.idle_segments_bytes
    return (not f.expandable_segments and idle is not None and f.free_bytes is not None
            and f.allowed_bytes is None and idle + f.free_bytes >= req + _ROUNDING_BYTES)


def _other_pool_cache(f: OomFacts, split: int, covering: bool) -> Cause:
    """A free cached piece larger than the request did not serve it: the request drew from
    another pool (an allocation under ``torch.cuda.use_mem_pool`` or a CUDA graph's capture),
    which PyTorch does not let reclaim the default pool's cached blocks (pytorch#159674)."""
    return Cause(
        CAUSE_PRIVATE_POOL, split,
        f"PyTorch's cache held {format_bytes(split)} free, enough for the "
        f"{format_bytes(f.requested_bytes)} asked (in one piece as large, or in segments "
        "holding no tensor, which the allocator releases before it fails), yet not used for "
        "it. The request drew from "
        "another memory pool than the one caching that memory (an allocation under "
        "torch.cuda.use_mem_pool, or a CUDA graph's capture): a pool does not take another "
        "pool's cached blocks, and PyTorch does not release them for it. (With "
        "max_split_size_mb set, a cached block over that size is not split for a smaller "
        "request either.)",
        covers=covering, details=(OTHER_POOL_CACHE,))


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
            head + " (your variables, Out, the stored traceback, the objects inside them "
            "and the autograd graphs behind them): "
            + (frozen_text(f.frozen_objects) if f.frozen_objects > 0 else "")
            + "the scan did not find their holder, such "
            "as a class-level attribute, a module's globals, an exception kept in a "
            "variable, or a C extension's own references"
            + (", or the traceback of an earlier error that a later one replaced, waiting "
               "for the garbage collector (IPython's frames keep it in a reference cycle)"
               if garbage_plausible(f) else "") + "."
            + (" The scan was cut short by its time or object bounds, so part of these bytes "
               "may be the holders' own: this is a remainder, not a cause." if f.walk_capped
               else ""),
            # An uncounted remainder is never the verdict.
            covers=covers(unreachable) and not f.walk_capped,
            details=(UNREACHABLE_AT_START if at_start else UNREACHABLE,)))
    named = [b for b in f.raw_blocks if b.path]
    raw = sum(b.size_bytes for b in named)
    if named and (covers(raw) or raw >= _NOTABLE_BYTES):
        where = sorted({b.path for b in named})
        out.append(Cause(
            CAUSE_HELD, raw,
            f"{format_bytes(raw)} is in {len(named)} raw allocation"
            f"{'s' if len(named) != 1 else ''} that the allocator still holds: blocks no "
            "tensor lies over, whose addresses are kept as ints in "
            + ", ".join(where[:3]) + (f" and {len(where) - 3} more" if len(where) > 3 else "")
            + " (torch.cuda.caching_allocator_alloc, or an extension using PyTorch's "
            "allocator). Only torch.cuda.caching_allocator_delete frees them.",
            covers=covers(raw),
            details=(RAW_POINTERS, *(f"{b.address:#x}: {format_bytes(b.size_bytes)}, its "
                                     f"address kept in {b.path}" for b in named[:10]))))
    garbage = garbage_holders(holders, f.device)
    collected = f.collected_bytes or 0
    waste = sum(h.held_bytes for h in garbage) + collected
    if (garbage or collected) and (covers(waste) or waste >= _NOTABLE_BYTES):
        classes = sorted({c for h in garbage for c in h.classes})
        kinds = f" ({', '.join(classes)})" if classes else ""
        how: list[str] = []
        if garbage:
            how.append("found at the failure by walking every tensor's referrers up: no path "
                       "reaches a variable, module, class, thread or the output cache, and "
                       "each object's reference count is what the cycle's own references "
                       "explain")
        if collected:
            how.append(f"{format_bytes(collected)} of it measured: Python's garbage "
                       f"collector freed it between the failure and this explanation "
                       f"({f.collections} collection{'s' if f.collections != 1 else ''}, "
                       "PyTorch's allocated bytes before and after each)")
        out.append(Cause(
            CAUSE_GARBAGE, waste,
            f"{format_bytes(waste)} was garbage: tensors kept only by reference cycles{kinds} "
            "that nothing reaches, which Python's garbage collector had not collected yet. "
            "PyTorch does not run the collector before it raises, so the cycles' tensors "
            "count against this request.",
            covers=covers(waste), details=tuple(how)))
    held = held_holders(holders, f.device)
    total = sum(h.held_bytes for h in held)
    if held and (covers(total) or total >= _NOTABLE_BYTES):
        when = "at the failure" if f.measured_at == "failure" else "now"
        out.append(Cause(
            CAUSE_HELD, total,
            f"Your session holds {format_bytes(total)} on this GPU ({when}) in things you can "
            "let go of: " + ", ".join(f"{h.label} {held_text(h)}" for h in held[:5])
            + (f" and {len(held) - 5} more" if len(held) > 5 else "") + ".",
            covers=covers(total),
            details=tuple(f"{h.label} ({h.kind}): {held_text(h)}"
                          + (f", {h.detail}" if h.detail else "") for h in held[:10])))
    return out


UNREACHABLE = ("allocated now, minus what your variables, Out, the stored traceback and their "
               "autograd graphs hold")
RAW_POINTERS = ("from the allocator's segments after the failure: allocated blocks that no "
                "tensor, storage or capsule lies over, with an int equal to each one's address")
UNREACHABLE_AT_START = ("measured at the failure: allocated when this cell started, minus what "
                        "your variables, Out, the stored traceback and their autograd graphs "
                        "held")


def frozen_text(count: int) -> str:
    """Where unfound bytes most likely are when ``gc.freeze()`` has run: its objects are in
    the permanent generation, which neither the collector nor the search (``gc.get_objects``,
    ``gc.get_referrers``) sees. They may be garbage or live objects: either way only
    ``gc.unfreeze()`` puts them back in view."""
    return (f"the likely place is the {count:,} objects frozen by gc.freeze(), out of the "
            "collector's and the search's view (gc.collect() never frees them, garbage "
            "cycles among them included); else ")


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


