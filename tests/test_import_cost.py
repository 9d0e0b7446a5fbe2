"""Loading the package must not drag in torch, plotly or ipywidgets (promise 1, and speed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # a fresh interpreter per test


def modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, check=True,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_gpumem_nb_imports_no_heavy_library():
    mods = modules_after("import gpumem_nb")
    assert not {"torch", "plotly", "ipywidgets", "pynvml", "IPython"} & mods


def test_core_layers_import_none_of_the_four_third_party_libraries():
    mods = modules_after(
        "import gpumem_nb.sampler, gpumem_nb.model, gpumem_nb.views, gpumem_nb.units, "
        "gpumem_nb.sources.live, gpumem_nb.sources.replay, gpumem_nb.kernel"
    )
    assert not {"torch", "plotly", "ipywidgets", "pynvml", "IPython"} & mods


def test_snapshot_without_gpu_never_imports_torch():
    mods = modules_after("import gpumem_nb; gpumem_nb.snapshot()")
    assert "torch" not in mods


def test_python_m_gpumem_nb_prints_a_report_on_this_machine():
    out = subprocess.run([sys.executable, "-m", "gpumem_nb"], capture_output=True, text=True,
                         check=True)
    assert "Host RAM of this process:" in out.stdout


def test_the_live_chart_imports_neither_plotly_nor_numpy_nor_jsonschemas_format_checks():
    """Issue 17: the first watch spent 1.9-2.2 s importing the chart's stack. plotly.io
    imports nbformat, whose jsonschema format checks import rfc3987_syntax (1.63 s alone), and
    numpy costs a kernel that has not imported it about 90 ms of the 0.3 s budget."""
    mods = modules_after("import gpumem_nb.ipython.extension, gpumem_nb.chart.live")
    assert not {"plotly", "numpy", "nbformat", "jsonschema", "rfc3987_syntax"} & mods
