"""Give executed tutorials the picture JupyterLab's plotly renderer adds to each plotly figure.

plotly's JupyterLab renderer draws a figure and then writes a PNG of it into the output's
bundle, so a notebook whose figures lack that PNG opens marked modified before any kernel
answers. The GPU machine that executes the tutorials has no JupyterLab; this step runs here,
after the run: it opens each notebook in a private JupyterLab (tests/browser_harness.py, Debian's
chromium), waits until the renderer has pictured every figure, and copies those pictures from
JupyterLab's own model into the file. Nothing else in the file changes, and the outputs' digest
(run_tutorials.outputs_digest) leaves these pictures out, so the run's checks still hold.

    python tools/tutorials/plotly_pictures.py NOTEBOOK.ipynb [...]
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent  # tools/tutorials/, beside the runner
ROOT = HERE.parents[1]  # for tests.browser_harness
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import nbformat  # noqa: E402
import run_tutorials as RUNNER  # noqa: E402

MODEL = """async () => { const w = window.jupyterapp.shell.currentWidget; await w.context.ready;
  return w.context.model.toJSON(); }"""
WAIT_S = 60.0


def figures(nb: Any) -> list[tuple[int, int]]:
    """(cell, output) of every plotly figure in a notebook's JSON."""
    return [(i, j) for i, c in enumerate(nb["cells"])
            for j, o in enumerate(c.get("outputs", []))
            if RUNNER.PLOTLY_MIME in o.get("data", {})]


def unpictured(nb: Any) -> list[tuple[int, int]]:
    return [(i, j) for i, j in figures(nb)
            if RUNNER.PLOTLY_PICTURE_MIME not in nb["cells"][i]["outputs"][j]["data"]]


def add_pictures(saved: Any, model: Any) -> int:
    """Copy the model's picture of each figure the saved notebook lacks one for; how many.
    A cell's figures are matched in order, not by output index: JupyterLab merges
    consecutive stream outputs, which an older run saved apart."""
    shown: dict[int, list[Any]] = {}
    for i, j in figures(model):
        shown.setdefault(i, []).append(model["cells"][i]["outputs"][j]["data"])
    added = 0
    for i, j in figures(saved):
        data = saved.cells[i].outputs[j]["data"]
        pictured = shown.get(i, [])
        picture = pictured.pop(0).get(RUNNER.PLOTLY_PICTURE_MIME) if pictured else None
        if picture is not None and RUNNER.PLOTLY_PICTURE_MIME not in data:
            data[RUNNER.PLOTLY_PICTURE_MIME] = picture
            added += 1
    return added


def picture(paths: list[Path], browser: Any = None) -> dict[str, int]:
    """Add the pictures, in a JupyterLab of its own and ``browser`` (a Playwright browser; a
    chromium of its own when None); how many each notebook got."""
    from tests.browser_harness import chromium, open_notebook, running_lab

    todo = [p for p in paths if unpictured(nbformat.read(p, as_version=4))]
    added: dict[str, int] = {p.name: 0 for p in paths}
    if not todo:
        return added
    given = contextlib.nullcontext(browser) if browser is not None else chromium()
    with tempfile.TemporaryDirectory() as tmp, running_lab(Path(tmp)) as lab, \
            given as browser:
        folder = lab.folder("pictures")
        for path in todo:
            shutil.copy(path, folder / path.name)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            try:
                open_notebook(page, lab, f"{folder.name}/{path.name}")
                deadline = time.monotonic() + WAIT_S
                while True:
                    model = page.evaluate(MODEL)
                    if not unpictured(model) or time.monotonic() > deadline:
                        break
                    time.sleep(0.5)
            finally:
                page.close()
            saved = nbformat.read(path, as_version=4)
            added[path.name] = add_pictures(saved, model)
            missing = unpictured(saved)
            if missing:
                raise RuntimeError(f"{path.name}: JupyterLab pictured no figure in (cell, "
                                   f"output) {missing} within {WAIT_S:.0f} s")
            nbformat.write(saved, path)
    return added


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    print(json.dumps(picture([Path(a) for a in argv]), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
