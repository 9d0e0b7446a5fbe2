"""Functions the GPU tests start in child processes (importable by spawned children)."""

from __future__ import annotations

import os
import time


def hold(rank: int, nbytes: int, device: str, ready: str, release: str) -> None:
    """``torch.multiprocessing``'s worker: hold ``nbytes`` on ``device`` until ``release``
    exists (at most two minutes)."""
    import torch

    kept = torch.empty(nbytes, dtype=torch.uint8, device=device)
    if device == "cuda":
        torch.cuda.synchronize()
    open(ready, "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.1)
    del kept
