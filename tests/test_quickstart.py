"""The quickstart runs anywhere (issue 11): executed here, on a machine without a GPU (and
without torch, unless it happens to be installed), through the same runner the GPU machine
uses, with its claims checked. And Binder's environment can run the tutorials: every package a
notebook imports is in binder/requirements.txt, and postBuild is valid bash. tests/test_binder.py
builds Binder's environment for real.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest

from .helpers import tutorial_tool

pytestmark = pytest.mark.slow  # the quickstart notebook end to end in a real kernel

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
BINDER = ROOT / "binder"
QUICKSTART = "00_quickstart.ipynb"

# Import name -> the distribution that provides it, where the two differ.
DISTRIBUTIONS = {"pynvml": "nvidia-ml-py", "IPython": "ipython", "PIL": "pillow"}


RUNNER = tutorial_tool("run_tutorials")
# Modules that only the GPU machine has: the notebooks that import them (04, 08, 11, 12) need a GPU,
# which Binder does not have.
GPU_ONLY = {"cupy", "transformers", "jax", "distributed"}
# Import name -> the requirement that brings it (a dependency of that package).
PROVIDED_BY = {"jupyter_client": "ipykernel"}


def outputs_text(cell: Any) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append(str(out.get("text", "")))
        parts.append(str(out.get("data", {}).get("text/plain", "")))
        if out.get("output_type") == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}")
    return "\n".join(parts)


@pytest.mark.kernel
def test_the_quickstart_runs_to_the_end_without_a_gpu(tmp_path, monkeypatch):
    """Every cell runs without an error where no GPU is usable; the chart replays the H200
    recording and the user's own cells are still measured and cleaned up."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # where torch is installed: no GPU for it
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    # raises CellExecutionError on the first failing cell, ClaimError on a failed claim
    RUNNER.run(NOTEBOOKS / QUICKSTART.replace(".ipynb", ".py"), out_dir)
    nb = nbformat.read(out_dir / QUICKSTART, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "a cell did not run"
    errors = [o for c in code for o in c.outputs if o.get("output_type") == "error"]
    assert not errors, errors
    by_source = {c.source.splitlines()[0]: outputs_text(c) for c in code}
    assert "Recorded on an NVIDIA H200" in by_source["%gpumem watch --replay bundled"]
    assert "gpumem:" in by_source["%%gpumem"]  # the cell was measured
    who = by_source["%gpumem who"]
    assert "Out[" in who and "result" in who, who
    cleanup = by_source["%gpumem cleanup --out"]
    assert "output cache" in cleanup, cleanup
    checks = [ln for c in code for ln in outputs_text(c).splitlines() if ln.startswith("✓")]
    assert any("CUDA start" in ln for ln in checks), checks  # the replay's story, checked
    assert not RUNNER.failed_claims(nb)
    meta = nb.metadata["gpumem_nb"]
    assert meta["gpumem_nb"] and meta["executed"] and meta["python"], meta


# -- Binder ------------------------------------------------------------------------------------
def imported_modules(source: str) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and re.search(r"^\s*import \w", node.value, re.MULTILINE)):
            # code run in a fresh process (or a message that starts with "import")
            with contextlib.suppress(SyntaxError):
                roots |= imported_modules(node.value)
    return roots


def notebook_code() -> list[str]:
    from IPython.core.inputtransformer2 import TransformerManager

    transform = TransformerManager().transform_cell
    sources = []
    for path in RUNNER.tutorial_sources():
        for cell in RUNNER.load_source(path).cells:
            if cell.cell_type != "code":
                continue
            text = cell.source
            # A cell magic's body is Python too; the transformer would hide it in a string.
            sources.append(text.split("\n", 1)[1] if text.startswith("%%") else
                           transform(text))
    return sources


def requirement_names(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            names.add(re.split(r"[<>=!~\[; ]", line)[0].lower().replace("_", "-"))
    return names


def test_binder_installs_every_package_the_tutorials_import():
    local = {p.stem for p in NOTEBOOKS.glob("*.py")}
    modules: set[str] = set()
    for source in notebook_code():
        modules |= imported_modules(source)
    tutorials = set(RUNNER.tutorial_sources())
    for helper in NOTEBOOKS.glob("*.py"):
        # The runner and the picture step (tools/tutorials/) run on the GPU machine and here,
        # not on Binder: notebooks/ holds only the tutorials and what they import.
        if helper not in tutorials:
            modules |= imported_modules(helper.read_text())
    third_party = (modules - set(sys.stdlib_module_names) - local - GPU_ONLY
                   - {"gpumem_nb", "__future__"})
    assert {"torch", "numpy", "pynvml"} <= third_party, third_party  # the scan found them
    needed = {DISTRIBUTIONS.get(m, PROVIDED_BY.get(m, m)).lower().replace("_", "-")
              for m in third_party}
    missing = needed - requirement_names(BINDER / "requirements.txt")
    assert not missing, f"binder/requirements.txt lacks {sorted(missing)}"
    # gpumem_nb itself comes from the checkout
    assert "pip install --no-deps -e ." in (BINDER / "postBuild").read_text()


def test_binder_postbuild_is_valid_bash_and_executable():
    post = BINDER / "postBuild"
    out = subprocess.run(["bash", "-n", str(post)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert post.read_text().startswith("#!/usr/bin/env bash")
    assert os.access(post, os.X_OK), "repo2docker runs postBuild directly: it must be +x"
