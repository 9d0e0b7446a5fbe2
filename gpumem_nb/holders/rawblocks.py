"""Allocator blocks that no tensor, storage or DLPack capsule covers, and the ints that point
at them.

``torch.cuda.caching_allocator_alloc(n)`` (or an extension's use of PyTorch's allocator) hands
out a bare device pointer: memory in an allocated block, with no Python object that keeps it,
only an int equal to the block's address. A search from tensors cannot find it (KINDS8's
kernel workspaces were 99.9% "not found"). What can be said is what the allocator's snapshot
tells: these blocks are allocated and nothing Python sees lies over them. Where an int equal
to a block's address is kept in the notebook's namespace or in a module's globals (directly,
or one container down: ``kernels._WORKSPACES['attn0']``), that is named, and
``torch.cuda.caching_allocator_delete(<path>)`` frees exactly that block.

Read only when bytes are left unexplained, from a snapshot's plain dicts and the namespaces'
own dicts (ints, dicts, lists and tuples compared by exact type: no user code runs). Bounded:
at most ``MAX_BLOCKS`` blocks are listed and ``MAX_ITEMS`` items read per container."""

from __future__ import annotations

import bisect
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .edges import _MODULE_DICT
from .pathtext import _EXPRESSION

__all__ = ["RawBlock", "pointer_paths", "raw_blocks", "uncovered_blocks"]

MAX_BLOCKS = 64  # blocks listed at most, largest first
MAX_ITEMS = 4096  # items read per container one level below a root


@dataclass(frozen=True)
class RawBlock:
    """One allocated block that no tensor, storage or capsule lies over."""

    address: int
    size_bytes: int
    path: str = ""  # where an int equal to its address is kept; "" where none was found

    @property
    def code(self) -> str:
        """The line that frees it, where its pointer is named."""
        if not self.path:
            return ""
        return f"torch.cuda.caching_allocator_delete({self.path})"


def allocated_blocks(segments: Iterable[Mapping[str, Any]],
                     device: int) -> list[tuple[int, int]]:
    """(address, size) of each allocated block on ``device``: a block's address is its
    segment's plus the sizes of the blocks before it (the snapshot's blocks are in address
    order; a block's own ``address`` is used where the snapshot has one)."""
    out: list[tuple[int, int]] = []
    for seg in segments:
        if seg.get("device", device) != device:
            continue
        at = seg.get("address")
        if not isinstance(at, int):
            continue
        for b in seg.get("blocks", ()):
            size = int(b.get("size", 0) or 0)
            addr = b.get("address", at)
            addr = addr if isinstance(addr, int) else at
            if b.get("state") == "active_allocated" and size > 0:
                out.append((addr, size))
            at = addr + size
    return out


def uncovered_blocks(segments: Iterable[Mapping[str, Any]], device: int,
                     covered: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The allocated blocks on ``device`` with no byte of any ``covered`` (start, bytes)
    range (the tensors', storages' and capsules' found) inside them, largest first."""
    # Merged into disjoint ranges, sorted: their ends rise with their starts, so the last one
    # that starts before a block's end is the only one that can reach past the block's start
    # (one bisection a block: 20,000 blocks and storages cost milliseconds, not a second).
    starts: list[int] = []
    ends: list[int] = []
    for s, e in sorted((int(s), int(s) + max(int(n), 1)) for s, n in covered):
        if ends and s <= ends[-1]:
            ends[-1] = max(ends[-1], e)
        else:
            starts.append(s)
            ends.append(e)
    out = []
    for addr, size in allocated_blocks(segments, device):
        i = bisect.bisect_left(starts, addr + size)
        if i and ends[i - 1] > addr:
            continue  # a range that starts before the block's end ends after its start
        out.append((addr, size))
    out.sort(key=lambda b: (-b[1], b[0]))
    return out


def pointer_paths(addresses: Iterable[int], user_ns: Mapping[Any, Any] | None,
                  modules: Mapping[str, Any]) -> dict[int, str]:
    """For each address, the first place an int equal to it is kept: a variable, an item of
    a variable's dict, list or tuple, then a module's global or one item down, written as a
    user types it (a module by the name the notebook imported it under). A library's own
    modules are read too: their pointers are the user's only handle on those blocks."""
    wanted = set(addresses)
    found: dict[int, str] = {}
    if not wanted:
        return found
    aliases: dict[int, str] = {}
    if type(user_ns) is dict:
        for name, value in list(dict.items(user_ns)):
            if type(name) is not str:
                continue
            if type(value) is types.ModuleType:
                aliases.setdefault(id(value), name)
            _look(value, name, wanted, found)
    for mname, module in list(modules.items()):
        if len(found) == len(wanted):
            break
        if type(module) is not types.ModuleType or type(mname) is not str:
            continue
        try:
            d = _MODULE_DICT.__get__(module)
        except Exception:
            continue
        if type(d) is not dict or d is user_ns:
            continue
        prefix = aliases.get(id(module), mname)
        for name, value in list(dict.items(d)):
            if type(name) is str and not name.startswith("__"):
                _look(value, f"{prefix}.{name}", wanted, found)
    return found


def _look(value: Any, path: str, wanted: set[int], found: dict[int, str]) -> None:
    """An int equal to a wanted address at ``path``, or one item down a plain container."""
    t = type(value)
    if t is int:
        if value in wanted and value not in found:
            found[value] = path
        return
    if t is dict:
        items: Iterable[tuple[Any, Any]] = list(dict.items(value))[:MAX_ITEMS]
    elif t is list or t is tuple:
        items = enumerate(list(value)[:MAX_ITEMS])
    else:
        return
    for k, v in items:
        if type(v) is int and v in wanted and v not in found:
            if type(k) is int:
                text = f"{path}[{k}]"
            elif type(k) is str:
                text = f"{path}['{k}']"
            else:
                continue  # a key no line can spell
            if _EXPRESSION.fullmatch(text):
                found[v] = text


def raw_blocks(segments: Iterable[Mapping[str, Any]], device: int,
               covered: Iterable[tuple[int, int]], user_ns: Mapping[Any, Any] | None,
               modules: Mapping[str, Any]) -> list[RawBlock]:
    """The allocated blocks on ``device`` that no ``covered`` range lies in (the holders'
    storages: ``Holder.storages``), largest first and at most ``MAX_BLOCKS``, each with the
    place its pointer is kept where one is found. Only for bytes left unexplained: the
    caller asks when the holders leave some."""
    blocks = uncovered_blocks(segments, device, covered)[:MAX_BLOCKS]
    paths = pointer_paths([a for a, _ in blocks], user_ns, modules)
    return [RawBlock(a, n, paths.get(a, "")) for a, n in blocks]
