"""The explanation and what to do next: one step per cause, with what each would free."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..analysis import holder_advice
from ..cleanup import CleanupReport
from ..ledger import Ledger
from ..model import (
    ROLE_DATALOADER,
    ROLE_LAUNCHED,
    ChildProcess,
    Holder,
)
from ..report import Shown, html_table
from ..units import format_bytes
from .causes import (
    _NOTABLE_BYTES,
    _WORTH_A_LINE,
    CAUSE_FRAGMENTATION,
    CAUSE_GARBAGE,
    CAUSE_HELD,
    CAUSE_IMPOSSIBLE,
    CAUSE_OTHER_PROCESSES,
    CAUSE_OUTSIDE,
    CAUSE_POOL,
    CAUSE_PRIVATE_POOL,
    CAUSE_UNKNOWN,
    CAUSE_WORKING_SET,
    OTHER_POOL_CACHE,
    RAW_POINTERS,
    UNREACHABLE,
    UNREACHABLE_AT_START,
    Cause,
    garbage_holders,
    garbage_plausible,
    held_holders,
)
from .facts import POOL_USER, OomFacts, PoolUse
from .forms import OomForm
from .rawpart import raw_lines

__all__ = [
    "GC_NOTE_BYTES",
    "Action",
    "OomExplanation",
    "SiteAtFailure",
    "child_advice",
    "collected_line",
    "form_actions",
    "next_steps",
    "pool_action",
]


@dataclass(frozen=True)
class Action:
    text: str
    nbytes: int | None = None  # what it would free, when known
    # The code a user would type to take this step, exactly as the text shows it between
    # backticks (Python, or a `%gpumem` line), where the step is one; "" for advice that is
    # a change to the user's own program. What ``nbytes`` says it frees is what running it
    # frees, and a harness checks that by running it.
    code: str = ""


@dataclass(frozen=True)
class SiteAtFailure:
    """An allocation site live at the failure (from ``%%gpumem --trace``)."""

    label: str
    nbytes: int


@dataclass(frozen=True)
class OomExplanation(Shown):
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
    # Conservation: the allocated bytes split into holders, graphs, the computation, pools
    # and "not found" (ledger.py), from the same scan as the causes.
    ledger: Ledger | None = None
    # An out-of-memory error other than PyTorch's allocator's own (``forms.py``): which
    # library's, what failed, and whether the kernel can go on; shown under the header.
    kind: str = ""
    kind_lines: tuple[str, ...] = ()
    restart: bool = False

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
        parts = [f"gpumem: CUDA out of memory on GPU {f.device}." if not self.kind else
                 f"gpumem: out of GPU memory on GPU {f.device} ({self.kind})."]
        if f.requested_bytes is not None:
            parts.append(f"Asked {format_bytes(f.requested_bytes)};")
        if f.total_bytes is not None:
            the = "the" if f.requested_bytes is not None else "The"
            parts.append(f"{the} GPU has {format_bytes(f.total_bytes)} in total, "
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
        if f.pools:
            pooled = sum(p.reserved_bytes for p in f.pools)
            # PyTorch's own message adds a pool's reserved bytes to "allocated by PyTorch"
            # (H200: "83.62 GiB is allocated by PyTorch, with 83.43 GiB allocated in private
            # pools" beside our 192 MiB): said, or the two messages read as contradicting.
            counted = ("; PyTorch's own message counts all of it as allocated"
                       if f.pools_free_bytes else "")
            parts.append(f"Private memory pools held {format_bytes(pooled)}"
                         f" ({format_bytes(f.pools_free_bytes)} of it free to their own "
                         f"allocations only{counted}).")
        return " ".join(parts)

    def lines(self) -> list[str]:
        out = [self.header(), *self.kind_lines]
        if self.ledger is not None:
            out.append(self.ledger.line())
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

    def _repr_html_(self) -> str:
        esc = html.escape
        body = [f"<div><b>{esc(self.header())}</b></div>"]
        body += [f"<div>{esc(line)}</div>" for line in self.kind_lines]
        if self.ledger is not None:
            body.append(f"<div>{esc(self.ledger.line())}</div>")
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
        if c.kind == CAUSE_PRIVATE_POOL and c.details[:1] == (OTHER_POOL_CACHE,):
            out.append(Action(
                f"`torch.cuda.empty_cache()` returns the {format_bytes(c.nbytes)} another "
                "pool caches to CUDA, where this pool can get it; then run the cell again.",
                c.nbytes, code="torch.cuda.empty_cache()"))
            continue
        if c.kind == CAUSE_PRIVATE_POOL:
            out.extend(_pool_actions(f))
            continue
        if c.kind == CAUSE_FRAGMENTATION:
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
            if f.frozen_objects > 0:
                # Advised, never done: observing changes nothing, and unfreezing undoes what
                # the user froze on purpose (a fork's copy-on-write pages).
                # What it frees is not known: the frozen objects may be live.
                out.append(Action(
                    "`import gc; gc.unfreeze(); gc.collect()` puts the "
                    f"{f.frozen_objects:,} objects gc.freeze() froze back in the collector's "
                    "view: it frees the garbage cycles among them, and %gpumem who --gc can "
                    "then name the live ones.",
                    None, code="import gc; gc.unfreeze(); gc.collect()"))
            out.append(Action("%gpumem who --gc also searches every object the garbage "
                              "collector tracks, and names what holds these tensors.",
                              c.nbytes))
        elif c.kind == CAUSE_HELD and c.details[:1] == (RAW_POINTERS,):
            out.extend(Action(line.text, line.nbytes, code=line.code)
                       for line in raw_lines(f.raw_blocks))
        elif c.kind == CAUSE_HELD and c.details and c.details[0].startswith("measured after"):
            what = ("%gpumem cleanup runs gc.collect(), which frees what the replaced "
                    "traceback still holds; then run the cell again."
                    if f.unreachable_bytes else
                    "Run the cell again: what the replaced traceback held is free now.")
            out.append(Action(what, c.nbytes))
        elif c.kind == CAUSE_HELD:
            out.extend(_held_actions(holders, f.device))
        elif c.kind == CAUSE_GARBAGE:
            garbage = garbage_holders(holders, f.device)[:1]
            for h in garbage:
                waiting = c.nbytes - (f.collected_bytes or 0) if c.nbytes else h.nbytes
                advice = holder_advice(replace(h, nbytes=waiting,
                                               graph_bytes=None, holds_graph=False))
                out.append(Action(advice.text, waiting, code=advice.code))
            if f.collected_bytes:
                # Already free: nothing to run now; the fix is in the loop that makes them.
                out.append(Action(
                    f"{format_bytes(f.collected_bytes)} of it is free again (a collection "
                    "ran after the failure): run the cell again. To keep it from "
                    "recurring, break the cycles where they are made (set the "
                    "back-reference to None, or hold it through weakref), or call "
                    "gc.collect() in that loop."))
        elif c.kind == CAUSE_WORKING_SET and not dominant and not any(
                x.covers for x in causes[1:]):
            out.append(_workload_action(f))
    if not any(c.kind == CAUSE_HELD and c.details
               and c.details[0] not in (UNREACHABLE, UNREACHABLE_AT_START, RAW_POINTERS)
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


def pool_action(pool: PoolUse) -> Action:
    """The step that frees one private pool: its owner goes, then empty_cache."""
    if pool.kind == POOL_USER:
        who = f"del {pool.owner}" if pool.owner else "del the torch.cuda.MemPool object"
        return Action(f"{who} and every tensor allocated in it (under "
                      "torch.cuda.use_mem_pool), then %gpumem cleanup (torch.cuda.empty_cache()) "
                      f"returns its {format_bytes(pool.reserved_bytes)}.", pool.reserved_bytes)
    if pool.owner:
        return Action(f"del {pool.owner} (the torch.cuda.CUDAGraph) and the static tensors its "
                      "capture made, then %gpumem cleanup (torch.cuda.empty_cache()) returns "
                      f"its private pool's {format_bytes(pool.reserved_bytes)}; or capture a "
                      "smaller step, or let graphs share one pool (pool=g.pool()).",
                      pool.reserved_bytes)
    if pool.graph_trees:
        return Action("torch.compiler.reset() drops the compiled functions and their CUDA graph "
                      "trees (torch._inductor.cudagraph_trees.reset_cudagraph_trees() frees the "
                      "trees alone); del the outputs you kept, then %gpumem cleanup "
                      f"(torch.cuda.empty_cache()) returns the {format_bytes(pool.reserved_bytes)}"
                      " pool. Or compile without CUDA graphs (mode=\"max-autotune-no-cudagraphs\" "
                      "or the default mode).", pool.reserved_bytes)
    return Action("del the torch.cuda.CUDAGraph that owns this pool and the static tensors its "
                  "capture made, then %gpumem cleanup (torch.cuda.empty_cache()) returns its "
                  f"{format_bytes(pool.reserved_bytes)}.", pool.reserved_bytes)


def _pool_actions(f: OomFacts) -> list[Action]:
    return [pool_action(p) for p in sorted(f.pools, key=lambda p: -p.reserved_bytes)
            if p.reserved_bytes >= _NOTABLE_BYTES]


def _workload_action(f: OomFacts) -> Action:
    site = f.site
    if site is not None and site.in_generate:
        cache = site.cache
        held = ""
        if cache is not None and cache.preallocated:
            per = (f", {format_bytes(cache.per_token_bytes)} per token of its length"
                   if cache.per_token_bytes else "")
            held = (f" The KV cache held {format_bytes(cache.nbytes)}{per}, allocated up front "
                    "for batch × max length (max_cache_len, or prompt + max_new_tokens).")
        elif cache is not None:
            grow = (f", {format_bytes(cache.per_token_bytes)} more per generated token"
                    if cache.per_token_bytes else "")
            held = f" The KV cache held {format_bytes(cache.nbytes)}{grow}."
        return Action(
            "Generation: lower the batch size or max_new_tokens (the KV cache grows with batch "
            "× (prompt + generated) tokens), or keep less of the cache on the GPU "
            "(generate(..., cache_implementation=\"offloaded\") or \"quantized\"), or a "
            f"smaller dtype for the model and cache (bf16).{held} Activation checkpointing "
            "does not apply: generation keeps no activations for a backward pass.")
    if site is not None and site.whole_model_checkpoint:
        return Action(
            "Checkpoint per block, not the whole model: one checkpoint recomputes every "
            "layer's activations in its backward at once (torch.utils.checkpoint around each "
            "transformer block, or model.gradient_checkpointing_enable() for transformers); or "
            "a smaller batch or sequence length.")
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
                          "not keep it.", total, code="%gpumem cleanup --out"))
        held = [h for h in held if h.kind != "output cache"]
    gone: set[str] = set()  # names an earlier step's line deletes
    for h in held[:5]:
        advice = holder_advice(h)
        text, code = advice.text, _without_deleted(advice.code, gone)
        if code != advice.code:
            # Run in order, a line that deletes a name again raises NameError.
            text = text.replace(f"`{advice.code}`", f"`{code}`" if code else
                                "(the line above removes these references already)")
        # What a step says it frees is what its line frees: a fix that keeps the holder (a
        # module's gradients) frees less than the holder, and a sentence with no line to run
        # says how much the holder keeps.
        out.append(Action(text, advice.nbytes if code else h.held_bytes, code=code))
    return out


def _without_deleted(code: str, gone: set[str]) -> str:
    """``code`` without the names an earlier line deleted (``gone``, updated with this
    line's): "" where nothing but a collection would be left."""
    kept: list[str] = []
    for stmt in code.split("; ") if code else ():
        if stmt.startswith("del "):
            names = [n.strip() for n in stmt[4:].split(",")]
            fresh = [n for n in names if n not in gone]
            gone.update(names)
            if fresh:
                kept.append("del " + ", ".join(fresh))
        else:
            kept.append(stmt)
    if set(kept) <= {"import gc", "gc.collect()"} and "del " in code:
        return ""  # its deletes were all done above; a bare collection is no step of its own
    return "; ".join(kept)


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


GC_NOTE_BYTES = 256 << 20  # a collection's freed bytes worth a line after the explanation


def form_actions(form: OomForm | None, steps: tuple[Action, ...]) -> tuple[Action, ...]:
    """A form's one recovering action first; where the kernel must restart it is the only
    one (nothing run in this process frees what the failure broke)."""
    if form is None:
        return steps
    first = Action(form.action, code=form.code)
    if form.restart:
        return (first,)
    return (first, *(a for a in steps if a.code != form.code or a.nbytes is not None))


def collected_line(nbytes: int, collections: int, *, after_explanation: bool) -> str:
    when = ("Since the out-of-memory error was explained" if after_explanation
            else "Between the failure and this explanation")
    many = "collection" if collections == 1 else "collections"
    return (f"{when}, Python's garbage collector freed {format_bytes(nbytes)} of CUDA memory "
            f"({collections} {many}): tensors kept only by reference cycles (objects that refer to "
            "each other and that nothing else reaches). That was garbage at the failure, "
            "counted against the request: PyTorch does not run the collector before it "
            "raises. Break the cycle (set the back-reference to None, or hold it through "
            "weakref) or call gc.collect() in the loop that makes them.")
