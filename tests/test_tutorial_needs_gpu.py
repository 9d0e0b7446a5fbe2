"""Tutorials 01-12 on a machine without a GPU or torch: one sentence, and Run All stops at the
first code cell (browser review 2026-12-05: Run All on a laptop failed with NVML's and
torch's tracebacks and replaced the shipped GPU outputs of every cell it reached)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpumem_nb.sources.nvml import NvmlSource
from gpumem_nb.tutorial import NeedsGpu, missing, require_gpu

from .fakes import FakeGpu, FakePynvml
from .helpers import tutorial_tool

# Not imported from tools/tutorials/tests/test_tutorial_prose: that module (slow, left out of
# the contributor's loop) imports nbformat, whose schemas would then stay on the heap of every
# later test in the loop.
ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
RUNNER = tutorial_tool("run_tutorials")

CALL = "require_gpu()"
GPU_TUTORIALS = sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.py")
                       if not p.name.startswith("00_"))


def torch_found(name: str) -> Any:
    return object() if name == "torch" else None


def test_without_torch_or_a_driver_it_stops_with_one_sentence_naming_both():
    nvml = NvmlSource(FakePynvml(library_not_found=True))
    with pytest.raises(NeedsGpu) as raised:
        require_gpu(nvml, find_spec=lambda name: None)
    said = raised.value._render_traceback_()
    assert len(said) == 1 and "\n" not in said[0], said
    assert "PyTorch is not installed" in said[0]
    assert "no NVIDIA driver" in said[0]
    assert said[0].endswith("."), said


def test_on_a_gpu_machine_with_torch_it_says_nothing_and_balances_nvml(capsys):
    fake = FakePynvml([FakeGpu("GPU-aaaa-1111")])
    assert require_gpu(NvmlSource(fake), find_spec=torch_found) is None
    assert capsys.readouterr() == ("", "")
    assert fake.inits == 1 and fake.shutdowns == 1


def test_gpus_hidden_by_cuda_visible_devices_are_no_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    lacks = missing(NvmlSource(FakePynvml([FakeGpu("GPU-aaaa-1111")])), find_spec=torch_found)
    assert lacks == ["no NVIDIA GPU is visible (CUDA_VISIBLE_DEVICES hides them all)"]


def test_a_driver_with_no_gpu_is_no_gpu():
    lacks = missing(NvmlSource(FakePynvml([])), find_spec=torch_found)
    assert lacks == ["the driver lists no NVIDIA GPU"]


def test_in_ipython_the_cell_fails_with_the_sentence_alone_and_no_traceback(ip, capsys):
    """A failed cell is what stops JupyterLab's Run All; IPython prints what the exception's
    _render_traceback_ returns instead of a traceback."""
    capsys.readouterr()
    result = ip.run_cell("from gpumem_nb.tutorial import require_gpu\nrequire_gpu()")
    out = capsys.readouterr()
    try:
        if os.path.exists("/proc/driver/nvidia") or "torch" in sys.modules:
            pytest.skip("this machine has an NVIDIA driver or torch")
        assert not result.success and isinstance(result.error_in_exec, NeedsGpu)
        shown = [ln for ln in (out.out + out.err).splitlines() if ln.strip()]
        assert shown == [str(result.error_in_exec)], shown
        assert "Traceback" not in out.out + out.err
    finally:
        ip.user_ns.pop("require_gpu", None)
        for name in ("last_type", "last_value", "last_traceback", "last_exc"):
            if hasattr(sys, name):
                delattr(sys, name)


def test_it_finds_torch_without_importing_it(tmp_path: Path):
    """A torch that writes a mark when imported stands on the path: the check must find it
    (the sentence no longer says torch is missing) and leave it unimported."""
    fake = tmp_path / "torch"
    fake.mkdir()
    mark = tmp_path / "imported"
    (fake / "__init__.py").write_text(f"open({str(mark)!r}, 'w').close()\n")
    script = textwrap.dedent("""
        import sys
        from gpumem_nb.sources.nvml import NvmlSource
        from gpumem_nb.tutorial import NeedsGpu, require_gpu
        sys.path.insert(0, sys.argv[1])
        from fakes import FakePynvml
        try:
            require_gpu(NvmlSource(FakePynvml(library_not_found=True)))
        except NeedsGpu as e:
            print(e)
        print("torch" in sys.modules)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    out = subprocess.run([sys.executable, "-c", script, str(ROOT / "tests")],
                         capture_output=True, text=True, env=env, timeout=120,
                         check=True).stdout.splitlines()
    assert out[-1] == "False" and not mark.exists(), out
    lacks = out[0].split("(here:", 1)[1]
    assert "no NVIDIA driver" in lacks and "PyTorch" not in lacks, out


# Reads the tutorials with jupytext and nbformat: their import left 142,000 objects that
# every later test's heap walks visited again. The tutorial machinery, run by CI.
@pytest.mark.slow
@pytest.mark.parametrize("path", GPU_TUTORIALS, ids=lambda p: p.stem)
def test_each_gpu_tutorial_says_so_at_its_top_and_checks_before_anything_else(path):
    cells = RUNNER.load_source(path).cells
    top = next(c for c in cells if c.cell_type == "markdown")
    assert "NVIDIA GPU and PyTorch" in top.source, path.name
    first_code = next(c for c in cells if c.cell_type == "code")
    statements = [ln.split("#", 1)[0].strip() for ln in first_code.source.splitlines()]
    statements = [ln for ln in statements if ln]
    assert statements[:2] == ["from gpumem_nb.tutorial import require_gpu", CALL], statements


def test_the_quickstart_runs_anywhere_and_does_not_check():
    source = (NOTEBOOKS / "00_quickstart.py").read_text()
    assert CALL not in source
    assert len(GPU_TUTORIALS) >= 12, GPU_TUTORIALS  # 01 onwards, each checked above
