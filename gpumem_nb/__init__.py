"""gpumem_nb: see, explain and clean up GPU memory in Jupyter.

``%load_ext gpumem_nb`` hooks every cell; ``gpumem_nb.snapshot()`` reads every source once;
``gpumem_nb.whatif()`` replays a recorded allocation history under other allocator settings.
Importing this package is cheap and imports none of torch, plotly, ipywidgets or pynvml: the
IPython layer and every source load lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__

# Bound here, at import: the package gpumem_nb.whatif shares the function's name, and
# importing a submodule later would otherwise replace the function with the module. It is
# pure Python and standard library only, so importing it costs little.
from .whatif import whatif

if TYPE_CHECKING:
    from collections.abc import Callable

    from .kernel.callbacks import CellCallback
    from .model import CellRecord
    from .views import Snapshot

__all__ = [
    "__version__",
    "history",
    "load_ipython_extension",
    "on_cell",
    "snapshot",
    "unload_ipython_extension",
    "whatif",
]


def snapshot() -> Snapshot:
    """Read NVML, the PyTorch allocator and host RSS once.

    Never imports torch and never creates a CUDA context: allocator figures appear only once
    your own code has initialised CUDA.
    """
    from .views import take

    return take()


def history() -> Any:
    """The per-cell history of this IPython session.

    A pandas DataFrame (one row per cell and GPU) when pandas is installed; otherwise the
    ``History`` object, whose ``to_csv()`` and ``rows()`` need nothing extra.
    """
    import importlib.util

    from .kernel import current_monitor

    monitor = current_monitor()
    if monitor is None:
        raise RuntimeError("gpumem_nb is not loaded here: run %load_ext gpumem_nb first")
    monitor.flush()
    if importlib.util.find_spec("pandas") is None:
        return monitor.history
    return monitor.history.to_dataframe()


def on_cell(callback: Callable[[CellRecord], Any]) -> CellCallback:
    """Call ``callback(record)`` after each top-level cell, with its ``CellRecord``.

    For logging each cell's memory to W&B, TensorBoard or MLflow: the record holds the cell's
    number, duration, whether it raised, host RAM before and after, and per GPU
    (``record.devices``) the allocator's allocated/reserved bytes before and after, the peak,
    and NVML's figures. Every size is in bytes (the ``_bytes`` fields), every time in seconds.

    The callback runs a moment after the cell ends, usually on the sampler's thread (in the
    cell's output context), so keep it quick. One that raises is reported once, as one line;
    it stays registered and its handle counts the failures. Returns a handle:
    ``handle.remove()`` stops the calls (it is also a context manager). The callbacks belong
    to the loaded extension: ``%unload_ext``/``%reload_ext`` clear them.
    """
    from .kernel import current_monitor

    monitor = current_monitor()
    if monitor is None:
        raise RuntimeError("gpumem_nb is not loaded here: run %load_ext gpumem_nb first")
    return monitor.cell_callbacks.add(callback)


def load_ipython_extension(ipython: Any) -> None:
    from .ipython.extension import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from .ipython.extension import unload

    unload(ipython)
