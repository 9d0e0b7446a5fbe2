"""The layout our plotly JSON figures share (``%%gpumem --trace``'s timeline and ``%gpumem
whatif``'s chart): plain dicts for the ``application/vnd.plotly.v1+json`` mime type, so
nothing here imports plotly.

Nothing overlaps at any output width (a legend placed by plotly's defaults covered the x axis
and its title in a narrow output). The title sits under the modebar's band and left-aligned,
marks' labels under the title, and the legend has a band of its own below the x axis title,
one row per entry at worst (a narrow output, long names).

The figures follow JupyterLab's theme, light or dark: plotly.js's defaults paint a white paper
and plot area with dark text (a white card in the dark theme, and so was the PNG JupyterLab
saves of it), so both backgrounds are transparent and every text, axis and grid line is a
neutral grey that reads on either. The hover box, drawn over the lines, keeps a background of
its own.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NEUTRAL", "config", "layout"]

# Text and marks that read on a light and on a dark background alike.
NEUTRAL = "#888888"
_TRANSPARENT = "rgba(0,0,0,0)"
_GRID = "rgba(136,136,136,0.25)"
_ZERO_LINE = "rgba(136,136,136,0.6)"

_LEGEND_ROW_PX = 22
_CONFIG = {"displaylogo": False, "modeBarButtonsToRemove": [
    "select2d", "lasso2d", "autoScale2d", "toggleSpikelines", "hoverClosestCartesian",
    "hoverCompareCartesian"]}


def _axis(title: str) -> dict[str, Any]:
    return {"title": {"text": title}, "color": NEUTRAL, "gridcolor": _GRID,
            "zerolinecolor": _ZERO_LINE, "linecolor": _ZERO_LINE}


def layout(title: str, x_title: str, y_title: str, *, legend_entries: int,
           height_px: int = 340) -> dict[str, Any]:
    legend_px = _LEGEND_ROW_PX * legend_entries
    return {
        "paper_bgcolor": _TRANSPARENT,
        "plot_bgcolor": _TRANSPARENT,
        "font": {"color": NEUTRAL},
        "hoverlabel": {"bgcolor": "#2b2b2b", "bordercolor": NEUTRAL,
                       "font": {"color": "#f2f2f2"}},
        "modebar": {"bgcolor": _TRANSPARENT, "color": NEUTRAL, "activecolor": "#bbbbbb"},
        "title": {"text": title, "x": 0, "xanchor": "left", "xref": "paper",
                  "yref": "container", "y": 1, "yanchor": "top", "pad": {"t": 34},
                  "font": {"size": 14}},
        "xaxis": _axis(x_title),
        "yaxis": _axis(y_title),
        "height": height_px + legend_px,
        "margin": {"l": 60, "r": 20, "t": 84, "b": 60 + legend_px},
        "legend": {"orientation": "h", "x": 0, "xanchor": "left", "yref": "container",
                   "y": 0, "yanchor": "bottom"},
        "hovermode": "x unified",
    }


def config() -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, list) else v) for k, v in _CONFIG.items()}
