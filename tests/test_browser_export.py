"""The chart's picture in nbconvert's HTML of a notebook saved while the chart was live (issue 27).

A notebook saved with the chart live holds widget state: the page's own save (livechart.js
saves the chart's picture there) or nbclient's (``jupyter nbconvert --execute`` stores every
widget's state). nbconvert's HTML then writes, for an output that has a widget view whose
model is in that state, only the widget's script tag, and drops the rest of that output's
bundle (``WidgetsDataTypeFilter``); the script needs the widget manager from a CDN, so the
export showed nothing under the watch cell offline. The chart's picture is now an output of
its own after the view's (``MemoryWidget.display``), which hides itself beside a chart that
shows (``widget.PICTURE_STYLE``).

Each export is opened in chromium with every request that is not a file refused, and must
show the chart's picture exactly once; JupyterLab must still show it once on reopening.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest

from .browser_harness import (
    ErrorWatch,
    open_notebook,
    run_cell,
    run_first_cell,
    screenshot,
    use_two_fake_gpus,
    wait_kernel_idle,
    write_notebook,
)

pytestmark = pytest.mark.browser
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
TEMPLATES = ("lab", "classic")
CELLS = [
    "%load_ext gpumem_nb",
    "import torch\nx0 = torch.cuda.tensor(3 << 30, device=0)",
    "%gpumem watch",
    "import time\ntime.sleep(1.5)\nx1 = torch.cuda.tensor(5 << 30, device=0)",
    "time.sleep(1)",
]
WATCH_CELL = 2
VIEWPORT = {"width": 1300, "height": 1100}


# What a reader sees: the chart's pictures (an <img> whose alt names the chart) that are
# drawn, decoded and on screen, anywhere in the page or in one cell's output area.
PICTURES = """(sel) => {
  const root = sel ? document.querySelectorAll(sel.cells)[sel.index] : document;
  const imgs = Array.from(root ? root.querySelectorAll('img') : [])
    .filter(i => (i.alt || '').startsWith('gpumem_nb chart'));
  const shown = imgs.filter(i => i.checkVisibility() && i.complete && i.naturalWidth > 100
                                 && i.getBoundingClientRect().height > 50);
  return {found: imgs.length, shown: shown.length, alts: shown.map(i => i.alt),
          svgs: shown.map(i => i.src.startsWith('data:image/svg+xml;base64,')
                               ? atob(i.src.split('base64,')[1]) : ''),
          live: !!(root && Array.from(root.querySelectorAll('.gpumem-live'))
                   .some(l => l.checkVisibility() && l.querySelector('path.gl-series'))),
          error: /Error displaying widget|model not found/.test(document.body.innerText)};
}"""


def pictures_offline(context: Any, html: Path) -> tuple[dict[str, Any], list[str]]:
    """The export opened as a file, every other request refused: what shows, and what was
    refused (the widget manager's scripts from the CDN, at least)."""
    page = context.new_page()
    refused: list[str] = []

    def offline(route: Any) -> None:
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    page.route("**/*", offline)
    page.goto(html.as_uri())
    page.wait_for_load_state("load")
    page.wait_for_timeout(1500)  # whatever script would still run has run by then
    seen = dict(page.evaluate(PICTURES, None))
    screenshot(page, f"browser-export-{html.stem}.png")
    page.close()
    return seen, refused


def export(file: Path, template: str, *, clear_metadata: bool = False) -> Path:
    """nbconvert's HTML of the notebook, as `jupyter nbconvert --to html` writes it (with
    ``--ClearMetadataPreprocessor.enabled=True``: without the widget state)."""
    from nbconvert import HTMLExporter
    from traitlets.config import Config

    config = Config({"ClearMetadataPreprocessor": {"enabled": clear_metadata}})
    body, _ = HTMLExporter(template_name=template, config=config).from_filename(str(file))
    out = file.with_name(f"{file.stem}-{template}{'-cleared' if clear_metadata else ''}.html")
    out.write_text(body, encoding="utf-8")
    return out


def assert_saved_with_the_chart_live(file: Path) -> None:
    """The case this file is about: the watch cell's widget view has its model in the saved
    widget state, so nbconvert writes that output as the widget's script tag alone."""
    nb = nbformat.read(file, as_version=4)
    views = [o["data"][WIDGET_VIEW]["model_id"] for o in nb.cells[WATCH_CELL].outputs
             if WIDGET_VIEW in o.get("data", {})]
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    assert views and set(views) <= set(state), (views, list(state)[:5])


def assert_one_picture_offline(context: Any, file: Path, *, marks: tuple[str, ...]) -> None:
    for template in TEMPLATES:
        html = export(file, template)
        assert 'type="application/vnd.jupyter.widget-view+json"' in html.read_text(), \
            "nbconvert did not take the widget path: this test would prove nothing"
        seen, refused = pictures_offline(context, html)
        assert refused, "nothing was refused: the export was not opened offline"
        assert seen["shown"] == 1, (template, seen["found"], seen["alts"])
        svg = seen["svgs"][0]
        assert svg.count('class="series"') >= 3 or svg.count('class="gl-series"') >= 3, \
            "the picture draws no lines"
        for mark in marks:  # the last cell, after the watch: the picture followed the cells
            assert f">{mark}<" in svg, (template, mark, re.findall(r">\[\d+\]<", svg))


# --------------------------------------------------------------------------------------------
# jupyter nbconvert --execute, and nbclient itself
# --------------------------------------------------------------------------------------------
NBCLIENT = """
import nbformat, sys
from nbclient import NotebookClient
path, folder = sys.argv[1], sys.argv[2]
nb = nbformat.read(path, as_version=4)
NotebookClient(nb, timeout=120, kernel_name="python3",
               resources={"metadata": {"path": folder}}).execute()
nbformat.write(nb, path)  # widget state included, as nbclient keeps it by default
"""


def test_a_notebook_executed_by_nbconvert_or_nbclient_exports_with_the_picture_offline(
        lab, context):
    folder = lab.folder("executed")
    use_two_fake_gpus(folder)
    by_cli = folder / "by-nbconvert.ipynb"
    by_client = folder / "by-nbclient.ipynb"
    write_notebook(folder, by_cli.name, CELLS)
    write_notebook(folder, by_client.name, CELLS)
    runs = [
        subprocess.Popen([lab.python, "-m", "jupyter", "nbconvert", "--to", "notebook",
                          "--execute", "--inplace", by_cli.name], cwd=folder, env=lab.env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        subprocess.Popen([lab.python, "-c", NBCLIENT, str(by_client), str(folder)],
                         cwd=folder, env=lab.env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True),
    ]
    for run in runs:
        out, _ = run.communicate(timeout=240)
        assert run.returncode == 0, out
    for file in (by_cli, by_client):
        assert_saved_with_the_chart_live(file)
        assert_one_picture_offline(context, file, marks=("[5]",))
    # Its widget state dropped (as for GitHub or nbviewer): the picture still, once.
    for template in TEMPLATES:
        html = export(by_cli, template, clear_metadata=True)
        assert "application/vnd.jupyter.widget-state+json" not in html.read_text()
        seen, _ = pictures_offline(context, html)
        assert seen["shown"] == 1, (template, "cleared", seen["found"], seen["alts"])


# --------------------------------------------------------------------------------------------
# Saved by the page with the chart live; reopened in JupyterLab
# --------------------------------------------------------------------------------------------
CELL_OUTPUTS = ".jp-Notebook .jp-Cell"


def in_cell(page: Any, index: int) -> dict[str, Any]:
    return dict(page.evaluate(PICTURES, {"cells": CELL_OUTPUTS, "index": index}))


def save(page: Any, file: Path) -> None:
    """Ctrl+S, as the user saves (or the page autosaves); waits for the file to change."""
    before = file.stat().st_mtime_ns
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 15
    while file.stat().st_mtime_ns == before:
        assert time.monotonic() < deadline, "the notebook was not saved"
        page.wait_for_timeout(200)
    page.wait_for_timeout(300)


def shut_down_kernels(lab: Any, path: str) -> None:
    """The kernel that drew the chart goes, without the page saving again."""
    import json
    import urllib.request

    def api(method: str, url: str) -> bytes:
        req = urllib.request.Request(f"{lab.base}{url}?token={lab.token}", method=method)
        with urllib.request.urlopen(req, timeout=30) as r:
            return bytes(r.read())

    for s in json.loads(api("GET", "/api/sessions")):
        if s["path"] == path:
            api("DELETE", f"/api/sessions/{s['id']}")


@pytest.mark.parametrize("frontend", ("lab", "notebook"))
def test_saved_by_the_page_with_the_chart_live_it_exports_and_reopens_with_one_picture(
        lab, context, frontend):
    folder = lab.folder(f"live-save-{frontend}")
    use_two_fake_gpus(folder)
    path = write_notebook(folder, "live.ipynb", CELLS)
    file = folder / "live.ipynb"
    page = context.new_page()
    with ErrorWatch(page, lab, folder) as watch:
        open_notebook(page, lab, path, frontend)
        run_first_cell(page, "watching GPU")
        for i in range(1, len(CELLS)):
            run_cell(page, i)
        page.wait_for_timeout(800)
        live = in_cell(page, WATCH_CELL)
        # The live chart, and its picture kept out of sight beside it: never both.
        assert live["live"] and live["shown"] == 0, live
        save(page, file)  # the page's save, the chart live (or its autosave)
        watch.leaving_notebook()
        page.goto("about:blank")
        page.wait_for_timeout(800)
        shut_down_kernels(lab, path)

        assert_saved_with_the_chart_live(file)
        assert_one_picture_offline(context, file, marks=("[5]",))

        for trusted in (True, False):
            if not trusted:  # edited elsewhere: the signature no longer matches
                watch.leaving_notebook()
                page.goto("about:blank")
                page.wait_for_timeout(500)
                nb = nbformat.read(file, as_version=4)
                nb.metadata["edited"] = "elsewhere"
                nbformat.write(nb, file)
            open_notebook(page, lab, path, frontend)
            wait_kernel_idle(page)
            page.wait_for_timeout(2500)  # the widget manager restores what it can by then
            seen = in_cell(page, WATCH_CELL)
            screenshot(page, f"browser-export-reopen-{frontend}-"
                             f"{'trusted' if trusted else 'untrusted'}.png")
            assert seen["shown"] == 1 and not seen["error"], (trusted, seen["alts"], seen)
            if trusted:  # the page's own picture of the chart as it was saved
                assert "saved with the notebook" in seen["alts"][0], seen["alts"]

