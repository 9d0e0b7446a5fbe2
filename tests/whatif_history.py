"""Synthetic allocation histories, written the way torch records them (``alloc``,
``free_requested``, ``free_completed``), for the what-if tests and benchmark."""

from __future__ import annotations

from typing import Any

MiB = 1 << 20


class History:
    """``a = h.alloc(16 * MiB)``, ``h.free(a)``; ``h.snapshot()`` is what ``whatif`` reads."""

    def __init__(self, setting: str = "") -> None:
        self.entries: list[dict[str, Any]] = []
        self.setting = setting
        self._next = 0x7F00_0000_0000
        self._t = 1_000_000.0
        self._sizes: dict[int, int] = {}

    def _entry(self, action: str, addr: int, size: int, stream: int) -> None:
        self._t += 10.0
        self.entries.append({"action": action, "addr": addr, "size": size, "stream": stream,
                             "time_us": self._t})

    def alloc(self, size: int, stream: int = 0) -> int:
        addr = self._next
        self._next += 1 << 32  # trace addresses only name allocations; never reused here
        self._sizes[addr] = size
        self._entry("alloc", addr, size, stream)
        return addr

    def free(self, addr: int, stream: int = 0, *, completed: bool = True) -> None:
        size = self._sizes[addr]
        self._entry("free_requested", addr, size, stream)
        if completed:
            self._entry("free_completed", addr, size, stream)

    def complete(self, addr: int, stream: int = 0) -> None:
        self._entry("free_completed", addr, self._sizes[addr], stream)

    def empty_cache(self, freed_bytes: int) -> None:
        """What the recorded allocator writes when the user empties its cache."""
        self._entry("segment_free", 0x1000, freed_bytes, 0)

    def snapshot(self, segments: list[dict[str, Any]] | None = None,
                 start: dict[str, Any] | None = None, *, recorded_start: bool = True,
                 ) -> dict[str, Any]:
        """By default as ``%%gpumem --trace`` keeps it: the start recorded (empty unless
        ``start`` says otherwise); ``recorded_start=False`` as ``_dump_snapshot`` writes it."""
        snap: dict[str, Any] = {
            "segments": segments or [], "device_traces": [list(self.entries)],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": self.setting}}
        if recorded_start:
            snap["gpumem_start"] = start if start is not None else {"segments": []}
        return snap
