"""One reverse search, in ``gpumem_nb/holders/``: cleanup's question "who else keeps the stored
exception" and the holder searches ask the same retention graph, and the output cache's
names are written once."""

from __future__ import annotations

import ast
import pathlib
import types
from typing import Any

from gpumem_nb.holders.keepers import keepers
from gpumem_nb.holders.retention import ROOT_MODULE, ROOT_VARIABLE, RootContext

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "gpumem_nb"


def _sources() -> list[tuple[pathlib.Path, ast.AST]]:
    return [(p, ast.parse(p.read_text())) for p in sorted(PACKAGE.rglob("*.py"))]


def test_the_retention_search_is_built_only_inside_holders() -> None:
    outside = []
    for path, tree in _sources():
        if path.parent.name == "holders":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id == "Search":
                outside.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert outside == []


def test_the_output_caches_three_names_are_written_once() -> None:
    places = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Tuple) and [getattr(e, "value", None) for e in node.elts] \
                    == ["_", "__", "___"]:
                places.append(str(path.relative_to(PACKAGE)))
    assert places == ["holders/reading.py"]  # one tuple, in one module


def test_keepers_names_a_variable_and_a_module_global_that_keep_an_object() -> None:
    class Thing:
        pass

    thing = Thing()
    mod = types.ModuleType("gm_keepers_test")
    mod.kept = [thing]  # type: ignore[attr-defined]
    ns: dict[str, Any] = {"mine": {"x": thing}}
    found = keepers([thing], RootContext(user_ns=ns, modules={"gm_keepers_test": mod}),
                    budget_s=5.0)
    assert {(r.kind, r.name) for r in found.roots} == {
        (ROOT_VARIABLE, "mine"), (ROOT_MODULE, "gm_keepers_test.kept")}
    assert found.cut == ""


def test_a_cut_of_the_namespaces_last_variable_is_judged_not_left_unseen():
    """The cut check's loop left the namespace's last value bound in its running frame, which
    no referrer search sees: `del head` (the last variable, as the newest one is) looked held
    by something unseen, and its class's cycles were never given a collection."""
    import gc as _gc

    from gpumem_nb.holders import Scanner
    from gpumem_nb.holders.retention import RootContext
    from gpumem_nb.holders.verify import check_cuts

    from .fakes import FakeTensor, GiB, fake_torch

    def make_head(table: Any) -> Any:
        class Head:
            def forward(self) -> Any:
                return table

        return Head()

    ns: dict[str, Any] = {"a": 1}
    ns["head"] = make_head(FakeTensor(3 * GiB))
    tensors = [o for o in _gc.get_objects() if type(o) is FakeTensor and o._nbytes == 3 * GiB]
    checks = check_cuts({"head": tensors}, {"head": ["head"]}, RootContext(user_ns=ns),
                        Scanner({"torch": fake_torch()})._tensor_info, budget_s=30.0)
    tensors.clear()
    assert checks["head"].collect and not checks["head"].unseen, checks
