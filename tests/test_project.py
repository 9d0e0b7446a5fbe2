"""Project rules that keep the code base honest: lint, types, one importer per library, and
Binder's environment in step with the package."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from .helpers import tutorial_tool

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "gpumem_nb"

# Each third-party library is imported in exactly one module (and torch in none), or, for a
# name ending in "/", only in the modules of that one folder.
OWNERS = {
    "pynvml": "sources/nvml.py",
    "IPython": "ipython/",
    "ipywidgets": "chart/live.py",
    "anywidget": "chart/livechart.py",
    # The live chart is our own (livechart.js); the trace timeline is plotly's JSON, drawn by
    # the renderer extension pip's plotly installs: neither imports plotly or numpy.
    "plotly": None,
    "numpy": None,
    "psutil": "sources/host.py",
    "pandas": "records.py",
    "distributed": "cluster/dask_backend.py",
    "dask": None,
    "torch": None,
}
# Modules that must stay standard-library only (plus the package itself): the static chart
# is rendered for saved notebooks without numpy or plotly, and the first watch imports no
# numpy (about 90 ms of its 0.3 s budget).
STDLIB_ONLY = ("svgchart/__init__.py", "svgchart/data.py", "svgchart/layout.py",
               "svgchart/render.py", "svgchart/liveplot.py", "svgchart/bundle.py",
               "timeline.py", "chart/series.py")


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_each_third_party_library_is_imported_in_one_module_only():
    found: dict[str, list[str]] = {}
    for path in PKG.rglob("*.py"):
        for root in imported_roots(path) & set(OWNERS):
            found.setdefault(root, []).append(path.relative_to(PKG).as_posix())
    for lib, owner in OWNERS.items():
        if owner and owner.endswith("/"):
            assert found.get(lib) and all(p.startswith(owner) for p in found[lib]), \
                (lib, found.get(lib))
            continue
        assert found.get(lib, []) == ([owner] if owner else []), (lib, found.get(lib))


def test_stdlib_only_modules_import_no_third_party_library():
    for name in STDLIB_ONLY:
        roots = imported_roots(PKG / name) - {"__future__"}
        assert roots <= set(sys.stdlib_module_names), (name, roots - set(sys.stdlib_module_names))


@pytest.mark.slow  # a contributor runs ruff and mypy themselves
def test_ruff_is_clean():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow  # a contributor runs ruff and mypy themselves
def test_mypy_is_clean():
    out = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_binder_installs_every_runtime_dependency():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!\[ ;]", d)[0].lower() for d in deps}
    lines = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    binder = {re.split(r"[<>=!\[ ]", ln)[0].lower() for ln in lines
              if ln.strip() and not ln.startswith(("#", "-"))}
    assert names <= binder, names - binder
    assert "pip install --no-deps -e ." in (ROOT / "binder" / "postBuild").read_text()


def tutorial_runner():
    return tutorial_tool("run_tutorials")


# Reads the tutorials with jupytext and nbformat: their import left 146,000 objects that
# every later test's heap walks visited again. The tutorial machinery, run by CI.
@pytest.mark.slow
def test_the_tutorials_carry_outputs_from_a_gpu_run():
    """Every executed tutorial, executed on the GPU machine. A source without its notebook is
    "not yet executed", which the README must say (tools/tutorials/tests/test_tutorial_prose.py,
    test_the_readme_lists_every_tutorial_and_says_which_are_not_yet_executed)."""
    import nbformat

    executed = [s.with_suffix(".ipynb") for s in tutorial_runner().tutorial_sources()
                if s.with_suffix(".ipynb").exists()]
    assert len(executed) >= 9, executed
    for path in executed:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(c.execution_count for c in code), f"{path.name} has unexecuted cells"
        text = "".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
                       for c in code for o in c.outputs)
        assert "NVIDIA H200" in text, path.name


# Reads the tutorials with jupytext and nbformat: their import left 146,000 objects that
# every later test's heap walks visited again. The tutorial machinery, run by CI.
@pytest.mark.slow
def test_every_tutorial_cell_and_subprocess_snippet_is_valid_python():
    """A syntax error would otherwise surface only on the GPU machine, as a failed run."""
    import ast

    from IPython.core.inputtransformer2 import TransformerManager

    runner = tutorial_runner()
    transform = TransformerManager().transform_cell
    for source in runner.tutorial_sources():
        for cell in runner.load_source(source).cells:
            if cell.cell_type != "code":
                continue
            text = cell.source
            body = text.split("\n", 1)[1] if text.startswith("%%") else transform(text)
            tree = ast.parse(body, f"{source.name} cell {cell.id}")
            for node in ast.walk(tree):  # code strings run with python -c or exec
                if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                        and isinstance(node.value.value, str)
                        and "import " in node.value.value and node.targets[0].__class__
                        is ast.Name and node.targets[0].id.isupper()):
                    ast.parse(node.value.value, f"{source.name} cell {cell.id} "
                                                f"{node.targets[0].id}")


# -- notebooks/: the tutorials only -----------------------------------------------------------
TUTORIAL_SOURCE = re.compile(r"\d\d_\w+\.py")
IMPORTED = re.compile(r"^\s*(?:from|import)\s+(\w+)", re.MULTILINE)


def not_tutorial_material(folder: Path) -> list[str]:
    """What ``folder`` holds besides the tutorials (``NN_name.py`` sources and their
    notebooks), the modules they import (and those import), and README.md."""
    entries = [p for p in folder.iterdir() if p.name not in ("__pycache__", ".ipynb_checkpoints")]
    sources = {p.stem for p in entries if TUTORIAL_SOURCE.fullmatch(p.name)}
    todo = [folder / f"{s}.py" for s in sorted(sources)]
    imported: set[str] = set()
    while todo:
        for name in set(IMPORTED.findall(todo.pop().read_text())) - imported:
            imported.add(name)
            if (folder / f"{name}.py").is_file():
                todo.append(folder / f"{name}.py")
    return sorted(p.name for p in entries
                  if not ((p.name == "README.md" and p.is_file())
                          or (p.suffix == ".py" and (p.stem in sources or p.stem in imported))
                          or (p.suffix == ".ipynb" and p.stem in sources)))


def test_no_runner_or_tool_lies_among_the_tutorials_in_notebooks(tmp_path):
    """notebooks/ is what a reader opens: the tutorials, the modules they import (claims.py,
    fresh_process.py) and README.md, where their outputs come from. The runner, the checker,
    the GPU script and the maintainers' notes are in tools/tutorials/ (code review): put back,
    a script would sit among the lessons, and every notebooks/*.py is in the sources digest
    the executed tutorials record."""
    assert not_tutorial_material(ROOT / "notebooks") == []
    (tmp_path / "00_a.py").write_text("# %% id=\"00-00\"\nfrom claims import claim\n")
    (tmp_path / "00_a.ipynb").write_text("{}")
    (tmp_path / "claims.py").write_text("import helper_of_claims\n")
    (tmp_path / "helper_of_claims.py").write_text("")
    (tmp_path / "README.md").write_text("")
    assert not_tutorial_material(tmp_path) == []
    for name in ("run_tutorials.py", "plotly_pictures.py", "run_on_gpu.sh", "RERUN-TODO.md",
                 "99_no_source.ipynb"):
        (tmp_path / name).write_text("")
        assert not_tutorial_material(tmp_path) == [name], name
        (tmp_path / name).unlink()
    (tmp_path / "tests").mkdir()
    assert not_tutorial_material(tmp_path) == ["tests"]


def test_the_layout_map_lists_every_module():
    """docs/architecture.md's map, the fenced block after its <!-- layout --> marker."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    layout = page.split("<!-- layout -->", 1)[1].split("```", 2)[1]
    missing = [str(p.relative_to(ROOT / "gpumem_nb"))
               for p in sorted((ROOT / "gpumem_nb").rglob("*.py"))
               if p.name not in layout]
    assert not missing, f"docs/architecture.md's layout does not mention: {missing}"


# -- the import graph ------------------------------------------------------------------------
# The engine and the domain below it never reach up to the IPython layer or the chart: both
# sit on top and are the only ones that import IPython and ipywidgets.
LOWER = ("kernel", "holders", "whatif", "oom")
UPPER = ("ipython", "chart")


def package_imports(*, module_level_only: bool) -> dict[str, set[str]]:
    """Each package module's imports of other package modules (``gpumem_nb.x.y``): at module
    level only (what runs when it is imported), or every one, a function's lazy import and a
    type checker's included."""
    names = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
             for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        nodes = tree.body if module_level_only else list(ast.walk(tree))
        found: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in names}
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] \
                    if node.level else []
                target = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    found.add(sub if sub in names else target)
        graph[name] = {m for m in found if m in names and m != name}
    return graph


def test_the_package_imports_in_no_circle():
    graph = package_imports(module_level_only=True)
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            raise AssertionError("import circle: " + " -> ".join((*path, name)))
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, (*path, name))
        done.add(name)

    for name in sorted(graph):
        visit(name, ())


def test_the_engine_and_the_domain_never_import_the_ipython_layer_or_the_chart():
    upward = [(name, dep) for name, deps in package_imports(module_level_only=False).items()
              if name.split(".")[1:2] and name.split(".")[1] in LOWER
              for dep in deps if dep.split(".")[1:2] and dep.split(".")[1] in UPPER]
    assert upward == []
