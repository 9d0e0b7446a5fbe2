"""The package's declared dependencies are the ones its modules import: nothing required that
nothing imports (numpy was), nothing imported that is not declared, and an optional library
imported only where its absence is handled, from the extra that names it."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# The import name of each distribution the package declares, where the two differ.
IMPORT_NAME = {"ipython": "IPython", "nvidia-ml-py": "pynvml", "dask": "distributed"}
# Required at run time, though no module imports it: the kernel the magics run in.
RUN_TIME_ONLY = {"ipykernel"}
# Imported where present and never declared: the user's own build (README: bring your own).
USERS_OWN = {"torch"}


def dist_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


def imported_modules() -> set[str]:
    """Every top-level module any gpumem_nb module imports, at any depth, stdlib left out."""
    names: set[str] = set()
    for path in (ROOT / "gpumem_nb").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"gpumem_nb"}


def test_the_required_dependencies_are_the_third_party_modules_imported():
    required = {dist_name(r) for r in PYPROJECT["project"]["dependencies"]}
    imports = imported_modules()
    as_imported = {IMPORT_NAME.get(d, d) for d in required - RUN_TIME_ONLY}
    optional = {IMPORT_NAME.get(dist_name(r), dist_name(r))
                for extra in ("lab", "cluster") for r in PYPROJECT["project"][
                    "optional-dependencies"][extra]}
    assert as_imported <= imports, f"declared, never imported: {as_imported - imports}"
    undeclared = imports - as_imported - USERS_OWN
    assert undeclared <= optional, f"imported, declared nowhere: {undeclared - optional}"


def test_numpy_and_plotly_are_no_requirement_of_the_kernel():
    required = {dist_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert not {"numpy", "plotly", "torch"} & required
    assert "plotly" in {dist_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["lab"]}
    assert "torch" not in PYPROJECT["project"]["optional-dependencies"]


def test_each_optional_import_is_made_where_its_absence_is_handled():
    """pandas, distributed and torch are imported inside a function (never at a module's top),
    so a kernel-only install loads without them."""
    optional = {"pandas", "distributed", "torch"}
    for path in (ROOT / "gpumem_nb").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 \
                else []
            top = {n.split(".")[0] for n in names} & optional
            assert not top, f"{path.relative_to(ROOT)} imports {top} at its top level"


def test_the_license_file_says_what_pyproject_says():
    assert PYPROJECT["project"]["license"] == "BSD-3-Clause"  # SPDX (PEP 639)
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License")
    assert "Neither the name of the copyright holder" in text
