"""The OOM message: every format PyTorch has printed (torch 1.x's ``(GPU 0; ... total
capacity; ...)``, 2.1's "capacty", 2.2+'s sentences, the ``cudaMallocAsync`` backend's table,
driver and library "out of memory" errors) read into one ``OomMessage``; and finding the CUDA
OOM in an exception chain."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .. import userexc
from ..errtext import error_str

__all__ = [
    "FORM_ASYNC",
    "FORM_CLASSIC",
    "FORM_DRIVER",
    "FORM_NATIVE",
    "FORM_SIZE_CHECK",
    "FORM_UNKNOWN",
    "WINDOW_CHARS",
    "GiB",
    "MiB",
    "OomMessage",
    "find_cuda_oom",
    "first_line",
    "is_cuda_oom",
    "parse_oom_message",
]

GiB = 1 << 30
MiB = 1 << 20


FORM_NATIVE = "native"  # torch >= 2.1: "GPU 0 has a total capacity of ..."
FORM_CLASSIC = "native (torch < 2.1)"  # "(GPU 0; 15.78 GiB total capacity; ...)"
FORM_ASYNC = "cudaMallocAsync"  # "Allocation on device 0 would exceed allowed memory."
FORM_SIZE_CHECK = "size check"  # "Tried to allocate more than 1EB memory."
FORM_DRIVER = "CUDA runtime or library"  # "CUDA error: out of memory", cuBLAS/cuDNN
FORM_UNKNOWN = "unrecognised"

# c10's format_size prints "N bytes", or two decimals of KiB/MiB/GiB.
#
# Every pattern here runs on the text of any exception a cell raises, so each must take time
# linear in the text, whatever it holds (a 1,200-space run once froze the kernel for
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
