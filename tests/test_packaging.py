"""What pip and PyPI read: the license, the classifiers, the console script, the dependency
bounds, and what the sdist carries (issue 38)."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

from gpumem_nb import __main__ as cli

pytestmark = pytest.mark.slow  # builds the sdist

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
SDIST = PYPROJECT["tool"]["hatch"]["build"]["targets"]["sdist"]


def requirement(name: str) -> str:
    (req,) = [d for d in PROJECT["dependencies"]
              if re.split(r"[\s\[<>=!~;]", d, maxsplit=1)[0].lower() == name]
    return req


def test_the_license_is_an_spdx_expression_with_its_file():
    assert PROJECT["license"] == "BSD-3-Clause"
    assert PROJECT["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("BSD 3-Clause License")
    # PEP 639 needs a hatchling that reads the SPDX form.
    (backend,) = PYPROJECT["build-system"]["requires"]
    assert backend == "hatchling>=1.27"


def test_classifiers_claim_the_python_versions_requires_python_allows_and_no_other():
    claimed = {c.rsplit(" :: ", 1)[1] for c in PROJECT["classifiers"]
               if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    assert claimed == {"3.11", "3.12", "3.13"}
    assert PROJECT["requires-python"] == ">=3.11"
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in claimed
    assert "License ::" not in " ".join(PROJECT["classifiers"])  # PEP 639: the SPDX field only
    assert PROJECT["authors"] == [{"name": "gpumem_nb developers"}]
    assert {"jupyter", "ipython", "pytorch", "gpu", "memory"} <= set(PROJECT["keywords"])


def test_no_project_urls_until_the_project_publishes_one():
    """README and CONTRIBUTING name no repository; an invented URL would be worse than none."""
    assert "urls" not in PROJECT


def test_the_console_script_is_named_for_this_project():
    assert PROJECT["scripts"] == {"gpumem-nb": "gpumem_nb.__main__:main"}


@pytest.mark.parametrize(("argv0", "prog"), [
    ("/venv/bin/gpumem-nb", "gpumem-nb"),
    ("gpumem-nb", "gpumem-nb"),
    ("/work/gpumem_nb/__main__.py", "python -m gpumem_nb"),
    ("-c", "python -m gpumem_nb"),
    ("", "python -m gpumem_nb"),
])
def test_usage_names_the_command_as_it_was_typed(argv0, prog):
    assert cli.prog_name(argv0) == prog


def test_usage_line_of_the_command_and_of_the_module(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["/venv/bin/gpumem-nb", "--help"])
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert capsys.readouterr().out.startswith("usage: gpumem-nb ")
    out = subprocess.run([sys.executable, "-m", "gpumem_nb", "--help"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m gpumem_nb ")


def test_psutil_is_required_only_where_there_is_no_proc():
    assert requirement("psutil") == "psutil; sys_platform != 'linux'"
    importers = set()
    for path in (ROOT / "gpumem_nb").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name == "psutil" for a in node.names):
                assert node not in tree.body, f"{path.name} imports psutil at its top level"
                importers.add(path.relative_to(ROOT / "gpumem_nb").as_posix())
    assert importers == {"sources/host.py"}  # the fallback for a platform without /proc


# pynvml names sources/nvml.py uses that it also does without (older nvidia-ml-py or driver).
NVML_OPTIONAL = {
    "nvmlMemory_v2",  # 11.510.69+; v1 figures without the driver's reservation
    "nvmlDeviceGetComputeRunningProcesses_v3",  # 11.510.69+; v2 before
    "nvmlDeviceGetComputeRunningProcesses_v2",  # 11.450.129 to 11.495.46; v3 after
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",  # compared by name, absent until 11.525
}


def nvml_names_used() -> set[str]:
    text = (ROOT / "gpumem_nb" / "sources" / "nvml.py").read_text()
    return set(re.findall(r"\b(nvml[A-Z]\w*|NVML_ERROR_\w+)\b", text))


def test_the_installed_nvidia_ml_py_has_every_call_the_package_needs():
    """Run against whatever nvidia-ml-py is installed: in a venv with the declared floor
    (11.450.129) it passes; with 10.418.84 it fails (no process list, no MIG calls)."""
    pynvml = pytest.importorskip("pynvml")
    needed = nvml_names_used() - NVML_OPTIONAL
    assert {"nvmlInit", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMigMode"} <= needed
    missing = sorted(n for n in needed if not hasattr(pynvml, n))
    assert not missing, f"pynvml lacks {missing}"
    assert any(hasattr(pynvml, f"nvmlDeviceGetComputeRunningProcesses_v{v}") for v in (2, 3))


def test_nvidia_ml_py_has_the_tested_lower_bound():
    assert requirement("nvidia-ml-py") == "nvidia-ml-py>=11.450.129"


def test_ipython_and_ipykernel_floors_are_those_the_suite_passed_on():
    """Colab's IPython 7.34 and ipykernel 5.5.6: the README's test command runs the
    IPython-dependent tests on them (tools/version_matrix.sh); lower these only with such a
    run."""
    assert requirement("ipython") == "ipython>=7.34"
    assert requirement("ipykernel") == "ipykernel>=5.5.6,!=7.0.0,!=7.0.1"
    assert requirement("ipywidgets") == "ipywidgets>=8.1"  # 7.7.1: watch fails (issue 38)


KEPT_OUT = (".ci/run", "docs/reviews/REVIEW-2026-12-01.md", "benchmarks/results/gpu_tests.log",
            "benchmarks/results/diagnosis_h200_log.txt", "oom_forms_dry_run.json")


def test_the_sdist_config_keeps_out_ci_reviews_and_benchmark_logs():
    exclude = SDIST["exclude"]
    for pattern in ("/.ci", "/benchmarks/results", "/docs/reviews"):
        assert pattern in exclude
    # What the tests read from benchmarks/results is put back, so the sdist's tests run.
    for name in ("diagnosis_h200.json", "diagnosis2_h200.json"):
        path = f"benchmarks/results/{name}"
        assert SDIST["force-include"][path] == path
        assert (ROOT / path).is_file()
        assert any(name in p.read_text() for p in (ROOT / "tests").glob("test_diagnosis*.py"))


@pytest.mark.skipif(importlib.util.find_spec("build") is None, reason="needs `build`")
def test_the_sdist_carries_the_package_and_tests_but_not_ci_reviews_or_logs(tmp_path):
    """Builds it (about 8 s here, pip fetching hatchling into build's own env)."""
    out = subprocess.run([sys.executable, "-m", "build", "--sdist", "-o", str(tmp_path), str(ROOT)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (sdist,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"gpumem_nb/__init__.py", "gpumem_nb/py.typed", "tests/test_packaging.py", "LICENSE",
            "benchmarks/results/diagnosis_h200.json", "pyproject.toml"} <= names
    for kept_out in KEPT_OUT:
        assert kept_out not in names
    assert not [n for n in names if "REVIEW-" in n or n.startswith((".hypothesis", ".ci/"))]
    assert sorted(n for n in names if n.startswith("benchmarks/results/")) == [
        "benchmarks/results/diagnosis2_h200.json", "benchmarks/results/diagnosis_h200.json"]
