"""The package's shape in four numbers, for anyone to run: ``python tools/house_metrics.py``.

- modules over 600 lines;
- the largest class, in lines;
- imports from a lower layer up: each module's floor is the longest chain of the package
  modules it imports at module level (the ground is floor 0). An import anywhere in a module
  (a lazy one inside a function, or one for the type checker, included) runs back up when it
  names a module on a higher floor that imports, directly or not, the importer: the import
  that closes a circle only laziness keeps from failing;
- the count of ``Any``: every use of the name in the package's code (imports not counted).

Standard library only; reads the files, imports nothing of the package.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
PKG_NAME = "gpumem_nb"
BIG_MODULE_LINES = 600


def module_name(path: Path, pkg: Path) -> str:
    parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(importer: str, is_package: bool, node: ast.ImportFrom | ast.Import,
            known: set[str]) -> set[str]:
    """The package modules an import statement names (a name imported from a package that
    is itself a module counts as that module)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in known}
    if node.level:
        base = importer.split(".") if is_package else importer.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join([*base, *([node.module] if node.module else [])])
    else:
        target = node.module or ""
    if not target.startswith(PKG_NAME):
        return set()
    found = set()
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        if sub in known:
            found.add(sub)
        elif target in known:
            found.add(target)
    return found


def collect(pkg: Path) -> dict[str, dict[str, object]]:
    paths = sorted(pkg.rglob("*.py"))
    known = {module_name(p, pkg) for p in paths}
    mods: dict[str, dict[str, object]] = {}
    for p in paths:
        name = module_name(p, pkg)
        tree = ast.parse(p.read_text())
        top: set[str] = set()
        every: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                got = resolve(name, p.name == "__init__.py", node, known) - {name}
                every |= got
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                top |= resolve(name, p.name == "__init__.py", node, known) - {name}
        classes = [(n.end_lineno - n.lineno + 1, n.name) for n in ast.walk(tree)
                   if isinstance(n, ast.ClassDef) and n.end_lineno is not None]
        anys = sum(1 for n in ast.walk(tree)
                   if (isinstance(n, ast.Name) and n.id == "Any")
                   or (isinstance(n, ast.Attribute) and n.attr == "Any"))
        mods[name] = {"path": p.relative_to(pkg.parent).as_posix(),
                      "lines": len(p.read_text().splitlines()), "top": top, "every": every,
                      "classes": classes, "any": anys}
    return mods


def floors(mods: dict[str, dict[str, object]]) -> dict[str, int]:
    # Memoised on the module alone: keyed on the path walked as well, the count of keys is
    # the count of import paths, which grows exponentially with the package's depth (it ran
    # out of memory at 167 modules). A module met again on the path being walked is a
    # top-level import circle, which Python would refuse anyway; it adds no floor.
    done: dict[str, int] = {}
    walking: set[str] = set()

    def floor(name: str) -> int:
        if name in done:
            return done[name]
        walking.add(name)
        deps = [d for d in mods[name]["top"] if d not in walking]  # type: ignore[attr-defined]
        done[name] = 1 + max((floor(d) for d in deps), default=-1)
        walking.discard(name)
        return done[name]

    return {name: floor(name) for name in mods}


def reachable(mods: dict[str, dict[str, object]]) -> dict[str, set[str]]:
    """For each module, every package module it imports, directly or not, by any import."""
    found: dict[str, set[str]] = {}
    for start in mods:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for dep in mods[todo.pop()]["every"]:  # type: ignore[attr-defined]
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        found[start] = seen
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository's root")
    args = parser.parse_args(argv)
    pkg = args.root / PKG_NAME
    mods = collect(pkg)
    floor = floors(mods)
    big = sorted(((m["lines"], m["path"]) for m in mods.values()
                  if int(m["lines"]) > BIG_MODULE_LINES), reverse=True)  # type: ignore[call-overload]
    print(f"modules over {BIG_MODULE_LINES} lines: {len(big)}")
    for lines, path in big:
        print(f"  {lines:5d}  {path}")
    classes = [(n, cls, m["path"]) for m in mods.values()
               for n, cls in m["classes"]]  # type: ignore[attr-defined]
    n, cls, path = max(classes)
    print(f"largest class: {cls} ({path}), {n} lines")
    reach = reachable(mods)
    up = sorted((name, dep) for name, m in mods.items()
                for dep in m["every"]  # type: ignore[attr-defined]
                if floor[dep] > floor[name] and name in reach[dep])
    print(f"imports from a lower layer up: {len(up)}")
    for name, dep in up:
        print(f"  {name} (floor {floor[name]}) -> {dep} (floor {floor[dep]})")
    print(f"Any: {sum(int(m['any']) for m in mods.values())}")  # type: ignore[call-overload]
    return 0


if __name__ == "__main__":
    sys.exit(main())
