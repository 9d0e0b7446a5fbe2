"""The live chart, one job to a file: ``series`` (the data, pure), ``live`` (the view and its
one writer, the only ipywidgets importer), ``picture`` (its outputs and their display ids) and
``livechart`` (the anywidget, the only anywidget importer, with ``livechart.js`` and
``livechart.css`` beside it). The static pictures it shares with the trace and the what-if are
``gpumem_nb.svgchart`` and ``gpumem_nb.plotlyjson``.

Nothing here is imported until a chart is shown (``%gpumem watch``).
"""

from __future__ import annotations

__all__: list[str] = []
