"""The live chart with the oldest anywidget pyproject.toml allows (``anywidget>=0.9.0``), in
chromium, once per test run.

A throwaway venv holds only that anywidget (its Python package and its JupyterLab extension);
everything else comes from this environment, through a ``.pth`` file and a copy of its Jupyter
data and config. Then the chart's own browser check
(``test_browser.py::test_replay_chart_renders_grows_while_a_cell_sleeps_and_cleanup_reports``)
runs against it through ``GPUMEM_NB_BROWSER_PYTHON``. About 40 s, with PyPI reachable.

Found so (issue 27, JupyterLab 4.6, ipywidgets 8.1.9): 0.9.0 draws the chart; 0.8.0 and 0.7.1
fail with "Could not create a view for model id ..." (they predate the ``initialize`` hook and
the ``export default {initialize, render}`` module livechart.js is written as).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
CHART_CHECK = ("tests/test_browser.py::"
               "test_replay_chart_renders_grows_while_a_cell_sleeps_and_cleanup_reports")


def oldest_anywidget() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(r'"anywidget>=([0-9.]+)"', text)
    assert found, "pyproject.toml gives anywidget no lower bound"
    return found.group(1)


def test_the_chart_draws_with_the_oldest_anywidget_allowed(tmp_path):
    version = oldest_anywidget()
    env_dir = tmp_path / "aw"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    here = Path(sys.prefix)
    # Jupyter's data (JupyterLab's app, the other lab extensions, the kernelspec) and config
    # (the server extensions), all but anywidget's own extension, which the install brings.
    shutil.copytree(here / "share" / "jupyter", env_dir / "share" / "jupyter",
                    ignore=lambda d, names: ["anywidget"] if d.endswith("labextensions")
                    else [])
    if (here / "etc" / "jupyter").is_dir():
        shutil.copytree(here / "etc" / "jupyter", env_dir / "etc" / "jupyter")
    out = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                          "--disable-pip-version-check", f"anywidget=={version}"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    site = subprocess.run([str(python), "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "zz_this_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    got = subprocess.run([str(python), "-c", "import anywidget; print(anywidget.__version__)"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert got == version
    env = {**os.environ, "GPUMEM_NB_BROWSER_PYTHON": str(python)}
    run = subprocess.run([sys.executable, "-m", "pytest", CHART_CHECK, "-q",
                          "-p", "no:cacheprovider", "-s"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    tail = (run.stdout + run.stderr)[-4000:]
    assert f"'anywidget': '{version}'" in run.stdout, tail  # the lab ran the oldest one
    assert run.returncode == 0, tail
