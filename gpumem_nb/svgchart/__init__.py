"""Static pictures of our charts: small standalone SVGs for saved notebooks.

A widget needs a kernel, or its saved state and its JavaScript; a plotly figure needs
plotly.js. An untrusted notebook in JupyterLab, nbconvert's HTML, nbviewer and GitHub show
only the static entries of a display bundle. So every chart (the live one, ``%%gpumem
--trace``'s timeline, ``%gpumem whatif``'s predictions) also renders itself as an SVG, put in
the bundle twice: as ``image/svg+xml``, and as an ``<img>`` with a data URI in ``text/html``
(JupyterLab's sanitizer keeps an img's data URI, and drops inline SVG in untrusted HTML).

One renderer draws them all: ``render_plot`` lays out a ``Plot`` (step lines or stacked areas,
labelled marks, one dashed level, a wrapping legend) so that no two texts overlap. The live
chart's ``ChartData`` (plain lists in bytes and seconds, built from a ``Timeline`` by
``chart_data``) becomes a ``Plot`` in ``live_plot``.

Pure standard library (no numpy, no plotly), so it is cheap to call on a refresh and testable
anywhere.

One job to a file: ``data`` (styles, ``ChartData``), ``layout`` (pixels, ticks, downsampling),
``render`` (``render_plot``), ``liveplot`` (the live chart's ``Plot``) and ``bundle`` (the
display-bundle entries).
"""

from __future__ import annotations

from .bundle import (
    html_img,
    plot_bundle,
    svg_data_uri,
)
from .data import (
    DRAW_ORDER,
    GIB,
    LEGEND_ORDER,
    MAX_POINTS_PER_SERIES,
    MAX_WIDTH_PX,
    STYLES,
    TOTAL_COLOR,
    ChartData,
    Point,
    SeriesStyle,
    chart_data,
    mark_label,
)
from .layout import (
    FONT_PX,
    GLYPH_EM,
    LABEL_BAND_PX,
    LABEL_FONT_PX,
    PLOT_HEIGHT_PX,
    TITLE_BAND_PX,
    WIDTH_PX,
    byte_axis,
    downsample,
    downsample_indices,
    label_gap_px,
    nice_step,
    plot_width_px,
    text_width_px,
    thin_labels,
    tick_text,
    ticks,
)
from .liveplot import (
    describe,
    live_plot,
    render_svg,
    replay_banner,
    static_bundle,
)
from .render import (
    DARK_CSS,
    Line,
    Mark,
    Plot,
    render_plot,
)

__all__ = [
    "DARK_CSS",
    "DRAW_ORDER",
    "FONT_PX",
    "GIB",
    "GLYPH_EM",
    "LABEL_BAND_PX",
    "LABEL_FONT_PX",
    "LEGEND_ORDER",
    "MAX_POINTS_PER_SERIES",
    "MAX_WIDTH_PX",
    "PLOT_HEIGHT_PX",
    "STYLES",
    "TITLE_BAND_PX",
    "TOTAL_COLOR",
    "WIDTH_PX",
    "ChartData",
    "Line",
    "Mark",
    "Plot",
    "Point",
    "SeriesStyle",
    "byte_axis",
    "chart_data",
    "describe",
    "downsample",
    "downsample_indices",
    "html_img",
    "label_gap_px",
    "live_plot",
    "mark_label",
    "nice_step",
    "plot_bundle",
    "plot_width_px",
    "render_plot",
    "render_svg",
    "replay_banner",
    "static_bundle",
    "svg_data_uri",
    "text_width_px",
    "thin_labels",
    "tick_text",
    "ticks",
]
