"""gpumem_nb: see, explain and clean up GPU memory in Jupyter.

``%load_ext gpumem_nb`` hooks every cell; ``gpumem_nb.snapshot()`` reads every source once.
Importing this package is cheap and imports none of torch, plotly, ipywidgets or pynvml: the
IPython layer and every source load lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .snapshot import Snapshot

__all__ = ["__version__", "load_ipython_extension", "snapshot", "unload_ipython_extension"]


def snapshot() -> Snapshot:
    """Read NVML, the PyTorch allocator and host RSS once.

    Never imports torch and never creates a CUDA context: allocator figures appear only once
    your own code has initialised CUDA.
    """
    from .snapshot import take

    return take()


def load_ipython_extension(ipython: Any) -> None:
    from .magics import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from .magics import unload

    unload(ipython)
