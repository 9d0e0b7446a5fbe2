"""The per-kernel engine: one ``Monitor`` for each loaded extension, and its parts.

Nothing here imports IPython, ipywidgets or the chart: the IPython layer (``gpumem_nb.ipython``)
and the chart (``gpumem_nb.chart``) sit on top of it and reach it through ``Monitor``'s
queries.
"""

from __future__ import annotations

from .cellresult import error_text
from .configure import UNCHANGED
from .monitor import Monitor, current_monitor

__all__ = ["UNCHANGED", "Monitor", "current_monitor", "error_text"]
