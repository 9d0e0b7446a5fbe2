"""Every public name works before and after ``%load_ext gpumem_nb``, whatever ran first.

Each sequence runs in a fresh interpreter with IPython's real shell: in this test process the
package's submodules are long imported, and a submodule import is exactly what once replaced
``gpumem_nb.snapshot`` (the function) with ``gpumem_nb.snapshot`` (the module).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpumem_nb

ROOT = Path(__file__).resolve().parent.parent

# Runs in the child. "use" calls every public name that is not itself a step; the steps
# exercise load_ipython_extension and unload_ipython_extension, directly and via the magics.
CHILD = r'''
import importlib, json, pkgutil, re, sys, traceback
from IPython.core.interactiveshell import InteractiveShell

ip = InteractiveShell.instance()
import gpumem_nb

results = []
loaded = False


def check(name, fn):
    try:
        fn()
        results.append({"name": name, "ok": True})
    except BaseException as e:
        results.append({"name": name, "ok": False,
                        "error": "".join(traceback.format_exception_only(type(e), e)).strip()})


def version():
    v = gpumem_nb.__version__
    assert isinstance(v, str) and re.match(r"^\d+\.\d+", v), repr(v)


def snapshot():
    snap = gpumem_nb.snapshot()
    assert type(snap).__name__ == "Snapshot", type(snap)
    assert str(snap) and snap._repr_html_()


def history():
    if loaded:
        h = gpumem_nb.history()
        assert hasattr(h, "to_csv") or hasattr(h, "columns"), type(h)  # DataFrame or History
        return
    try:
        gpumem_nb.history()
    except RuntimeError as e:  # documented: says how to load the extension
        assert "%load_ext gpumem_nb" in str(e), str(e)
    else:
        raise AssertionError("history() without the extension loaded returned")


def whatif():
    snap = {"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 1, "size": 4096, "stream": 0}]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}, "gpumem_start": {"segments": []}}
    rows = gpumem_nb.whatif(snap, ["", "expandable_segments:True"])
    assert [r.peak_reserved_bytes for r in rows] == [2 << 20, 2 << 20], rows


def on_cell():
    if loaded:
        seen = []
        handle = gpumem_nb.on_cell(seen.append)
        assert handle.active, handle
        handle.remove()
        assert not handle.active, handle
        return
    try:
        gpumem_nb.on_cell(print)
    except RuntimeError as e:  # documented: says how to load the extension
        assert "%load_ext gpumem_nb" in str(e), str(e)
    else:
        raise AssertionError("on_cell() without the extension loaded returned")


def use():
    check("__version__", version)
    check("on_cell", on_cell)
    check("snapshot", snapshot)
    check("history", history)
    check("whatif", whatif)


def step(word):
    global loaded
    if word == "use":
        use()
    elif word == "%load_ext":
        ip.run_line_magic("load_ext", "gpumem_nb")
        loaded = True
    elif word == "%reload_ext":
        ip.run_line_magic("reload_ext", "gpumem_nb")
    elif word == "%unload_ext":
        ip.run_line_magic("unload_ext", "gpumem_nb")
        loaded = False
    elif word == "load_ipython_extension":
        check(word, lambda: gpumem_nb.load_ipython_extension(ip))
        loaded = True
    elif word == "unload_ipython_extension":
        check(word, lambda: gpumem_nb.unload_ipython_extension(ip))
        loaded = False
    elif word == "import every submodule":
        for m in pkgutil.walk_packages(gpumem_nb.__path__, "gpumem_nb."):
            if not m.name.endswith("__main__"):
                importlib.import_module(m.name)
    else:
        raise ValueError(word)
    if word != "use":
        results.append({"step": word})


for word in sys.argv[1:]:
    step(word)
if loaded:
    gpumem_nb.unload_ipython_extension(ip)
print("RESULTS " + json.dumps(results))
'''

SEQUENCES = {
    "use, %load_ext, %reload_ext, %unload_ext": [
        "use", "%load_ext", "use", "%reload_ext", "use", "%unload_ext", "use"],
    "%load_ext first, then the functions": [
        "%load_ext", "use", "unload_ipython_extension", "use", "load_ipython_extension", "use"],
    "every submodule imported first": [
        "import every submodule", "use", "load_ipython_extension", "use"],
}


def run_sequence(words: list[str], tmp_path: Path) -> list[dict[str, object]]:
    env = dict(os.environ, GPUMEM_NB_CONFIG=str(tmp_path / "settings.json"),
               IPYTHONDIR=str(tmp_path / "ipython"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    for name in ("GPUMEM_NB_AUTO_SHOW", "GPUMEM_NB_REPLAY"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", CHILD, *words], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULTS "))
    return list(json.loads(line[len("RESULTS "):]))


@pytest.mark.parametrize("sequence", list(SEQUENCES))
def test_every_public_name_works_before_and_after_load_ext(sequence, tmp_path):
    results = run_sequence(SEQUENCES[sequence], tmp_path)
    failures, where = [], "before anything"
    for r in results:
        if "step" in r:
            where = f"after {r['step']}"
        elif not r["ok"]:
            failures.append(f"{r['name']} {where}: {r['error']}")
    assert not failures, "\n".join(failures)


def test_the_sequences_cover_every_public_name(tmp_path):
    """A new public name must be added to the checks above, not silently skipped."""
    covered = set()
    for words in SEQUENCES.values():
        covered |= {r["name"] for r in run_sequence(words, tmp_path) if "name" in r}
    assert covered == set(gpumem_nb.__all__)
