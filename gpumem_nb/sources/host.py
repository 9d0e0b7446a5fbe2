"""Host memory of this process (resident set size), through psutil."""

from __future__ import annotations

from typing import Any


class HostSource:
    """Reads this process's RSS; ``None`` if psutil is missing or the read fails."""

    def __init__(self) -> None:
        self._proc: Any = None
        try:
            import psutil

            self._proc = psutil.Process()
        except Exception:
            self._proc = None

    def rss_bytes(self) -> int | None:
        if self._proc is None:
            return None
        try:
            return int(self._proc.memory_info().rss)
        except Exception:
            return None
