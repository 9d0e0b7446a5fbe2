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

from dataclasses import dataclass, field

from .rules import (
    SIZE_MAX,
    kLargeBuffer,
    kMB,
    kMinLargeAlloc,
    kRoundUpPowerOfTwoIntervals,
)

BACKEND_NATIVE = "native"
BACKEND_ASYNC = "cudaMallocAsync"

# Accepted by PyTorch, no effect on where device memory goes.
_IGNORED_KEYS = frozenset({
    "release_lock_on_cudamalloc", "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register", "pinned_use_hip_host_register",
    "pinned_num_register_threads", "pinned_use_background_threads",
    "pinned_max_round_threshold_mb", "pinned_max_cached_size_mb",
    "pinned_reserve_segment_size_mb", "pinned_free_catch_all",
    "graph_capture_record_stream_reuse", "throw_on_cudamalloc_oom",
})


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
        return self.text.strip() or "defaults"

    @property
    def modelled(self) -> bool:
        return self.backend == BACKEND_NATIVE


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    buf: list[str] = []
    for ch in text:
        if ch in ",:[]":
            if buf:
                out.append("".join(buf))
                buf = []
            out.append(ch)
        elif ch != " ":
            buf.append(ch)
    if buf:
        out.append("".join(buf))
    return out


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tok = _tokens(text)

    def __getitem__(self, i: int) -> str:
        if i >= len(self.tok):
            raise SettingError(f"{self.text!r} ends too early: a value is missing")
        return self.tok[i]

    def expect(self, i: int, c: str) -> None:
        if self[i] != c:
            raise SettingError(f"{self.text!r}: expected {c!r} but found {self[i]!r}")

    def size_t(self, i: int, key: str) -> int:
        t = self[i]
        if not t.isdigit():
            raise SettingError(f"{key} takes a whole number, not {t!r}")
        return int(t)

    def number(self, i: int, key: str) -> float:
        try:
            return float(self[i])
        except ValueError:
            raise SettingError(f"{key} takes a number, not {self[i]!r}") from None

    def boolean(self, i: int, key: str) -> bool:
        t = self[i]
        if t in ("True", "true"):
            return True
        if t in ("False", "false"):
            return False
        raise SettingError(f"{key} takes True or False, not {t!r}")

    def skip_value(self, i: int) -> int:
        """Past ``key:value`` or ``key:[...]``; returns the index of the value's last token."""
        self.expect(i + 1, ":")
        i += 2
        if self[i] == "[":
            while self[i] != "]":
                i += 1
        return i


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def parse_settings(text: str) -> AllocatorSettings:
    """Read one ``PYTORCH_ALLOC_CONF`` string ("" means the defaults)."""
    if not isinstance(text, str):
        raise SettingError(f"a setting is a PYTORCH_ALLOC_CONF string, not {type(text).__name__}")
    r = _Reader(text)
    values: dict[str, object] = {}
    large = kLargeBuffer
    # large_segment_size_mb first: the minimum of max_split_size_mb depends on it.
    i = 0
    while i < len(r.tok):
        if r.tok[i] == "large_segment_size_mb":
            r.expect(i + 1, ":")
            mb = r.size_t(i + 2, "large_segment_size_mb")
            if mb <= kMinLargeAlloc // kMB:
                raise SettingError(
                    f"large_segment_size_mb must be more than {kMinLargeAlloc // kMB}, not {mb}")
            large = mb * kMB
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
            r.expect(i + 1, ":")
            mb = r.size_t(i + 2, key)
            if mb < large // kMB:
                raise SettingError(f"{key} must be at least {large // kMB}, not {mb}")
            values[key] = mb * kMB
            i += 2
        elif key == "garbage_collection_threshold":
            r.expect(i + 1, ":")
            v = r.number(i + 2, key)
            if not 0.0 < v < 1.0:
                raise SettingError(f"garbage_collection_threshold must be between 0 and 1 "
                                   f"(both excluded), not {r[i + 2]}")
            values[key] = v
            i += 2
        elif key == "roundup_power2_divisions":
            i = _parse_roundup(r, i, divisions)
        elif key == "expandable_segments":
            r.expect(i + 1, ":")
            values[key] = r.boolean(i + 2, key)
            i += 2
        elif key == "backend":
            r.expect(i + 1, ":")
            b = r[i + 2]
            if b not in (BACKEND_NATIVE, BACKEND_ASYNC):
                raise SettingError(f"backend is native or cudaMallocAsync, not {b!r}")
            values[key] = b
            i += 2
        elif key == "per_process_memory_fraction":
            r.expect(i + 1, ":")
            v = r.number(i + 2, key)
            if not 0.0 <= v <= 1.0:
                raise SettingError(f"per_process_memory_fraction must be in [0, 1], not {v}")
            values[key] = v
            i += 2
        elif key in _IGNORED_KEYS:
            ignored.append(key)
            i = r.skip_value(i)
        elif key in ",:[]":
            raise SettingError(f"{text!r}: unexpected {key!r}")
        else:
            raise SettingError(f"{key!r} is not an allocator setting PyTorch knows (it would "
                               "refuse it when CUDA starts)")
        if i + 1 < len(r.tok):
            r.expect(i + 1, ",")
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
    first value also covers everything below its boundary, ``>`` everything after the last)."""
    key = "roundup_power2_divisions"
    r.expect(i + 1, ":")
    i += 2
    if r[i] != "[":
        v = r.size_t(i, key)
        if not _is_pow2(v):
            raise SettingError(f"{key} must be a power of two, not {v}")
        divisions[:] = [v] * len(divisions)
        return i
    first = True
    last_index = 0
    i += 1
    while r[i] != "]":
        bound = r[i]
        r.expect(i + 1, ":")
        v = r.size_t(i + 2, key)
        if v != 0 and not _is_pow2(v):
            raise SettingError(f"{key}: divisions must be a power of two or 0, not {v}")
        if bound == ">":
            for k in range(last_index + 1, len(divisions)):
                divisions[k] = v
        else:
            if not bound.isdigit() or not _is_pow2(int(bound)):
                raise SettingError(f"{key}: interval boundaries are powers of two (MiB), "
                                   f"not {bound!r}")
            index = min(int(bound).bit_length() - 1, len(divisions) - 1)
            if first:
                for k in range(index):
                    divisions[k] = v
                first = False
            divisions[index] = v
            last_index = index
        i += 3
        if r[i] == ",":
            i += 1
        elif r[i] != "]":
            raise SettingError(f"{key}: expected ',' or ']' but found {r[i]!r}")
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
