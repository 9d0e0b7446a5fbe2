"""The ledger's part for allocated blocks that no tensor lies over, and the lines that free the
ones whose pointers a module or the notebook keeps as ints.

Such a block is either a raw allocation (``torch.cuda.caching_allocator_alloc``, a C/C++
extension's use of PyTorch's allocator) or the storage of a tensor the search did not find (one
kept only from C++ looks the same). Only an int equal to the block's address, found where a user
can reach it, tells the first apart: those blocks are named and counted; the others stay in
"not found", said to be blocks no tensor the search found lies over, never a raw allocation.

Read only where the ledger leaves more than its threshold "not found", from one reading of the
segments (none under cudaMallocAsync). The default pool only (a private pool's blocks are its
own part) and never cuBLAS's workspaces (their own part)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from ..holders.rawblocks import RawBlock, raw_blocks
from ..ledger import Ledger, cublas_workspace_sizes
from ..model import Holder
from ..units import format_bytes

__all__ = ["RawLine", "find_raw_blocks", "ledgers_with_raw_blocks", "raw_lines",
           "with_raw_blocks"]

LISTED = 3  # blocks listed by address in the ledger's detail
GROUP_AT = 3  # blocks behind one container from which they are freed by one loop line

_ITEM = re.compile(r"^(?P<box>.+)\[(?P<key>'[\w .-]*'|-?\d+)\]$")


def find_raw_blocks(segments: Iterable[Mapping[str, Any]] | None, device: int,
                    holders: Iterable[Holder], user_ns: Mapping[Any, Any] | None,
                    modules: Mapping[str, ModuleType]) -> tuple[RawBlock, ...]:
    """The default pool's allocated blocks on ``device`` that none of the holders' storages
    lies in, less cuBLAS's workspaces, each with where its pointer is kept if anywhere."""
    sizes = cublas_workspace_sizes()
    own = []
    for seg in segments or ():
        if not isinstance(seg, Mapping) or \
                tuple(seg.get("segment_pool_id", (0, 0)) or (0, 0)) != (0, 0):
            continue
        blocks = seg.get("blocks", ()) or ()
        if any(_workspace(b, sizes) for b in blocks):
            # The block stays in the list (it places the next ones), counted as not allocated.
            seg = {**seg, "blocks": [{**b, "state": "workspace"} if _workspace(b, sizes)
                                     else b for b in blocks]}
        own.append(seg)
    covered = [s for h in holders for s in h.storages]
    return tuple(raw_blocks(own, device, covered, user_ns, modules))


def _workspace(block: Mapping[str, Any], sizes: frozenset[int]) -> bool:
    """A cuBLAS workspace as ``ledger.workspace_blocks_bytes`` tells one."""
    if block.get("state") != "active_allocated":
        return False
    if block.get("requested_size", block.get("size")) not in sizes:
        return False
    return not any(str(fr.get("filename", "")).endswith(".py")
                   for fr in block.get("frames") or () if isinstance(fr, Mapping))


def _blocks_text(blocks: Sequence[RawBlock]) -> str:
    shown = ", ".join(f"{b.address:#x}: {format_bytes(b.size_bytes)}" for b in blocks[:LISTED])
    return shown + (f" and {len(blocks) - LISTED} more" if len(blocks) > LISTED else "")


def with_raw_blocks(led: Ledger, blocks: Sequence[RawBlock]) -> Ledger:
    """``led`` with the blocks whose pointers were found as a part of its own (taken out of
    "not found"), and the others said inside "not found", bounded by it: blocks of saved
    tensors that the holders' graphs count also lie under no storage the holders list."""
    named = [b for b in blocks if b.path]
    unnamed = [b for b in blocks if not b.path]
    raw = min(sum(b.size_bytes for b in named), led.not_found_bytes)
    text = ""
    if named:
        where = sorted({_container(b.path) for b in named})
        text = (f"{len(named)} allocated block{'s' if len(named) != 1 else ''} with no tensor "
                f"over them, whose addresses {', '.join(where[:3])}"
                f"{' and more' if len(where) > 3 else ''} keep{'s' if len(where) == 1 else ''}"
                f" as ints (raw allocations: torch.cuda.caching_allocator_alloc; "
                f"{_blocks_text(named)})")
    led = replace(led, raw_bytes=raw, raw_text=text)
    uncovered = min(sum(b.size_bytes for b in unnamed), led.not_found_bytes)
    if unnamed and uncovered:
        led = replace(led, uncovered_bytes=uncovered, uncovered_text=(
            f"{len(unnamed)} allocated block{'s' if len(unnamed) != 1 else ''} that no tensor "
            f"the search found lies over ({_blocks_text(unnamed)}): made by "
            "torch.cuda.caching_allocator_alloc or a C/C++ extension, or tensors kept only "
            "from C++; no int equal to their addresses is in your variables or any module's "
            "globals"))
    return led


def ledgers_with_raw_blocks(ledgers: Sequence[Ledger],
                            segments: Sequence[Mapping[str, Any]] | None,
                            holders: Sequence[Holder], user_ns: Mapping[Any, Any] | None,
                            modules: Mapping[str, ModuleType]) -> tuple[Ledger, ...]:
    """Each ledger that shows "not found", with the blocks no holder's storage lies over
    (`who --gc`: the same part as the OOM explanation's); the others as they are."""
    out = []
    for led in ledgers:
        if segments and led.shows_not_found and led.device.startswith("cuda:"):
            try:
                blocks = find_raw_blocks(segments, int(led.device[5:]), holders, user_ns,
                                         modules)
            except (TypeError, ValueError, AttributeError):  # segments of another shape
                blocks = ()
            if blocks:
                led = with_raw_blocks(led, blocks)
        out.append(led)
    return tuple(out)


def _container(path: str) -> str:
    m = _ITEM.match(path)
    return m.group("box") if m else path


@dataclass(frozen=True)
class RawLine:
    """One line that frees named blocks, with what it frees: the allocator's block sizes."""

    code: str
    nbytes: int
    text: str


def raw_lines(blocks: Sequence[RawBlock]) -> list[RawLine]:
    """One line per named block, largest first; several blocks kept in one dict (or list) are
    freed by one loop line over exactly their keys. A line that does not compile is left out.
    Their bytes are the blocks' sizes from the allocator's snapshot: no dry run on the
    retention graph can check them (no tensor lies over these blocks)."""
    named = [b for b in blocks if b.path]
    boxes: dict[str, list[tuple[str, RawBlock]]] = {}
    for b in named:
        m = _ITEM.match(b.path)
        if m:
            boxes.setdefault(m.group("box"), []).append((m.group("key"), b))
    out: list[RawLine] = []
    grouped: set[str] = set()
    for box, items in boxes.items():
        if len(items) < GROUP_AT:
            continue
        keys = ", ".join(k for k, _ in items)
        if all(k.startswith("'") for k, _ in items):
            # Popped: the dict keeps no dangling address that a second delete would fail on.
            code = (f"for k in ({keys},): "
                    f"torch.cuda.caching_allocator_delete({box}.pop(k))")
        else:
            code = (f"for p in ({', '.join(b.path for _, b in items)},): "
                    "torch.cuda.caching_allocator_delete(p)")
        n = sum(b.size_bytes for _, b in items)
        out.append(RawLine(code, n, _text(code, n, f"{len(items)} raw blocks whose addresses "
                                                     f"{box} keeps")))
        grouped.update(b.path for _, b in items)
    for b in named:
        if b.path not in grouped:
            out.append(RawLine(b.code, b.size_bytes,
                               _text(b.code, b.size_bytes,
                                     f"the raw block at {b.address:#x} whose address "
                                     f"{b.path} keeps")))
    out = [line for line in out if _compiles(line.code)]
    out.sort(key=lambda line: -line.nbytes)
    return out


def _text(code: str, nbytes: int, what: str) -> str:
    return (f"`{code}` frees {what} ({format_bytes(nbytes)}, the allocator's block sizes; "
            "not checked on the retention graph: no tensor lies over them), once nothing "
            "uses that memory any more.")


def _compiles(code: str) -> bool:
    try:
        compile(code, "<gpumem advice>", "exec")
    except (SyntaxError, ValueError):
        return False
    return True
