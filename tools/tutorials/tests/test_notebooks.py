"""What a saved notebook shows without a kernel (issue 7, defects 5 and 6).

Two kinds of test:
- the executed tutorials as committed: complete metadata, a static picture wherever the chart
  was shown, saved widget state. These read notebooks/0*.ipynb, which only the GPU machine
  can produce (tools/tutorials/run_tutorials.py), so they fail until the tutorials are
  re-executed there with a chart that puts its picture in its display bundle;
- the runner itself, which runs here.
"""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.helpers import tutorial_tool

ROOT = Path(__file__).resolve().parents[3]
TUTORIALS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
IMG_SVG = re.compile(r'<img src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"')


# The tutorial machinery, out of the contributor's loop: the runner imports jupytext, nbclient
# and jupyter_server, and nbformat's jsonschema builds 130,000 objects that stay in the process
# for every later heap scan to walk.
pytestmark = pytest.mark.slow

RUNNER = tutorial_tool("run_tutorials")


def assert_complete_metadata(nb: Any, name: str) -> None:
    info = nb.metadata.get("language_info", {})
    missing = [k for k in RUNNER.LANGUAGE_INFO_KEYS if not info.get(k)]
    assert not missing, f"{name}: language_info lacks {missing}"
    spec = nb.metadata.get("kernelspec", {})
    missing = [k for k in RUNNER.KERNELSPEC_KEYS if not spec.get(k)]
    assert not missing, f"{name}: kernelspec lacks {missing}"


def svg_root(text: str) -> ET.Element:
    root = ET.fromstring(text)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return root


def chart_pictures(cell: Any) -> list[ET.Element]:
    """The SVG pictures a cell's outputs carry, from both entries; asserts they agree."""
    found = []
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if "image/svg+xml" not in data and "<img" not in data.get("text/html", ""):
            continue
        svg = data.get("image/svg+xml")
        assert svg, "an <img> picture without its image/svg+xml entry"
        svg = "".join(svg) if isinstance(svg, list) else svg
        m = IMG_SVG.search("".join(data.get("text/html", "")))
        assert m, "image/svg+xml without the <img> data URI in text/html (untrusted views)"
        assert base64.b64decode(m.group(1)).decode() == svg
        found.append(svg_root(svg))
    return found


def shows_the_chart(cell: Any) -> bool:
    return cell.cell_type == "code" and "%gpumem watch" in cell.source


# -- the executed tutorials ------------------------------------------------------------------
@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.name)
def test_tutorials_carry_full_language_info_and_kernelspec(path):
    """JupyterLab opens a notebook as modified when it has to fill these in (defect 5).
    Fails until the tutorials are re-executed with tools/tutorials/run_tutorials.py."""
    assert_complete_metadata(nbformat.read(path, as_version=4), path.name)


def test_every_cell_that_shows_the_chart_saved_a_picture_of_it():
    """The chart as it was at the end of the run, for any viewer without a kernel (defect 5).
    Fails until the widget's display bundle carries the picture (svgchart.static_bundle) and
    the tutorials are re-executed on the GPU machine."""
    shown = 0
    for path in TUTORIALS:
        nb = nbformat.read(path, as_version=4)
        for cell in filter(shows_the_chart, nb.cells):
            shown += 1
            pictures = chart_pictures(cell)
            assert pictures, f"{path.name} cell {cell.id}: the chart left no picture"
            title = pictures[-1].findtext("{http://www.w3.org/2000/svg}title") or ""
            assert "H200" in title and "waiting for data" not in title, title
    assert shown, "no tutorial shows the chart: this test would prove nothing"


def test_every_saved_widget_view_has_its_state_in_the_notebook():
    """A trusted notebook renders widgets from saved state, or shows 'model not found'.
    Fails until the tutorials are re-executed with tools/tutorials/run_tutorials.py."""
    for path in TUTORIALS:
        nb = nbformat.read(path, as_version=4)
        views = {o["data"][WIDGET_VIEW]["model_id"] for c in nb.cells if c.cell_type == "code"
                 for o in c.outputs if WIDGET_VIEW in o.get("data", {})}
        if not views:
            continue
        state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
        assert views <= set(state), f"{path.name}: no saved state for {views - set(state)}"


# -- the runner, with a real kernel ----------------------------------------------------------
def write_notebook(path: Path, cells: list[str]) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, path)
    return path


FAKE_CHART = """\
from IPython.display import display
from gpumem_nb.kernel import current_monitor

class FakeChart:
    '''Stands in for the chart: a display to refresh, and a count of marks.'''
    def __init__(self):
        self.handle = display({"text/plain": "as displayed"}, raw=True, display_id=True)
    def refresh_static(self):
        marks = len(current_monitor().marks)
        self.handle.update({"text/plain": f"refreshed; {marks} marks"}, raw=True)
    def close(self):  # as the chart does when it ends: its display becomes the picture
        marks = len(current_monitor().marks)
        self.handle.update({"text/plain": f"ended; {marks} marks"}, raw=True)

current_monitor().widget = FakeChart()
"""


@pytest.mark.kernel
@pytest.mark.slow
def test_the_runner_settles_the_chart_display_silently_and_saves_full_metadata(tmp_path):
    """The last refresh lands in the cell that showed the chart, and the settle step itself
    leaves no cell, no output and no mark (it runs silently)."""
    src = write_notebook(tmp_path / "t.ipynb", ["%load_ext gpumem_nb", FAKE_CHART, "x = 1"])
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    timings = RUNNER.run(src, out_dir)
    nb = nbformat.read(out_dir / "t.ipynb", as_version=4)
    nbformat.validate(nb)
    assert_complete_metadata(nb, "t.ipynb")
    assert len(nb.cells) == 3 and [c.execution_count for c in nb.cells] == [1, 2, 3]
    texts = [o["data"]["text/plain"] for o in nb.cells[1].outputs]
    assert texts == ["ended; 2 marks"]  # cells 2 and 3; the settle step is not one
    assert "settle" in timings


@pytest.mark.kernel
@pytest.mark.slow
def test_the_runner_leaves_the_chart_as_its_picture_so_no_viewer_shows_model_not_found(
        tmp_path):
    """The real chart without a GPU. The runner ends the chart before saving (issue 17): its
    output is the plain picture and table, with no widget view that a viewer without the
    widget's state would show as "Error displaying widget: model not found" (JupyterLab,
    Notebook 7) or as nothing (nbconvert, GitHub), and no widget state left in the file."""
    src = write_notebook(tmp_path / "w.ipynb", ["%load_ext gpumem_nb", "%gpumem watch",
                                                "import time; time.sleep(1)"])
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    RUNNER.run(src, out_dir)
    nb = nbformat.read(out_dir / "w.ipynb", as_version=4)
    outputs = nb.cells[1].outputs
    assert outputs and not [o for o in outputs if WIDGET_VIEW in o.get("data", {})], outputs
    assert "widgets" not in nb.metadata, "state of widgets no output shows"
    pictures = chart_pictures(nb.cells[1])
    assert pictures, "the chart's output carries no picture"
    svg = ET.tostring(pictures[-1], encoding="unicode")
    assert "host RAM" in svg
    assert any(e.get("class") == "series" for e in pictures[-1].iter(
        "{http://www.w3.org/2000/svg}path")), "the picture draws no line"
    assert "NVML used / total" in "".join(outputs[0]["data"]["text/html"]) or \
        "No GPU" in "".join(outputs[0]["data"]["text/plain"])


def test_stale_widget_buffers_are_dropped_and_live_ones_kept():
    """plotly resets ``_py2js_update`` to None after each update; nbclient kept its buffers,
    and JupyterLab then could not create the figure from the saved state."""
    model = {"model_name": "AnyModel", "state": {
        "_py2js_update": None,
        "_widget_data": [{"x": {"dtype": "float32", "shape": [2]}, "y": [1.0, 2.0]}]},
        "buffers": [
            {"path": ["_py2js_update", "style_data", "x", 0, "buffer"], "data": "AA=="},
            {"path": ["_widget_data", 0, "x", "buffer"], "data": "AAAAAAAAgD8="},
            {"path": ["_widget_data", 3, "x", "buffer"], "data": "AA=="}]}
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {WIDGET_STATE: {"state": {"m": model}}}
    assert RUNNER.drop_stale_buffers(nb) == 2
    saved = nb.metadata["widgets"][WIDGET_STATE]["state"]["m"]
    assert [b["path"] for b in saved["buffers"]] == [["_widget_data", 0, "x", "buffer"]]


# -- the saved notebook in JupyterLab -----------------------------------------------------------
@pytest.fixture(scope="module")
def saved_lab(tmp_path_factory: Any) -> Any:
    """A notebook with the live chart, executed by the runner, opened in JupyterLab 4 twice:
    as an untrusted file (as from git) and trusted (as the user's own). Nothing is re-run."""
    from nbformat.sign import NotebookNotary

    from tests.browser_harness import chromium, running_lab

    tmp = tmp_path_factory.mktemp("saved")
    src = write_notebook(tmp / "chart.ipynb", ["%load_ext gpumem_nb", "%gpumem watch",
                                               "import time; time.sleep(1)"])
    executed = tmp / "executed"
    executed.mkdir()
    RUNNER.run(src, executed)
    nb = nbformat.read(executed / "chart.ipynb", as_version=4)
    nb.metadata["copy"] = "trusted"  # trust is by content: the two copies must differ
    data = tmp / "data"  # the server's signature store: trust what this test signs only
    data.mkdir()
    NotebookNotary(data_dir=str(data)).sign(nb)
    with running_lab(tmp, data_dir=data) as lab, chromium() as browser:
        nbformat.write(nb, lab.root / "trusted.ipynb")
        (executed / "chart.ipynb").rename(lab.root / "untrusted.ipynb")

        def open_page(name: str) -> tuple[Any, list[str]]:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            # A workspace per notebook, so neither page restores the other's tab.
            page.goto(f"{lab.base}/lab/workspaces/{name}/tree/{name}.ipynb?token={lab.token}"
                      "&reset")
            page.wait_for_selector(".jp-Notebook .jp-OutputArea-output", timeout=60_000)
            page.wait_for_timeout(6000)  # widget restore and rendering settle
            return page, errors

        yield open_page


def output_texts(page: Any) -> str:
    return " ".join(page.locator(".jp-OutputArea-output").all_inner_texts())


@pytest.mark.browser
def test_an_untrusted_saved_notebook_shows_the_chart_picture_and_opens_unmodified(saved_lab):
    """As a notebook from git opens: JupyterLab renders only sanitized text/html. Fails until
    the widget's display bundle carries svgchart's picture."""
    page, _ = saved_lab("untrusted")
    assert page.locator(".jp-mod-dirty").count() == 0, "opened as modified"
    sizes = page.evaluate(
        "() => Array.from(document.querySelectorAll('.jp-OutputArea-output img'))"
        ".filter(i => i.src.startsWith('data:image/svg+xml;base64,'))"
        ".map(i => i.naturalWidth)")
    assert sizes and min(sizes) > 0, (sizes, output_texts(page)[:500])


@pytest.mark.browser
def test_a_trusted_saved_notebook_shows_the_ended_charts_picture_not_a_missing_widget(saved_lab):
    """As the user's own notebook opens: the runner ended the chart before saving, so its output
    is the picture of the whole run, never "Error displaying widget: model not found" (the
    plotly FigureWidget this test once read is gone from the live chart)."""
    page, errors = saved_lab("trusted")
    assert page.locator(".jp-mod-dirty").count() == 0, "opened as modified"
    assert "Error displaying widget" not in output_texts(page)
    assert not [e for e in errors if "model not found" in e], errors
    pictures = page.evaluate(
        "() => Array.from(document.querySelectorAll('.jp-OutputArea-output img, "
        ".jp-OutputArea-output svg'))"
        ".map(i => i.getBoundingClientRect().width)")
    assert pictures and max(pictures) > 0, (pictures, output_texts(page)[:500])
