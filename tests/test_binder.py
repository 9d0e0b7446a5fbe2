"""Binder's environment, built the way repo2docker builds it, runs the quickstart (issue 20).

repo2docker copies the repository, runs ``pip install -r binder/requirements.txt`` in a fresh
environment, then ``binder/postBuild``. This test does the same in a fresh venv (from a copy of
the checkout, so the install touches nothing here), then executes the quickstart's source with
the runner inside that venv, with no GPU. A requirement missing from the file, a postBuild that
fails, or a quickstart cell that needs something Binder lacks fails here, not on mybinder.org.

It takes about two minutes with pip's cache warm (torch's CPU wheel is most of it), so it is
marked ``binder`` and left out of a plain ``pytest``; CI runs it on its own (README's test
command). Where a CPU build of torch sits in pip's find-links (this workplace's machines, which
cannot reach PyTorch's own index), torch is pinned to it, as Binder's index would give a CPU
build.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IGNORE = shutil.ignore_patterns(".venv", ".git", "__pycache__", "*.egg-info", ".pytest_cache",
                                ".mypy_cache", ".ruff_cache", ".whl", "build", "dist",
                                "artifacts", "*.ipynb")


def local_cpu_torch() -> str | None:
    """The version of a CPU torch wheel in pip's find-links, if this machine has one."""
    try:
        links = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                               capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    for folder in links:
        for wheel in sorted(Path(folder.removeprefix("file://")).glob("torch-*+cpu-*.whl")):
            m = re.match(r"torch-([^-]+)-", wheel.name)
            if m:
                return m.group(1).split("+")[0]
    return None


@pytest.mark.binder
def test_binder_builds_like_repo2docker_and_runs_the_quickstart_without_a_gpu(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=IGNORE)
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", VIRTUAL_ENV=str(env_dir),
               PIP_RETRIES="1", PIP_TIMEOUT="15", PIP_DISABLE_PIP_VERSION_CHECK="1",
               CUDA_VISIBLE_DEVICES="", PYTHONNOUSERSITE="1")
    version = local_cpu_torch()
    if version:
        pin = tmp_path / "constraints.txt"
        pin.write_text(f"torch=={version}\n")
        env["PIP_CONSTRAINT"] = str(pin)

    def step(args: list[str], timeout_s: float) -> str:
        out = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True,
                             timeout=timeout_s)
        assert out.returncode == 0, f"{' '.join(args)} failed:\n{out.stdout[-3000:]}\n" \
                                    f"{out.stderr[-3000:]}"
        return out.stdout

    step([str(bin_dir / "pip"), "install", "-q", "-r", "binder/requirements.txt"], 900)
    step([str(repo / "binder" / "postBuild")], 300)  # repo2docker runs it as an executable
    (tmp_path / "out").mkdir()
    step([str(bin_dir / "python"), "tools/tutorials/run_tutorials.py", str(tmp_path / "out"),
          "00_quickstart"], 600)
    import nbformat  # here, not at the top: its imports would stay in every unit run

    nb = nbformat.read(tmp_path / "out" / "00_quickstart.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "a cell did not run"
    errors = [o for c in code for o in c.outputs if o.get("output_type") == "error"]
    assert not errors, errors
    text = "\n".join(str(o.get("text", "")) for c in code for o in c.outputs)
    assert "torch: 2." in text and "GPU: none" in text, text[:2000]  # Binder's CPU torch
    assert "✓ CUDA start" in text and "✗" not in text
    assert nb.metadata["gpumem_nb"]["torch"], nb.metadata["gpumem_nb"]  # the kernel used torch
