"""``PYTORCH_ALLOC_CONF`` strings read the way PyTorch reads them.

Follows ``c10/core/AllocatorConfig.cpp`` (``AcceleratorAllocatorConfig::parseArgs``) and the
CUDA keys of ``c10/cuda/CUDAAllocatorConfig.cpp``: the same tokens (``,`` ``:`` ``[`` ``]``
separate, spaces vanish), the same keys, the same range checks, so a setting PyTorch would
refuse at CUDA start-up is refused here with a plain sentence instead of predicted.

Keys that change what the model predicts are parsed into ``AllocatorSettings``; keys PyTorch
accepts that only concern pinned host memory, locking or IPC are kept by name in
``ignored_keys`` and change nothing.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field

from .fields import plain, quoted
from .rules import (
    SIZE_MAX,
    kLargeBuffer,
    kMB,
    kMinLargeAlloc,
    kRoundUpPowerOfTwoIntervals,
)

__all__ = [
    "BACKEND_ASYNC",
    "BACKEND_NATIVE",
    "LABEL_CHARS",
    "AllocatorSettings",
    "SettingError",
    "parse_settings",
    "settings_of_snapshot",
]

BACKEND_NATIVE = "native"
BACKEND_ASYNC = "cudaMallocAsync"

# Accepted by PyTorch, no effect on where device memory goes. The first ones PyTorch reads as
# True or False (``toBool``), so their values are checked; the others' are skipped.
_IGNORED_BOOL_KEYS = frozenset({
    "release_lock_on_cudamalloc", "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register", "pinned_use_hip_host_register",
    "graph_capture_record_stream_reuse",
})
_IGNORED_KEYS = frozenset({
    "pinned_num_register_threads", "pinned_max_round_threshold_mb",
    "pinned_max_cached_size_mb", "pinned_reserve_segment_size_mb", "pinned_free_catch_all",
    "throw_on_cudamalloc_oom",
})
_C_SPACE = frozenset(" \t\n\v\f\r")  # C's isspace, the only characters the tokenizer drops
_STOULL = re.compile(r"([+-]?)([0-9]+)", re.ASCII)
_STOD = re.compile(r"""[+-]?(?:
    0x(?:[0-9a-f]+\.?[0-9a-f]*|\.[0-9a-f]+)(?:p[+-]?[0-9]+)?
  | (?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?
  | inf(?:inity)? | nan(?:\([0-9a-z_]*\))?)""", re.ASCII | re.IGNORECASE | re.VERBOSE)
LABEL_CHARS = 80  # a setting's label in the table and the chart


class SettingError(ValueError):
    """A setting PyTorch would refuse; the message is a plain sentence."""


@dataclass(frozen=True)
class AllocatorSettings:
    """One allocator configuration, as the model uses it (sizes in bytes)."""

    text: str = ""
    backend: str = BACKEND_NATIVE
    expandable_segments: bool = False
    max_split_size: int = SIZE_MAX
    max_non_split_rounding_size: int = kLargeBuffer
    large_segment_size: int = kLargeBuffer
    garbage_collection_threshold: float = 0.0
    # Per power-of-two interval from 1 MiB to 64 GiB (index 0 covers everything below 2 MiB).
    roundup_power2_divisions: tuple[int, ...] = (0,) * kRoundUpPowerOfTwoIntervals
    per_process_memory_fraction: float | None = None
    ignored_keys: tuple[str, ...] = field(default=())

    @property
    def label(self) -> str:
        return plain(self.text.strip(), LABEL_CHARS) or "defaults"

    @property
    def modelled(self) -> bool:
        return self.backend == BACKEND_NATIVE


def _tokens(text: str) -> list[str]:
    """``ConfigTokenizer``: ``,`` ``:`` ``[`` ``]`` are tokens of their own and ASCII
    whitespace (C's ``isspace``) vanishes, also inside a value (``6 4`` reads as 64)."""
    out: list[str] = []
    buf: list[str] = []
    for ch in text:
        if ch in ",:[]":
            if buf:
                out.append("".join(buf))
                buf = []
            out.append(ch)
        elif ch not in _C_SPACE:
            buf.append(ch)
    if buf:
        out.append("".join(buf))
    return out


class _Reader:
    """``ConfigTokenizer``'s reads. Like PyTorch's ``checkToken``, ``sep`` only checks that a
    token is there: PyTorch never looks at which one (``max_split_size_mb[64`` is read as
    ``max_split_size_mb:64``)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tok = _tokens(text)

    def __getitem__(self, i: int) -> str:
        if i >= len(self.tok):
            raise SettingError(f"{quoted(self.text)} ends too early: a value is missing")
        return self.tok[i]

    def sep(self, i: int) -> None:
        self[i]

    def size_t(self, i: int, key: str) -> int:
        """``std::stoull``: an optional sign, then ASCII digits, the rest of the token
        ignored (``64abc`` is 64); a minus wraps around as in C (``-1`` is 2**64 - 1)."""
        t = self[i]
        m = _STOULL.match(t)
        if m is None:
            raise SettingError(f"{key} takes a whole number, not {quoted(t)}")
        digits = m.group(2).lstrip("0") or "0"
        if len(digits) > 20 or int(digits) > SIZE_MAX:
            raise SettingError(f"{key}: {quoted(t)} is too large (PyTorch reads it as a 64-bit "
                               "number and refuses it)")
        v = int(digits)
        return -v % (SIZE_MAX + 1) if m.group(1) == "-" else v

    def number(self, i: int, key: str) -> float:
        """``std::stod``: the longest number at the start of the token (decimal, hex,
        ``inf``, ``nan``); a value out of a double's range is refused, as PyTorch does."""
        t = self[i]
        m = _STOD.match(t)
        if m is None:
            raise SettingError(f"{key} takes a number, not {quoted(t)}")
        s = m.group(0)
        body = s.lstrip("+-").lower()
        try:
            v = float.fromhex(s) if body.startswith("0x") else float(s)
        except OverflowError:
            v = math.inf
        finite_text = not body.startswith(("inf", "nan"))
        tiny = v == 0.0 and any(c in "123456789abcdef" for c in body.split("p")[0].split("e")[0]
                                .removeprefix("0x"))
        if finite_text and (math.isinf(v) or tiny or 0.0 < abs(v) < sys.float_info.min):
            raise SettingError(f"{key}: {quoted(t)} is out of a double's range (PyTorch "
                               "refuses it)")
        return v

    def boolean(self, i: int, key: str) -> bool:
        t = self[i]
        if t == "True":
            return True
        if t == "False":
            return False
        raise SettingError(f"{key} takes True or False (capitalised, as PyTorch reads it), "
                           f"not {quoted(t)}")

    def skip_value(self, i: int) -> int:
        """``skipKey``: past ``key:value`` or ``key:[...]``; the index of the value's last
        token."""
        self.sep(i + 1)
        i += 2
        if self[i] == "[":
            i += 1
            while self[i] != "]":
                i += 1
        return i


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def parse_settings(text: str) -> AllocatorSettings:
    """Read one ``PYTORCH_ALLOC_CONF`` string ("" means the defaults), token by token as
    ``AcceleratorAllocatorConfig::parseArgs`` and the CUDA keys' parser read it."""
    if not isinstance(text, str):
        raise SettingError(f"a setting is a PYTORCH_ALLOC_CONF string, not {type(text).__name__}")
    r = _Reader(text)
    values: dict[str, object] = {}
    large = kLargeBuffer
    # large_segment_size_mb first: the minimum of max_split_size_mb depends on it.
    i = 0
    while i < len(r.tok):
        if r.tok[i] == "large_segment_size_mb":
            r.sep(i + 1)
            mb = r.size_t(i + 2, "large_segment_size_mb")
            if mb <= kMinLargeAlloc // kMB:
                raise SettingError(
                    f"large_segment_size_mb must be more than {kMinLargeAlloc // kMB}, not {mb}")
            large = min(mb, SIZE_MAX // kMB) * kMB
            i += 2
        i += 1
    divisions = [0] * kRoundUpPowerOfTwoIntervals
    ignored: list[str] = []
    i = 0
    while i < len(r.tok):
        key = r[i]
        if key == "large_segment_size_mb":
            i = r.skip_value(i)
        elif key in ("max_split_size_mb", "max_non_split_rounding_mb"):
            r.sep(i + 1)
            mb = r.size_t(i + 2, key)
            if mb < large // kMB:
                raise SettingError(f"{key} must be at least {large // kMB}, not {mb}")
            values[key] = min(mb, SIZE_MAX // kMB) * kMB
            i += 2
        elif key == "garbage_collection_threshold":
            r.sep(i + 1)
            v = r.number(i + 2, key)
            if not 0.0 < v < 1.0:
                raise SettingError(f"garbage_collection_threshold must be between 0 and 1 "
                                   f"(both excluded), not {quoted(r[i + 2])}")
            values[key] = v
            i += 2
        elif key == "roundup_power2_divisions":
            i = _parse_roundup(r, i, divisions)
        elif key in ("expandable_segments", "pinned_use_background_threads") or \
                key in _IGNORED_BOOL_KEYS:
            r.sep(i + 1)
            values[key] = r.boolean(i + 2, key)
            if key != "expandable_segments":
                ignored.append(key)
            i += 2
        elif key == "backend":
            r.sep(i + 1)
            b = r[i + 2]
            if b not in (BACKEND_NATIVE, BACKEND_ASYNC):
                raise SettingError(f"backend is native or cudaMallocAsync, not {quoted(b)}")
            values[key] = b
            i += 2
        elif key == "per_process_memory_fraction":
            r.sep(i + 1)
            v = r.number(i + 2, key)
            if not 0.0 <= v <= 1.0:
                raise SettingError(f"per_process_memory_fraction must be in [0, 1], not "
                                   f"{quoted(r[i + 2])}")
            values[key] = v
            i += 2
        elif key in _IGNORED_KEYS:
            ignored.append(key)
            i = r.skip_value(i)
        elif key in ",:[]":
            raise SettingError(f"{quoted(text)}: unexpected {key!r}")
        else:
            raise SettingError(f"{quoted(key)} is not an allocator setting PyTorch knows (it "
                               "would refuse it when CUDA starts)")
        if i + 1 < len(r.tok):
            r.sep(i + 1)  # the ',' (any token: PyTorch does not check which)
            i += 1
        i += 1
    fraction = values.get("per_process_memory_fraction")
    return AllocatorSettings(
        text=text,
        backend=str(values.get("backend", BACKEND_NATIVE)),
        expandable_segments=bool(values.get("expandable_segments", False)),
        max_split_size=int(values.get("max_split_size_mb", SIZE_MAX)),  # type: ignore[call-overload]
        max_non_split_rounding_size=int(
            values.get("max_non_split_rounding_mb", large)),  # type: ignore[call-overload]
        large_segment_size=large,
        garbage_collection_threshold=float(
            values.get("garbage_collection_threshold", 0.0)),  # type: ignore[arg-type]
        roundup_power2_divisions=tuple(divisions),
        per_process_memory_fraction=None if fraction is None else float(fraction),  # type: ignore[arg-type]
        ignored_keys=tuple(ignored),
    )


def _parse_roundup(r: _Reader, i: int, divisions: list[int]) -> int:
    """Both forms: ``roundup_power2_divisions:4`` (every interval) and
    ``roundup_power2_divisions:[256:1,512:2,>:4]`` (boundaries in MiB, powers of two; the
    first value also covers everything below its boundary, ``>`` everything after the last),
    read as ``parseRoundUpPower2Divisions`` reads them."""
    key = "roundup_power2_divisions"
    r.sep(i + 1)
    i += 2
    if r[i] != "[":
        v = r.size_t(i, key)
        if not _is_pow2(v):
            raise SettingError(f"{key} must be a power of two, not {quoted(r[i])}")
        divisions[:] = [v] * len(divisions)
        return i
    first = True
    last_index = 0
    i += 1
    while r[i] != "]":
        bound_at = i
        r.sep(i + 1)
        v = r.size_t(i + 2, key)
        i += 2
        if v != 0 and not _is_pow2(v):
            raise SettingError(f"{key}: divisions must be a power of two or 0, not "
                               f"{quoted(r[i])}")
        if r[bound_at] == ">":
            for k in range(last_index + 1, len(divisions)):
                divisions[k] = v
        else:
            bound = r.size_t(bound_at, key)
            if not _is_pow2(bound):
                raise SettingError(f"{key}: interval boundaries are powers of two (MiB), "
                                   f"not {quoted(r[bound_at])}")
            index = min(bound.bit_length() - 1, len(divisions) - 1)
            if first:
                for k in range(index):
                    divisions[k] = v
                first = False
            divisions[index] = v
            last_index = index
        if r[i + 1] != "]":
            i += 1  # the ',' (unchecked, as in PyTorch)
        i += 1
    return i


def settings_of_snapshot(snapshot: object) -> tuple[str, str]:
    """(the setting a snapshot was recorded under, a note when it had to be guessed).

    ``allocator_settings`` carries the last string PyTorch parsed, always under the name
    ``PYTORCH_CUDA_ALLOC_CONF`` whichever variable set it; older snapshots only the parsed
    values, from which the keys that matter are rebuilt.
    """
    s = snapshot.get("allocator_settings") if isinstance(snapshot, dict) else None
    if not isinstance(s, dict):
        return "", ("The snapshot does not say which allocator setting it was recorded "
                    "under; the defaults are assumed.")
    text = s.get("PYTORCH_CUDA_ALLOC_CONF")
    if isinstance(text, str):
        return text, ""
    parts = []
    if s.get("expandable_segments"):
        parts.append("expandable_segments:True")
    mss = s.get("max_split_size")
    if isinstance(mss, int) and 0 < mss < SIZE_MAX and mss % kMB == 0:
        parts.append(f"max_split_size_mb:{mss // kMB}")
    gc = s.get("garbage_collection_threshold")
    if isinstance(gc, (int, float)) and 0 < gc < 1:
        parts.append(f"garbage_collection_threshold:{gc}")
    return ",".join(parts), "The allocator setting was rebuilt from the snapshot's values."
