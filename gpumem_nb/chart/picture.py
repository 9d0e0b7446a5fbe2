"""The chart's picture and its two display ids: the live view's output and the picture's.

Every display of one chart shares the two ids, so when the chart ends each output is replaced,
by display_id, with the plain picture and table: a notebook saved after that opens with the
picture, never "Error displaying widget: model not found", in JupyterLab, Notebook 7,
nbconvert and GitHub alike. While the chart is live the picture follows the cells, so a
notebook saved meanwhile shows it offline too.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

__all__ = [
    "ENDED_UNDRAWN",
    "HEADER_NO_LIVE",
    "NO_LIVE_NOTE",
    "PICTURE_CLASS",
    "PICTURE_EVERY_S",
    "PICTURE_STYLE",
    "WIDGET_VIEW",
    "ChartPicture",
]

_log = logging.getLogger(__name__)
# At most one redraw of the picture per this many seconds on a cell's end (the main thread).
PICTURE_EVERY_S = 1.0
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# The chart's picture is an output of its own, after the live view's (``display``): where a
# notebook holds widget state, nbconvert's HTML writes only the widget's script for an output
# that has a widget view and drops the rest of its bundle (``WidgetsDataTypeFilter``), so a
# picture beside the view would show nowhere offline. This rule, in the picture's own HTML,
# hides it wherever the output before it shows the chart: the live view (livechart.js's
# ``.gpumem-live``) or the picture the page saved in its place (``.gpumem-saved``), in
# JupyterLab, Notebook 7 and nbconvert's lab and classic HTML, whose outputs are siblings of
# these classes. Where that output shows nothing (offline, untrusted, no widget manager), no
# rule matches and the picture shows.
PICTURE_CLASS = "gpumem-picture"
# The view's output when the chart ends and its picture cannot be drawn (``close``).
ENDED_UNDRAWN = "gpumem_nb chart (ended; its picture could not be drawn)"
_SHOWN = ":has(.gpumem-live,.gpumem-saved,.gpumem-compact-live)"
PICTURE_STYLE = ("<style>" + ",".join(
    f"{c}{_SHOWN}+{c}:has(.{PICTURE_CLASS})" for c in (".jp-OutputArea-child", ".output_area"))
    + "{display:none}</style>")
# The picture's first line: it shows exactly where the live view does not (the rule above hides
# the whole picture beside a live view). The common cause in a notebook that has a kernel is
# JupyterLab running from another environment than the kernel (JupyterHub, nb_conda_kernels,
# VS Code remote), whose server lacks anywidget: the view then reads "Click to show javascript
# error" and the browser console "No version of module anywidget is registered".
NO_LIVE_NOTE = ("No live view above? It needs a running kernel, and anywidget installed where "
                "JupyterLab runs (<code>pip install anywidget</code> in the server's "
                "environment, then restart JupyterLab), not only in the kernel's. Meanwhile "
                "this picture follows the cells.")
_NOTE_STYLE = "font-size:11px;color:var(--jp-ui-font-color2,#555);margin:2px 0"
_NOTE_HTML = f"<div class='gpumem-no-live' style='{_NOTE_STYLE}'>{NO_LIVE_NOTE}</div>"
# The same line in the live view's header (an ipywidgets HTML widget above the chart), which
# ipywidgets draws even where the chart's own module is missing: the box then shows the header
# and "Click to show javascript error" where the chart should be. Hidden by CSS, no script:
# wherever the box holds the drawn chart (livechart.js's ``.gpumem-live``), and in the picture
# the page saves in its place (``.gpumem-saved``, which keeps the header's HTML), where the
# saved picture itself is the chart.
HEADER_NO_LIVE = (
    "<style>.widget-box:has(.gpumem-live) .gpumem-no-live-header,"
    ".gpumem-saved .gpumem-no-live-header{display:none}"
    ".gpumem-no-live-header code{font-size:inherit}</style>"
    f"<div class='gpumem-no-live gpumem-no-live-header' style='{_NOTE_STYLE}'>"
    + NO_LIVE_NOTE.replace("No live view above?", "No live chart below?")
    .replace(" Meanwhile this picture follows the cells.",
             " Meanwhile the picture under it follows the cells.") + "</div>")


class ChartPicture:
    """The outputs one chart is shown in, and the picture that follows the cells.

    ``plain`` draws the chart without the widget (text, SVG, the numbers); ``lock`` is the
    live view's one lock, which every send of the picture takes, from the main thread at a
    cell's end and from the sampler thread after a reply, so they never interleave."""

    def __init__(self, plain: Callable[[], dict[str, str]], lock: threading.RLock) -> None:
        self._plain = plain
        self._lock = lock
        # Every display of this chart shares one id, so closing it replaces them all.
        self.display_id = f"gpumem-chart-{uuid.uuid4().hex}"
        self.picture_id = f"{self.display_id}-picture"
        # Set by ``show`` (``%gpumem watch``): the live view's output and the picture's, so
        # the picture can follow the chart and both can become the picture at its end.
        self.display_handle: Any = None
        self.picture_handle: Any = None
        self.sent: dict[str, str] | None = None
        self.at_s = float("-inf")  # when a cell's end last redrew the picture
        self.dirty = False  # a cell ended since, within PICTURE_EVERY_S of that
        self.ended = False
        self._shell: Any = None  # whose post_run_cell refreshes the picture

    def bundle(self) -> dict[str, str]:
        """The picture's own output: the plain bundle, its HTML marked for ``PICTURE_STYLE``."""
        bundle = self._plain()
        bundle["text/html"] = (f"<div class='{PICTURE_CLASS}'>{PICTURE_STYLE}{_NOTE_HTML}"
                               f"{bundle['text/html']}</div>")
        return bundle

    def show(self, view: dict[str, object], show: Callable[..., Any], shell: object) -> None:
        """Show the live view's bundle, then the picture (see ``MemoryWidget.display``)."""
        self.display_handle = show(view, raw=True, display_id=self.display_id)
        try:
            picture = self.bundle()
        except Exception as e:  # the live chart still works: no traceback, no picture
            _log.warning("gpumem_nb: the chart's picture could not be drawn (%s); the live "
                         "chart shows, but a saved notebook's export will not", e)
            _log.debug("the picture's failure", exc_info=True)
            return
        self.picture_handle = show(picture, raw=True, display_id=self.picture_id)
        self.sent = picture
        self._follow_cells(shell)

    def _follow_cells(self, shell: object) -> None:
        if self._shell is not None:
            return
        events = getattr(shell, "events", None)
        # Only in a kernel: a terminal's display updates would print the picture's text
        # after every cell.
        if events is None or getattr(shell, "kernel", None) is None:
            return
        events.register("post_run_cell", self.after_cell)
        self._shell = shell

    def unfollow_cells(self) -> None:
        shell, self._shell = self._shell, None
        if shell is not None:
            with contextlib.suppress(ValueError):
                shell.events.unregister("post_run_cell", self.after_cell)

    @property
    def following(self) -> bool:
        return self._shell is not None

    def after_cell(self, _result: object = None) -> None:
        """At each cell's end, on the kernel's main thread, inside that cell's execution:
        nbclient (``jupyter nbconvert --execute``) keeps only the messages a cell sends
        before it is idle, and a page's save shows the picture as of the last cell. Sent
        only when the picture changed, and redrawn at most once per ``PICTURE_EVERY_S``
        here: drawing costs about 3 ms, thirty times the hooks' whole budget, so cells run
        back to back leave it to the sampler thread (``catch_up``), after their reply."""
        if self.picture_handle is None or self.ended:
            return
        if time.monotonic() - self.at_s < PICTURE_EVERY_S:
            self.dirty = True
            return
        self.send()

    def catch_up(self) -> None:
        """Sampler thread: the cells that ended too soon after the last redraw."""
        if self.dirty and self._shell is not None and \
                time.monotonic() - self.at_s >= PICTURE_EVERY_S:
            self.send()

    def send(self) -> None:
        handle = self.picture_handle
        if handle is None or self.ended:
            return
        try:
            with self._lock:
                self.at_s, self.dirty = time.monotonic(), False
                picture = self.bundle()
                if picture != self.sent:
                    handle.update(picture, raw=True)
                    self.sent = picture
        except Exception as e:  # never a traceback under a cell: the picture stops following
            # A plain sentence: ipykernel prints a warning's traceback into the user's cell.
            _log.warning("gpumem_nb: the chart's picture stopped following the cells (%s)", e)
            _log.debug("the picture's failure", exc_info=True)
            self.unfollow_cells()

    def refresh(self) -> bool:
        """Bring the displayed picture up to date; False when the chart was not displayed."""
        handle = self.picture_handle
        if handle is None:
            return False
        self.sent = picture = self.bundle()
        handle.update(picture, raw=True)
        return True

    def end(self) -> None:
        """The chart ended: the view's output becomes the picture, where the chart was.

        The picture's output empties first, so the two never show the picture at once. With
        no picture to draw, the last one drawn stays and the view becomes a line of text: no
        widget view left to read "model not found", and the rule no longer hides that
        picture."""
        self.ended = True
        self.unfollow_cells()
        handle, self.display_handle = self.display_handle, None
        picture, self.picture_handle = self.picture_handle, None
        try:
            plain: dict[str, str] | None = self._plain()
        except Exception as e:
            _log.warning("gpumem_nb: the chart's picture could not be drawn at its end "
                         "(%s); its last picture stays", e)
            _log.debug("the picture's failure", exc_info=True)
            plain = None
        if picture is not None and plain is not None:
            picture.update({"text/html": ""}, raw=True)
        if handle is not None:
            handle.update(plain or {"text/plain": ENDED_UNDRAWN, "text/html": ""}, raw=True)
