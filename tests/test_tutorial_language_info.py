"""The tutorials open unmodified under the kernel that reads them (browser review 2026-12-05:
all 13 turned "modified" once a kernel connected, only ``language_info.version`` differing,
and autosave rewrote the tracked files). JupyterLab writes the kernel's ``language_info`` on
connect and marks the notebook dirty unless it deep-equals the stored one
(tools/kernel_language.py says where); Binder's postBuild makes them equal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .helpers import tutorial_tool

# Not imported from tools/tutorials/tests/test_tutorial_prose: that module (slow, left out of
# the contributor's loop) imports nbformat, whose schemas would then stay on the heap of every
# later test in the loop.
ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
TOOL = ROOT / "tools" / "kernel_language.py"


def tool():
    import importlib.util

    spec = importlib.util.spec_from_file_location("kernel_language", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_language_info_written_is_what_this_pythons_kernel_reports():
    """What JupyterLab compares with: ipykernel's kernel_info reply, down to the patch."""
    import sys

    info = tool().kernel_language_info()
    assert info["version"] == sys.version.split()[0]
    runner = tutorial_tool("run_tutorials")
    assert set(runner.LANGUAGE_INFO_KEYS) <= set(info)


def test_only_the_language_info_line_changes_and_the_record_stays(tmp_path: Path):
    kl = tool()
    source = NOTEBOOKS / "09_will_it_fit.ipynb"
    copy = tmp_path / source.name
    shutil.copy(source, copy)
    before = copy.read_text(encoding="utf-8")
    stored = json.loads(before)["metadata"]["language_info"]
    info = dict(stored, version="0.0.1")  # a Python no run used: the version must change
    after = kl.retarget(before, info)
    old_lines, new_lines = before.splitlines(), after.splitlines()
    assert len(old_lines) == len(new_lines)
    changed = [(a, b) for a, b in zip(old_lines, new_lines, strict=True) if a != b]
    assert changed == [(f'   "version": "{stored["version"]}"',
                        '   "version": "0.0.1"')], changed
    old, new = json.loads(before), json.loads(after)
    new["metadata"]["language_info"] = old["metadata"]["language_info"]
    assert new == old  # cells, outputs and the run's record (metadata.gpumem_nb) untouched


def test_a_notebook_that_already_matches_is_not_written(tmp_path: Path, capsys):
    kl = tool()
    nb = json.loads((NOTEBOOKS / "00_quickstart.ipynb").read_text(encoding="utf-8"))
    nb["metadata"]["language_info"] = kl.kernel_language_info()
    path = tmp_path / "00_quickstart.ipynb"
    path.write_text(kl.notebook_text(nb), encoding="utf-8")
    mtime = path.stat().st_mtime_ns
    assert kl.main(["--check", str(tmp_path)]) == 0
    assert kl.main([str(tmp_path)]) == 0
    assert path.stat().st_mtime_ns == mtime
    nb["metadata"]["language_info"]["version"] = "0.0.1"
    path.write_text(kl.notebook_text(nb), encoding="utf-8")
    assert kl.main(["--check", str(tmp_path)]) == 1  # --check writes nothing
    assert json.loads(path.read_text())["metadata"]["language_info"]["version"] == "0.0.1"
    assert kl.main([str(tmp_path)]) == 0
    assert json.loads(path.read_text())["metadata"]["language_info"] == \
        kl.kernel_language_info()
    assert "1 notebook(s) now hold" in capsys.readouterr().out


def test_binder_gives_the_tutorials_its_kernels_language_info_after_installing():
    lines = [ln.strip() for ln in (ROOT / "binder" / "postBuild").read_text().splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    install = lines.index("pip install --no-deps -e .")
    assert "python tools/kernel_language.py notebooks" in lines[install + 1:], lines
