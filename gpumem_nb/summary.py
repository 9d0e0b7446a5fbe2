"""``%gpumem summary``: the allocator's state in plain words, with hints that apply to it."""

from __future__ import annotations

import html
from dataclasses import dataclass

from .emptycache import from_stats
from .model import AllocatorInfo, Sample, SourceStatus
from .report import Shown
from .units import format_bytes

__all__ = ["Summary", "hints"]

_NATIVE_ONLY = ("max_split_size_mb", "garbage_collection_threshold",
                "roundup_power2_divisions", "expandable_segments")
_SPLIT_HINT_MIN_BYTES = 256 << 20
_CACHE_HINT_MIN_BYTES = 1 << 30


def hints(sample: Sample, info: AllocatorInfo | None, device: int) -> list[str]:
    d = sample.device(device)
    al = d.allocator if d else None
    out: list[str] = []
    if info is not None and info.backend == "cudaMallocAsync":
        ignored = [k for k in _NATIVE_ONLY if k in info.conf]
        if ignored:
            out.append(
                f"{', '.join(ignored)} in {info.conf_var} only apply to the native backend; "
                "cudaMallocAsync ignores them."
            )
    if al is None:
        return out
    split = al.inactive_split_bytes
    native = info is None or info.backend == "native"
    expandable = info is not None and "expandable_segments:true" in info.conf.lower()
    if native and not expandable and split > max(_SPLIT_HINT_MIN_BYTES, al.reserved_bytes // 10):
        out.append(
            f"{format_bytes(split)} sits in split blocks that cannot be returned (fragmentation). "
            "Set PYTORCH_ALLOC_CONF=expandable_segments:True before CUDA starts (restart the "
            "kernel): blocks are still split, but the free pages of a partly used segment "
            "can then be returned to the driver and mapped again for larger requests."
        )
    if al.num_alloc_retries:
        out.append(
            f"{al.num_alloc_retries} time(s) the allocator could not get memory (from the "
            "driver, or under a memory fraction's cap), freed its cached blocks and retried. "
            "A retry that then succeeds is no OOM, but each is slow (it waits for the GPU and "
            "empties the cache), and many mean the work runs at the edge of what it may use: "
            "use smaller batches, free tensors you no longer need, or enable expandable "
            "segments."
        )
    if al.num_ooms:
        out.append(f"{al.num_ooms} out-of-memory error(s) so far in this process.")
    cached = al.reserved_bytes - al.allocated_bytes
    if cached > _CACHE_HINT_MIN_BYTES:
        # PyTorch's own requests reuse it, and its allocator empties the cache itself before
        # an OOM; what cannot use it is everything outside that cache.
        text = (f"{format_bytes(cached)} is cached but free. PyTorch reuses it without "
                "asking the driver; nothing outside its cache (other processes, other "
                "libraries in this one) can use it until it is released "
                "(%gpumem cleanup calls empty_cache)")
        returnable = from_stats(al)
        kept = cached - returnable
        # empty_cache frees only segments with nothing in them (emptycache.py). Said only
        # when what it keeps shows: "only 1.50 GiB of 1.50 GiB" read as a contradiction.
        if native and not expandable and kept > max(2 << 20, cached // 100):
            text += (f", and empty_cache can release only {format_bytes(returnable)} of it: "
                     f"the other {format_bytes(kept)} lies in segments that still hold "
                     "tensors")
        out.append(text + ".")
    return out


@dataclass(frozen=True)
class Summary(Shown):
    lines: tuple[str, ...]
    hints: tuple[str, ...]
    full_text: str = ""

    @classmethod
    def of(cls, sample: Sample, status: SourceStatus, *, device: int = 0,
           full_text: str = "") -> Summary:
        d = sample.device(device)
        lines: list[str] = []
        if d is None:
            lines.append(f"No GPU {device} visible: {status.nvml}.")
        elif d.allocator is None:
            lines.append(f"GPU {device}: {status.torch}; PyTorch's allocator holds nothing yet.")
        else:
            al = d.allocator
            lines += [
                f"GPU {device}: PyTorch reserved {format_bytes(al.reserved_bytes)} from the "
                f"driver; live tensors use {format_bytes(al.allocated_bytes)} of it and "
                f"{format_bytes(al.reserved_bytes - al.allocated_bytes)} is cached free blocks.",
                f"Peaks since start or the last reset: allocated "
                f"{format_bytes(al.peak_allocated_bytes)}, reserved "
                f"{format_bytes(al.peak_reserved_bytes)}.",
                f"Inactive split (non-releasable): {format_bytes(al.inactive_split_bytes)}; "
                f"allocation retries: {al.num_alloc_retries}; OOMs: {al.num_ooms}.",
            ]
            if d.outside_pytorch_bytes is not None:
                lines.append(
                    f"Outside PyTorch (CUDA context, libraries, other allocators): "
                    f"{format_bytes(d.outside_pytorch_bytes)}."
                )
        if status.allocator is not None:
            conf = status.allocator.conf or "no PYTORCH_ALLOC_CONF"
            lines.append(f"Backend: {status.allocator.backend} ({conf}).")
        return cls(tuple(lines), tuple(hints(sample, status.allocator, device)), full_text)

    def __str__(self) -> str:
        parts = list(self.lines)
        parts += [f"hint: {h}" for h in self.hints]
        if self.full_text:
            parts += ["", self.full_text]
        return "\n".join(parts)

    def _repr_html_(self) -> str:
        body = "".join(f"<p>{html.escape(x)}</p>" for x in self.lines)
        if self.hints:
            body += "<ul>" + "".join(f"<li>{html.escape(h)}</li>" for h in self.hints) + "</ul>"
        if self.full_text:
            body += f"<pre>{html.escape(self.full_text)}</pre>"
        return body
