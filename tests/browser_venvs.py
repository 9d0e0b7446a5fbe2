"""Virtual environments for the browser tests that need a Python of their own (JupyterLab in one
environment and the kernel in another, as JupyterHub, nb_conda_kernels and VS Code remote run
them).

Each is built once with pip from the package registry and kept under ``VENVS`` in a folder named
by a hash of its requirements and this Python's version, so a re-run reuses it; a half-built one
(no ``ready`` file) is built again. ``python -m tests.browser_venvs`` builds them ahead of a
test run.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENVS = Path("/tmp/gpumem-nb-venvs")

# The server of a hub: JupyterLab with ipywidgets' widget manager, but no anywidget (gpumem_nb is
# installed only where the kernel runs). Pinned to what the project's own environment runs, so
# the cache stays valid and a failure is never a new upstream release.
LAB_WITHOUT_ANYWIDGET = ("jupyterlab==4.6.6", "ipywidgets==8.1.9")


def kernel_requirements() -> tuple[str, ...]:
    """What ``pip install gpumem-nb`` brings into the kernel's environment: the project's own
    dependencies, as pyproject.toml states them, and ipykernel for the kernelspec. gpumem_nb
    itself is this checkout, on the kernel's PYTHONPATH (tests/browser_harness.py)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return (*project["dependencies"], "ipykernel")


def venv_for(requirements: tuple[str, ...]) -> Path:
    """The environment with exactly these requirements installed, built on first use."""
    key = json.dumps([sys.version_info[:2], sorted(requirements)])
    path = VENVS / hashlib.sha256(key.encode()).hexdigest()[:16]
    ready = path / "ready"
    if ready.exists():
        return path
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True)
    subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "-q",
                    "--disable-pip-version-check", *requirements], check=True)
    (path / "requirements.json").write_text(json.dumps(sorted(requirements), indent=1))
    ready.touch()
    return path


def python_of(venv: Path) -> str:
    return str(venv / "bin" / "python")


if __name__ == "__main__":
    for reqs in (LAB_WITHOUT_ANYWIDGET, kernel_requirements()):
        print(venv_for(reqs))
