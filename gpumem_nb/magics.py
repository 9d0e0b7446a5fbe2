"""The names the tutorials import from ``gpumem_nb.magics`` (``current_monitor``), kept where
they were: the IPython layer is ``gpumem_nb.ipython`` and the engine ``gpumem_nb.kernel``."""

from __future__ import annotations

from .ipython.extension import current_monitor, load, unload

__all__ = ["current_monitor", "load", "unload"]
