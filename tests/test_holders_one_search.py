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
                places.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert places == ["holders/reading.py:16"]


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
