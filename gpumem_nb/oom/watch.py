"""The runtime: PyTorch's OOM observer (``observer.py``: registered once per process, never
creating a CUDA context, kept across ``%reload_ext``; queued on torch's CUDA start-up as soon
as torch is imported, so that it sees an OOM in the very cell that starts CUDA), the
allocator's state at the failure, when every tensor is still alive, and turning a failing
cell into an ``OomExplanation``. Ordinary cells cost one attribute check."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import ModuleType
from typing import Any

from .. import userexc
from ..cleanup import CleanupRequest
from ..errtext import error_str
from ..ledger import workspace_blocks_bytes, workspaces_in_remainder
from ..model import (
    CellStart,
    Holder,
    Sample,
)
from ..sources.torch import (
    TorchDebug,
    alloc_conf,
)
from .advice import (
    GC_NOTE_BYTES,
    OomExplanation,
    SiteAtFailure,
    collected_line,
    form_actions,
    next_steps,
)
from .causes import (
    CAUSE_UNKNOWN,
    CAUSE_WORKING_SET,
    KIND_FAILED_CALL,
    classify,
    garbage_holders,
    held_holders,
)
from .event import OomEvent
from .facts import OomFacts, PoolUse
from .forms import find_oom, oom_form
from .gcwindow import Collections, WhileHandled, collector_held, frozen_objects
from .ledgerparts import explanation_ledger, pool_parts
from .message import (
    FORM_ASYNC,
    FORM_UNKNOWN,
    OomMessage,
    first_line,
    parse_oom_message,
)
from .observer import ObserverAttachment
from .pieces import (
    Pieces,
    any_capped,
    cell_facts,
    failed_call_apart,
    unaccounted_at_start,
    with_collections,
)
from .processes import listed_processes, processes_facts, unknown_note
from .rawpart import find_raw_blocks
from .scans import (
    EXPLAIN_GRAPH_BUDGET_S,
    OomHost,
    add_searched,
    check_cuts,
    rest_min_bytes,
    scan_rest,
    searched_holders,
)
from .segments import _segment_facts, graph_trees_loaded, named_pools, pools_in
from .site import failure_site, mark_running

__all__ = ["OomWatch"]


class OomWatch(ObserverAttachment):
    """One loaded extension's OOM explainer. ``on_cell_result`` is the only per-cell call."""

    def __init__(self, host: OomHost, torch: TorchDebug | None = None,
                 show: Callable[[object], object] = print,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.host = host
        self.torch = torch if torch is not None else TorchDebug()
        self.show = show
        self.clock = clock
        self.last: OomExplanation | None = None
        self.counts: dict[int, int] = {}
        self.events: deque[OomEvent] = deque(maxlen=32)
        # Until torch is imported there is nothing to attach to; ``arm`` says what comes next.
        self.observer_status = ("not attached: torch is not imported; it is queued once torch "
                                "is, and attaches as CUDA starts")
        self._observer: Any = None
        self._attach_tried = False
        self._armed = False  # queueing on CUDA's start-up was tried (or is moot)
        # sys.modules, unless a test gave another (a stand-in for TorchDebug may have none)
        self._modules: Mapping[str, ModuleType] = getattr(self.torch, "modules", sys.modules)
        self._closed = False
        self._generation = 0
        self._scanned_generation = -1
        self._previous_error = ""
        self._errors = 0  # cells that raised, since this load
        # Python's collections from the last failure to the end of the next cell, measured.
        self._window: Collections | None = None
        # Where no observer can be attached: the collections while the error is handled.
        self._handled: WhileHandled | None = None
        self._lock = threading.Lock()
        # More lines for the explanation, from features the caller sets per cell (the
        # allocator what-if of a traced cell). Given the facts; a hook that fails adds none.
        self.extra_lines: Callable[[OomFacts], Sequence[str]] | None = None

    # -- the observer (attached by ``ObserverAttachment``) -------------------------------------
    def close(self) -> None:
        """Unload: the process keeps the registered observer; it stops calling us."""
        self._closed = True
        if self._handled is not None:
            self._handled.stop()
        self._close_window(report=False)
        obs = self._observer
        if obs is not None and getattr(obs, "handler", None) == self._on_oom:
            obs.handler = None
        self._observer = None

    def _on_oom(self, device: int, alloc: int, limit: int, free: int) -> None:
        """Inside the allocator's OOM path, before the exception: read what only exists now.
        Several can fire for one cell (cuDNN retries smaller workspaces); the session is
        scanned once per cell."""
        t0 = self.clock()
        # The counters and the segments are read first, with the collector held off from
        # the start: a collection run by anything after them (the scan allocates) frees
        # reference cycles' tensors into idle segments and large free blocks that were not
        # there at the failure, and read as cache the request could have used.
        with collector_held():
            with self._lock:
                self.counts[device] = self.counts.get(device, 0) + 1
                generation = self._generation
                scan = self._scanned_generation != generation
                self._scanned_generation = generation
            event = OomEvent(device=device, requested_bytes=int(alloc),
                             limit_bytes=int(limit), free_bytes=int(free), wall_s=time.time(),
                             generation=generation)
            event.reading = self.torch.read(device)
            t = self.clock()
            self._read_segments(event, device)
            segments_s = self.clock() - t
        event.stage_s["observer_segments"] = segments_s
        if self._window is None or self._window.generation != generation:
            self._open_window(device, generation)
        event.grad_enabled = self.torch.grad_enabled()
        event.cell = self._cell_start(device)
        t = self.clock()
        event.stage_s["observer_read"] = t - t0 - segments_s
        event.processes = listed_processes(self.host, device)
        event.stage_s["observer_processes"] = self.clock() - t
        if scan:
            t = self.clock()
            event.holders = tuple(self.host.scan(graph_budget_s=EXPLAIN_GRAPH_BUDGET_S))
            event.stage_s["observer_scan"] = self.clock() - t
        event.cost_s = self.clock() - t0
        self.events.append(event)

    def _read_segments(self, event: OomEvent, device: int) -> None:
        if self.torch.allocator_backend() == "cudaMallocAsync":
            return  # the async pool has no segments
        # Segments and blocks only: cheap. With history recorded the whole snapshot would
        # carry it, so the segments are read alone; skipping them left a CUDA graph's free
        # pool unknown, and so called fragmentation.
        if not self.torch.history_enabled():
            snap, _ = self.torch.memory_snapshot()
        else:
            segs, _ = self.torch.segments_snapshot()
            snap = {"segments": segs} if segs is not None else None
        if snap is None:
            return
        (event.largest_free_block_bytes, event.expandable_segments,
         event.idle_segments_bytes) = _segment_facts(snap, device)
        event.pools = self._named_pools(pools_in(snap.get("segments", ()), device,
                                                 graph_trees_loaded()))
        event.workspaces_bytes = workspace_blocks_bytes(snap.get("segments", ()), device)

    def _segments_now(self, device: int, backend: str) -> tuple[tuple[PoolUse, ...], int]:
        """After the failure, from one reading of the segments: the private pools (a graph's
        pool outlives the exception) and cuBLAS's workspaces (ATen keeps them per handle and
        stream). Under cudaMallocAsync there are no segments: no pools, and the workspaces
        are told later by their sizes (``workspaces_in_remainder``)."""
        if backend == "cudaMallocAsync":
            return (), 0
        try:
            segs, _ = self.torch.segments_snapshot()
        except Exception:
            return (), 0
        return (self._named_pools(pools_in(segs or (), device, graph_trees_loaded())),
                workspace_blocks_bytes(segs or (), device))

    def _add_raw_blocks(self, pieces: Pieces) -> bool:
        """Where the ledger leaves more than its threshold "not found": the allocated blocks no
        holder's storage lies over, read from the segments after the failure (the blocks that
        lived through it), and where an int equal to one's address is kept. None under
        cudaMallocAsync, which has no segments. Whether it ran."""
        f = pieces.facts
        if f.backend == "cudaMallocAsync" or f.allocated_bytes is None:
            return False
        led = explanation_ledger(f, pieces.judged)
        if led is None or not led.shows_not_found:
            return False
        try:
            segs, _ = self.torch.segments_snapshot()
        except Exception:
            return False
        if not segs:
            return False
        ns = getattr(getattr(self.host, "shell", None), "user_ns", None)
        try:
            blocks = find_raw_blocks(segs, f.device, (*pieces.holders, *pieces.judged),
                                     ns if isinstance(ns, Mapping) else None, self._modules)
        except Exception:
            return True  # segments of another shape: the explanation stays as it was
        if not blocks:
            return True
        named = min(sum(b.size_bytes for b in blocks if b.path), led.not_found_bytes)
        unreachable = f.unreachable_bytes
        if unreachable is not None and named:
            # What a raw pointer keeps is named: not "reachable from nothing the scan walks".
            unreachable = max(unreachable - named, 0)
        pieces.facts = replace(f, raw_blocks=blocks, unreachable_bytes=unreachable)
        return True

    def ledger_pools(self, holders: Sequence[Holder]) -> dict[int, tuple[tuple[str, int], ...]]:
        """Every GPU's private pools as ledger parts, for `who` and `cleanup --dry-run`: one
        reading of the segments (cheap, no history), none before CUDA is up."""
        if not self.torch.initialized or \
                self.torch.allocator_backend() == "cudaMallocAsync":
            return {}
        try:
            segs, _ = self.torch.segments_snapshot()
        except Exception:
            return {}
        devices = {seg.get("device") for seg in segs or () if isinstance(seg, Mapping)}
        out: dict[int, tuple[tuple[str, int], ...]] = {}
        for device in devices:
            if isinstance(device, int):
                pools = self._named_pools(pools_in(segs or (), device, graph_trees_loaded()))
                if pools:
                    out[device] = pool_parts(pools, holders)
        return out

    def _named_pools(self, pools: tuple[PoolUse, ...]) -> tuple[PoolUse, ...]:
        """Each pool with the user variable that owns it (``segments.named_pools``)."""
        return named_pools(pools, getattr(getattr(self.host, "shell", None), "user_ns", None))

    def _cell_start(self, device: int) -> CellStart | None:
        fn = getattr(self.host, "cell_start", None)
        if fn is None:
            return None
        try:
            start: CellStart | None = fn(device)
            return start
        except Exception:
            return None

    # -- per cell ----------------------------------------------------------------------------
    def on_cell_result(self, result: object,
                       sites: Sequence[SiteAtFailure] = ()) -> OomExplanation | None:
        """Called once per finished cell. Costs nothing unless the cell raised a CUDA OOM."""
        self.ensure_attached()
        generation = self._generation
        with self._lock:
            self._generation += 1
        if self._window is not None and self._window.generation < generation:
            self._close_window()  # the cell after the failure has ended
        err = getattr(result, "error_in_exec", None)
        if not userexc.is_exception(err):
            self._previous_error = ""
            return None
        earlier, self._errors = self._errors, self._errors + 1
        previous, self._previous_error = self._previous_error, \
            f"{userexc.type_name(err)}: {first_line(error_str(err), 120)}"[:120]
        found = find_oom(err)  # PyTorch's allocator's, or any other form (forms.py)
        if found is None:
            return None
        oom = found[0]
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
        self.ensure_attached()  # the observer's status, as the explanation may quote it
        text = error_str(exc)
        msg = parse_oom_message(text) or OomMessage(FORM_UNKNOWN)
        form = oom_form(exc)
        if form is not None and msg.requested_bytes is None and form.requested_bytes:
            msg = replace(msg, requested_bytes=form.requested_bytes)
        event = self._event_for(msg, generation)
        if event is None:
            # The observer did not see it (cudaMallocAsync, or before it was attached).
            device = msg.device if msg.device is not None else 0
            with self._lock:
                self.counts[device] = self.counts.get(device, 0) + 1
            pieces = self._from_message(msg, previous_error, cell_error or exc)
            took = self._handled.take(cell_error, exc) if self._handled is not None else None
            if took is not None and took[0]:
                pieces.facts = replace(pieces.facts, collected_bytes=took[0],
                                       collections=took[2])
        else:
            pieces = self._from_event(event, msg)
        if earlier_errors:
            pieces.facts = replace(pieces.facts, earlier_errors=earlier_errors)
        window = self._window
        if event is not None and window is not None and window.generation == event.generation:
            pieces.facts = with_collections(pieces.facts, window)
        elif event is None and generation is not None and not self._closed:
            # Seen only now (no observer): collections from here on are still reported.
            self._open_window(pieces.facts.device, generation)
        stages = pieces.stage_s
        if event is not None:
            t = self.clock()
            add_searched(self.host, self.torch, pieces)
            stages["search"] = self.clock() - t
        t = self.clock()
        check_cuts(self.host, pieces, pieces.facts.device)
        stages["cuts"] = self.clock() - t
        t = self.clock()
        if self._add_raw_blocks(pieces):
            stages["raw_blocks"] = self.clock() - t
        t = self.clock()
        ns = getattr(getattr(self.host, "shell", None), "user_ns", None)
        site = failure_site(exc, ns if isinstance(ns, Mapping) else {}, holders=pieces.judged)
        pieces.judged = mark_running(pieces.judged, site)
        pieces.facts = replace(pieces.facts, site=site)
        stages["site"] = self.clock() - t
        t = self.clock()
        causes = classify(pieces.facts, pieces.judged)
        if causes and causes[0].kind == CAUSE_WORKING_SET and site.lines():
            causes = (replace(causes[0], details=causes[0].details + tuple(site.lines())),
                      *causes[1:])
        elif site.lines():
            pieces.notes.extend(site.lines())
        if form is not None:
            # PyTorch's working set and "how much was asked" speak of its allocator's request;
            # what holds memory (variables, other processes) blocks any allocator.
            causes = tuple(c for c in causes if c.kind not in (CAUSE_WORKING_SET, CAUSE_UNKNOWN))
        stages["classify"] = self.clock() - t
        t = self.clock()
        try:
            dry = self.host.cleanup(self._dry_run_request(pieces, event))
        except Exception:
            dry = None
        stages["dry_run"] = self.clock() - t
        extra = self._extra_lines(pieces.facts, stages)
        return OomExplanation(
            ledger=explanation_ledger(pieces.facts, pieces.judged), facts=pieces.facts,
            causes=causes,
            actions=form_actions(form, next_steps(pieces.facts, causes, pieces.judged, dry)),
            error=first_line(text, 300) or userexc.type_name(exc),
            form=msg.form, source=pieces.source, holders=pieces.holders,
            sites_at_failure=tuple(sites), observer_s=pieces.observer_s,
            notes=tuple(pieces.notes) + extra, stage_s=stages,
            kind=form.key if form is not None else "",
            kind_lines=tuple(form.lines()) if form is not None else (),
            restart=form is not None and form.restart)

    # -- collections after a failure -----------------------------------------------------------
    def _open_window(self, device: int, generation: int) -> None:
        self._close_window()

        def allocated() -> int | None:
            r = self.torch.read(device)
            return r.allocated_bytes if r is not None else None

        self._window = Collections(allocated, generation)
        self._window.start()

    def _close_window(self, report: bool = True) -> None:
        """End the window; where its collections freed CUDA memory after the explanation
        was shown, say so once and add it to ``%gpumem oom``'s explanation."""
        w, self._window = self._window, None
        if w is None:
            return
        w.stop()
        last = self.last
        said = last.facts.collected_bytes or 0 if last is not None else 0
        late = w.freed_bytes - said
        if not report or late < GC_NOTE_BYTES or last is None:
            return
        line = collected_line(late, w.freeing, after_explanation=True)
        self.last = replace(last, notes=(*last.notes, line))
        with contextlib.suppress(Exception):
            self.show(f"gpumem: {line}")

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

    def _dry_run_request(self, pieces: Pieces, event: OomEvent | None) -> CleanupRequest:
        """The in-cell ``cleanup --dry-run``, reusing what was already read after the failure.

        Without the observer, the scan and the full reading were both made after the failure,
        exactly what the dry run would make again: they are handed over. The observer's scan
        is from before the exception unwound (the failing call's locals were live then, and
        the stored exception was the previous cell's), so after it the dry run still scans;
        only its reading is the cheap allocator-and-host one: its estimates use allocator
        figures only, never NVML's."""
        if event is None:
            return CleanupRequest(dry_run=True, clear_output=True, reuse_sample=pieces.sample,
                                  reuse_holders=pieces.holders, pools=self.ledger_pools)
        hot = getattr(self.host, "read_hot", None)
        sample: Sample | None = None
        if hot is not None:
            try:
                sample = hot()
            except Exception:
                sample = None
        return CleanupRequest(dry_run=True, clear_output=True, reuse_sample=sample,
                              graph_budget_s=EXPLAIN_GRAPH_BUDGET_S, pools=self.ledger_pools)

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

    def _from_event(self, ev: OomEvent, msg: OomMessage) -> Pieces:
        r = ev.reading
        total = self.torch.device_total_bytes(ev.device) or msg.total_bytes
        fraction = self.torch.memory_fraction(ev.device)
        allowed = msg.allowed_bytes
        if fraction is not None and fraction < 1.0:
            allowed = ev.limit_bytes
        t = self.clock()
        this, others, unknown = processes_facts(
            self.host, ev.processes, msg.other_processes, msg.this_process_bytes,
            ours_expected=bool(r and r.reserved_bytes))
        named_s = self.clock() - t
        holders = ev.holders
        if holders is None:  # a second OOM in the same cell: reuse the first one's scan
            holders = next((e.holders for e in reversed(self.events)
                            if e.generation == ev.generation and e.holders is not None), ())
        facts = OomFacts(
            device=ev.device, requested_bytes=ev.requested_bytes, total_bytes=total,
            free_bytes=ev.free_bytes, allowed_bytes=allowed,
            unreachable_bytes=unaccounted_at_start(ev.cell, holders, ev.device),
            allocated_bytes=r.allocated_bytes if r else msg.allocated_bytes,
            reserved_bytes=r.reserved_bytes if r else msg.reserved_total_bytes,
            this_process_bytes=this, other_processes=others, others_unknown=unknown,
            backend=self.torch.allocator_backend() or "native",
            expandable_segments=self._expandable(ev.expandable_segments),
            largest_free_block_bytes=ev.largest_free_block_bytes,
            idle_segments_bytes=ev.idle_segments_bytes,
            private_pool_bytes=msg.private_pool_bytes, measured_at="failure", pools=ev.pools,
            walk_capped=any_capped(holders), workspaces_bytes=ev.workspaces_bytes,
            grad_enabled=ev.grad_enabled, idle_process_bytes=self._idle_bytes(ev.device),
            frozen_objects=frozen_objects(),
            **cell_facts(ev.cell, r.allocated_bytes if r else msg.allocated_bytes))
        stages = {"observer": ev.cost_s}
        stages.update(ev.stage_s)
        stages["children"] = named_s  # naming the other processes (this kernel's children)
        return Pieces(facts=facts, holders=tuple(holders), judged=tuple(holders),
                       source="Measured at the failure by the allocator's OOM observer",
                       observer_s=ev.cost_s, notes=unknown_note(unknown),
                       stage_s=stages)

    def _from_message(self, msg: OomMessage, previous_error: str,
                      error: BaseException) -> Pieces:
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
        listed = listed_processes(self.host, device)
        stages["processes"] = self.clock() - t
        t = self.clock()
        this, others, unknown = processes_facts(
            self.host, listed, msg.other_processes, msg.this_process_bytes,
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
        # After the failure already: the walk and, where it leaves much unreached, the
        # retention search in one scan (the dry run reuses it).
        base = msg.allocated_bytes if msg.allocated_bytes is not None else (
            al.allocated_bytes if al else None)
        pools_now, workspaces_now = self._segments_now(device, backend)
        scanned = scan_rest(self.host, rest_min_bytes(base) if base is not None else None,
                            al.allocated_bytes - workspaces_now if al is not None else None)
        # What the search found that the explanation does not name (unseen, not searched;
        # garbage that a replaced traceback's story names) stays out of every figure.
        holders = tuple(h for h in scanned if not h.searched) + searched_holders(
            scanned, device, bool(previous_error))
        stages["scan"] = self.clock() - t
        judged = failed_call_apart(holders, error)
        failed = [h for h in judged if h.kind == KIND_FAILED_CALL
                  and h.device in (f"cuda:{device}", "cuda")]
        computation = sum(h.held_bytes for h in failed) if failed else None
        # A failed call whose tensors carry graphs ran with autograd on; without graphs it
        # may have run under no_grad, or made nothing yet: unknown.
        grad = True if any(h.holds_graph for h in failed) else None
        if al is not None:
            if msg.allocated_bytes is not None:
                released = max(msg.allocated_bytes - al.allocated_bytes, 0)
            # Garbage the search found is accounted for (its own cause), not unreached.
            reachable = sum(h.held_bytes for h in held_holders(judged, device)) + \
                sum(h.held_bytes for h in garbage_holders(judged, device)) + \
                (computation or 0)
            unreachable = max(al.allocated_bytes - reachable, 0)
            if backend == "cudaMallocAsync" and not workspaces_now:
                # No blocks to read: cuBLAS's workspaces are told by their sizes, where they
                # are all that is left (33 MiB "not found" in rows that allocate nothing).
                workspaces_now = workspaces_in_remainder(unreachable)
                unreachable -= workspaces_now
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
            computation_bytes=computation, grad_enabled=grad, walk_capped=any_capped(holders),
            pools=pools_now, workspaces_bytes=workspaces_now,
            idle_process_bytes=self._idle_bytes(device), frozen_objects=frozen_objects(),
            **cell_facts(self._cell_start(device), allocated))
        why = f"OOM observer {self.observer_status}" \
            if self.observer_status != "attached" else "the OOM observer did not see this one"
        notes = unknown_note(unknown)
        return Pieces(facts=facts, holders=holders, judged=judged,
                       source=f"From the error message and readings after it ({why})",
                       notes=notes, sample=now, stage_s=stages)

    def observer_line(self, has_gpu: bool) -> str:
        """The OOM observer's state in one sentence, for ``%gpumem status``."""
        if not has_gpu:
            return "OOM observer: none, as no GPU is visible."
        self.ensure_attached()  # the status as of now: CUDA may have started in this cell
        return f"OOM observer: {self.observer_status}."

    def no_oom_line(self) -> str:
        seen = sum(self.counts.values())
        caught = f" ({seen} caught by your own code, none reached a cell)" if seen else ""
        return (f"gpumem: no CUDA out-of-memory error has reached a cell yet{caught}. "
                + self.observer_line(has_gpu=True))
