"""A picture in a display bundle: ``image/svg+xml``, and the same SVG as an ``<img>`` with a
data URI in ``text/html`` (JupyterLab's sanitizer keeps it in untrusted notebooks).
"""

from __future__ import annotations

import base64

from .render import Plot, _xml, render_plot

__all__ = [
    "html_img",
    "plot_bundle",
    "svg_data_uri",
]


def svg_data_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def html_img(svg: str, alt: str) -> str:
    """An ``<img>`` that survives JupyterLab's sanitizer in untrusted notebooks and nbviewer."""
    # Scaled down in an output narrower than the picture, never sideways scrolling.
    return (f'<img src="{svg_data_uri(svg)}" alt="{_xml(alt)}" '
            'style="max-width:100%;height:auto">')


def plot_bundle(plot: Plot) -> dict[str, str]:
    """A picture as display-bundle entries: ``image/svg+xml``, and the same SVG as an
    ``<img>`` in ``text/html`` (what nbconvert's HTML and untrusted views show)."""
    svg = render_plot(plot)
    return {"image/svg+xml": svg, "text/html": html_img(svg, plot.summary)}
