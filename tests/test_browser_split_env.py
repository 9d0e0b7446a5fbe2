"""JupyterLab in one environment, the kernel in another, as JupyterHub, nb_conda_kernels and VS
Code remote run them: the server has JupyterLab and ipywidgets' widget manager but no anywidget,
and gpumem_nb lives only where the kernel runs (a kernelspec pointing at that environment's
Python). The live view cannot render there ("No version of module anywidget is registered");
what the user must see is the chart's picture with its line saying why and what to install,
and no error dialog in the way.

Both environments are built once with pip and cached (tests/browser_venvs.py): the first run
takes a few minutes, later runs reuse them. The screenshot goes to
benchmarks/results/screens/split-env.png.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import nbformat
import pytest

from .browser_harness import (
    ROOT,
    ErrorWatch,
    chromium,
    open_notebook,
    run_cell,
    run_first_cell,
    running_lab,
)
from .browser_venvs import LAB_WITHOUT_ANYWIDGET, kernel_requirements, python_of, venv_for

pytestmark = [pytest.mark.browser]
KERNEL_NAME = "gpumem-kernel-env"
SCREEN = ROOT / "benchmarks" / "results" / "screens" / "split-env.png"
# What the page logs when a widget's module is registered nowhere in the server: expected here.
MISSING_MODULE = "No version of module anywidget is registered"

SEEN = """() => {
  const c = document.querySelectorAll('.jp-Notebook .jp-Cell')[1];
  const visible = (e) => !!e && e.offsetParent !== null
    && e.getBoundingClientRect().height > 0;
  const img = Array.from(c.querySelectorAll('.jp-OutputArea img'))
    .find(x => (x.alt || '').startsWith('gpumem_nb chart'));
  const notes = Array.from(c.querySelectorAll('.gpumem-no-live'));
  return {
    live: !!c.querySelector('.gpumem-live'),
    picture: visible(img) && img.naturalWidth > 0,
    notes: notes.filter(visible).map(n => n.innerText),
    dialogs: Array.from(document.querySelectorAll('.jp-Dialog')).map(d => d.innerText),
    text: c.querySelector('.jp-Cell-outputWrapper').innerText.slice(0, 3000),
  };
}"""


def kernelspec(data_dir: Path, python: str) -> None:
    folder = data_dir / "kernels" / KERNEL_NAME
    folder.mkdir(parents=True)
    (folder / "kernel.json").write_text(json.dumps({
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python (the kernel's environment)", "language": "python"}))


def installed(python: str, module: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([python, "-c", code]).returncode == 0


@pytest.fixture(scope="module")
def envs() -> tuple[str, str]:
    lab_python = python_of(venv_for(LAB_WITHOUT_ANYWIDGET))
    kernel_python = python_of(venv_for(kernel_requirements()))
    # The case under test, checked rather than assumed.
    assert not installed(lab_python, "anywidget") and installed(lab_python, "jupyterlab")
    assert installed(kernel_python, "anywidget") and installed(kernel_python, "ipykernel")
    return lab_python, kernel_python


def session(lab_python: str, kernel_python: str, tmp: Path,
            screen: Path | None = None) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Open a notebook on the kernel's environment in a JupyterLab run from ``lab_python``,
    run ``%gpumem watch``; what the chart's cell shows, and what the error watch found."""
    data_dir = tmp / "jupyter-data"
    kernelspec(data_dir, kernel_python)
    (tmp / "server").mkdir()
    # The server's own data folder: no labextension or kernelspec of the machine's user.
    with running_lab(tmp / "server", lab_python,
                     extra_env={"JUPYTER_DATA_DIR": str(data_dir)}) as lab, chromium() as browser:
        print("JupyterLab's environment:", lab.versions)
        folder = lab.folder("split")
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "language": "python",
                                     "display_name": "Python (the kernel's environment)"}
        nb.cells = [nbformat.v4.new_code_cell(c) for c in (
            "import sys; print('kernel prefix:', sys.prefix)",
            "%load_ext gpumem_nb\n%gpumem watch")]
        nbformat.write(nb, folder / "split.ipynb")
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        watch = ErrorWatch(page, lab, folder)
        try:
            open_notebook(page, lab, "split/split.ipynb")
            run_first_cell(page, "kernel prefix:")
            prefix = str(Path(kernel_python).parent.parent)
            assert page.locator(f"text=kernel prefix: {prefix}").count() == 1
            run_cell(page, 1)
            page.wait_for_function(f"() => ({SEEN})().text.includes('Charting host RAM')",
                                   timeout=30_000)
            page.wait_for_timeout(2500)  # the widget manager has drawn, or failed, by then
            seen = page.evaluate(SEEN)
            if screen is not None:
                screen.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(screen), full_page=True)
            print(seen)
            return seen, watch.collect()
        finally:
            context.close()


def test_with_anywidget_only_in_the_kernels_env_the_picture_and_its_line_show(envs, tmp_path):
    lab_python, kernel_python = envs
    seen, found = session(lab_python, kernel_python, tmp_path, SCREEN)
    assert not seen["live"], seen  # the case: no live view can render here
    assert seen["picture"], seen
    # The header above the failed view and the picture under it each say why, and what to do.
    assert [n.split("?")[0] for n in seen["notes"]] == ["No live chart below",
                                                         "No live view above"], seen
    assert all("pip install anywidget" in n for n in seen["notes"]), seen
    assert not seen["dialogs"], seen
    # Every error channel is clean but for the missing module, which is the case itself.
    for channel in ("browser", "log console"):
        found[channel] = [e for e in found[channel] if MISSING_MODULE not in e]
    assert not any(found.values()), ErrorWatch.describe(found)


def test_with_anywidget_where_jupyterlab_runs_the_live_chart_shows_and_no_line(envs, tmp_path):
    """The README's remedy: anywidget in the server's environment too (this project's own
    environment, which has it), the kernel still in its own."""
    _, kernel_python = envs
    seen, found = session(lab_python_with_anywidget(), kernel_python, tmp_path)
    assert seen["live"] and seen["notes"] == [] and not seen["dialogs"], seen
    assert not any(found.values()), ErrorWatch.describe(found)


def lab_python_with_anywidget() -> str:
    from .browser_harness import lab_python

    python = lab_python()
    assert installed(python, "anywidget") and installed(python, "jupyterlab")
    return python
