"""Everything that touches hardware or frameworks lives here; the rest of the package sees
only the records in ``gpumem_nb.model``. Importing this package imports none of pynvml,
torch or psutil: each source loads its library on first use."""

from __future__ import annotations

from typing import Protocol

from ..model import Sample, SourceStatus

__all__ = ["Source"]


class Source(Protocol):
    """What the sampler and the notebook layer need from a source of readings."""

    def start(self) -> bool: ...

    def read(self, *, processes: bool | None = None) -> Sample:
        """One reading. False: the cheap hot-path variant; True: everything; None: the
        source decides (the sampler's periodic reads)."""
        ...

    def status(self) -> SourceStatus: ...

    def close(self) -> None: ...
