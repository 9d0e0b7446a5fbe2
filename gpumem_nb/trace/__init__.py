"""``%%gpumem --trace``: record one cell's allocations and say which lines took the memory.

``CellTracer`` switches PyTorch's allocation history on before the cell and off after it,
leaving a recording the user already had running untouched (switching history off clears
its buffer, so a running recording is read, never toggled). It never starts CUDA: with CUDA
not yet initialised, or under ``cudaMallocAsync`` (which records no history), it says so and
the cell runs untraced.

``analyze`` replays the snapshot's trace entries (pure, table-testable): which allocation
sites held the most bytes at the cell's peak, which are still alive at its end (leak
candidates), and which were live when an OOM entry was recorded. The timeline is a plain
plotly JSON figure for the ``application/vnd.plotly.v1+json`` mime type, which JupyterLab's
bundled plotly renderer draws without any CDN, with a static SVG picture of the same data
in the bundle for every other viewer (``svgchart``). ``--save`` pickles the raw snapshot at
protocol 4, the newest that PyTorch's memory_viz reader accepts.

One job to a file:

- ``sites``: an allocation's site (``Site``, ``site_of``) and its label as shown;
- ``entries``: the checks that tell a history entry torch writes from anything else;
- ``frames``: each allocation's frames to a site, each distinct frame read once;
- ``replay``: ``analyze``, the one pass over a device's history (``DeviceTrace``);
- ``recorder``: ``CellTracer``, arming and reading the recording; ``save_snapshot``;
- ``report``: ``TraceReport`` and ``views``, what the cell displays;
- ``timeline``: ``TraceTimeline``, the plotly figure and its SVG picture.
"""

from __future__ import annotations

from .recorder import MAX_ENTRIES, CellTracer, TraceResult, save_snapshot
from .replay import TOP_DEFAULT, DeviceTrace, MiB, Series, SiteBytes, analyze
from .report import TraceReport, views
from .sites import Site, library_dirs, site_of
from .timeline import TraceTimeline

__all__ = [
    "MAX_ENTRIES",
    "TOP_DEFAULT",
    "CellTracer",
    "DeviceTrace",
    "MiB",
    "Series",
    "Site",
    "SiteBytes",
    "TraceReport",
    "TraceResult",
    "TraceTimeline",
    "analyze",
    "library_dirs",
    "save_snapshot",
    "site_of",
    "views",
]
