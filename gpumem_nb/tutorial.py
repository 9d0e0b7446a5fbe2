"""What the tutorials need before their first cell runs: an NVIDIA GPU and PyTorch.

Tutorials 01 onwards ship outputs from a GPU run. Run All on a laptop used to fail on the first
code cell with a two-part traceback (``NVMLError_LibraryNotFound``, ``No module named
'torch'``) after JupyterLab had replaced the shipped outputs of every cell it reached.
``require_gpu()``, the first line of each tutorial's first code cell, stops there with one
sentence instead: JupyterLab's Run All stops at a cell that raises, so no later cell runs and
no later output is replaced.

It checks without importing torch and without creating a CUDA context (the tutorials measure
both): torch is looked up with ``importlib.util.find_spec``, and the GPUs are counted through
NVML, which never creates a context, in the order CUDA would see them
(``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from .sources.nvml import NvmlSource

__all__ = ["NeedsGpu", "missing", "require_gpu"]


class NeedsGpu(Exception):
    """This machine cannot run a GPU tutorial. IPython shows what ``_render_traceback_``
    returns instead of a traceback: the one sentence."""

    def _render_traceback_(self) -> list[str]:
        return [str(self)]


def missing(nvml: NvmlSource | None = None,
            find_spec: Callable[[str], Any] = importlib.util.find_spec) -> list[str]:
    """What this machine lacks to run the tutorials, in words; empty when nothing.
    ``nvml`` and ``find_spec`` are injected by tests."""
    lacks = []
    if find_spec("torch") is None:
        lacks.append("PyTorch is not installed")
    source = nvml if nvml is not None else NvmlSource()
    try:
        if not source.start():
            lacks.append(source.status)
        elif not source.cuda_order():
            lacks.append("no NVIDIA GPU is visible (CUDA_VISIBLE_DEVICES hides them all)"
                         if source.devices else "the driver lists no NVIDIA GPU")
    finally:
        source.close()
    return lacks


def require_gpu(nvml: NvmlSource | None = None,
                find_spec: Callable[[str], Any] = importlib.util.find_spec) -> None:
    """Raise ``NeedsGpu`` with one sentence when this machine cannot run the tutorial; on a
    GPU machine with torch, return and print nothing."""
    lacks = missing(nvml, find_spec)
    if lacks:
        raise NeedsGpu(
            "This tutorial runs only with an NVIDIA GPU and PyTorch (here: "
            f"{'; '.join(lacks)}), so it stops before its other cells replace the outputs "
            "saved from a GPU run.")
