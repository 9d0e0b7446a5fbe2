"""A3 and A4 again: the whole heap's cost (who --gc, cleanup) at sizes and shapes the
2026-12-05 round did not try, and key objects that run code in places it did not look
(a dict inside the namespace, an instance's __dict__, Out's int keys, tuple keys, a module).

    PYTHONPATH=. python benchmarks/attack36/a_holders_heap_keys.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.attack36._harness import Cell, attack, make_shell, private_home, summary

HOME = private_home()
SHELL = make_shell()

HOSTILE_CLASSES = '''
ran = []
class HStr(str):
    def __hash__(self): ran.append("HStr.__hash__"); return str.__hash__(self)
    def __eq__(self, o): ran.append("HStr.__eq__"); return str.__eq__(self, o)
    def __lt__(self, o): ran.append("HStr.__lt__"); return str.__lt__(self, o)
    def startswith(self, *a): ran.append("HStr.startswith"); return str.startswith(self, *a)
    def __format__(self, s): ran.append("HStr.__format__"); return str.__format__(self, s)
    def __str__(self): ran.append("HStr.__str__"); return str.__str__(self)
    def __repr__(self): ran.append("HStr.__repr__"); return str.__repr__(self)
    def __len__(self): ran.append("HStr.__len__"); return str.__len__(self)
    def __getitem__(self, i): ran.append("HStr.__getitem__"); return str.__getitem__(self, i)
    def isidentifier(self): ran.append("HStr.isidentifier"); return str.isidentifier(self)
    def __add__(self, o): ran.append("HStr.__add__"); return str.__add__(self, o)
class HInt(int):
    def __hash__(self): ran.append("HInt.__hash__"); return int.__hash__(self)
    def __eq__(self, o): ran.append("HInt.__eq__"); return int.__eq__(self, o)
    def __lt__(self, o): ran.append("HInt.__lt__"); return int.__lt__(self, o)
    def __gt__(self, o): ran.append("HInt.__gt__"); return int.__gt__(self, o)
    def __index__(self): ran.append("HInt.__index__"); return int.__index__(self)
    def __int__(self): ran.append("HInt.__int__"); return int.__int__(self)
    def __format__(self, s): ran.append("HInt.__format__"); return int.__format__(self, s)
    def __repr__(self): ran.append("HInt.__repr__"); return int.__repr__(self)
    def __str__(self): ran.append("HInt.__str__"); return int.__str__(self)
class Box: pass
'''

PLACES = {
    "a dict value's HStr key": "d = {HStr('kk'): cuda.tensor(64 * MiB)}",
    "an instance __dict__'s HStr key":
        "o = Box(); o.__dict__[HStr('attr')] = cuda.tensor(64 * MiB)",
    "Out's HInt key": "Out[HInt(99999)] = cuda.tensor(64 * MiB)",
    "a tuple key holding an HStr": "tk = {(HStr('a'), HInt(1)): cuda.tensor(64 * MiB)}",
    "a user module's HStr global": ("import types, sys; mm = types.ModuleType('usermod'); "
                                    "mm.__dict__[HStr('g')] = cuda.tensor(64 * MiB); "
                                    "sys.modules['usermod'] = mm; del mm"),
    "an HStr namespace key whose value is a dict with HStr keys":
        "globals()[HStr('outer')] = {HStr('inner'): cuda.tensor(64 * MiB)}",
}
LOOKS = ["%gpumem who", "%gpumem who --gc", "%gpumem cleanup --dry-run --out",
         "big = cuda.tensor(400 * GiB)"]


def keys_attack(setup: str) -> dict[str, Any]:
    SHELL.run_cell(HOSTILE_CLASSES)
    r = SHELL.run_cell(setup)
    ran = SHELL.user_ns["ran"]
    out: dict[str, Any] = {"setup_error": repr(r.error_in_exec)[:100] if r.error_in_exec else ""}
    ran.clear()
    found = {}
    for look in LOOKS:
        before = len(ran)
        c = Cell(SHELL, look)
        found[look] = sorted(set(ran[before:]))
        out.setdefault("tracebacks", 0)
        out["tracebacks"] += c.traceback_shown and "400 * GiB" not in look
        if look == "%gpumem who":
            out["who_mentions"] = [k for k in ("kk", "attr", "99999", "'a'", "usermod", "inner")
                                   if k in c.text + str([b.get("text/plain") for b in c.bundles])]
    out["ran"] = {k: v for k, v in found.items() if v}
    return out


def heap(n: int, shape: str, command: str) -> dict[str, Any]:
    build = {
        "lists": f"junk = [[] for _ in range({n})]",
        "one dict of lists": f"junk = {{i: [] for i in range({n})}}",
        "a linked chain": (f"junk = None\nfor _ in range({n}): junk = [junk]"),
    }[shape]
    SHELL.run_cell(build)
    SHELL.run_cell("t = cuda.tensor(256 * MiB); hidden = [[[t]]]; del t")
    SHELL.run_cell("raise ValueError('stored')")
    import gc
    tracked = len(gc.get_objects())
    c = Cell(SHELL, command)
    text = c.text + " ".join(str(b.get("text/plain", "")) for b in c.bundles)
    return {"gc_tracked": tracked, "cell_s": round(c.seconds, 2),
            "traceback": c.traceback_shown, "error": repr(c.error)[:120],
            "says_not_searched": "not searched" in text or "rest of the heap" in text,
            "text_head": text[:300]}


def main() -> int:
    for label, setup in PLACES.items():
        attack("A4 keys run code", label, lambda s=setup: keys_attack(s),
               lambda r: not r["ran"] and not r["tracebacks"])
    for n, shape in ((10_000_000, "lists"), (5_000_000, "one dict of lists"),
                     (5_000_000, "a linked chain")):
        for cmd in ("%gpumem who --gc", "%gpumem cleanup"):
            attack("A3 whole heap", f"{cmd} over {n:,} objects as {shape}",
                   lambda n=n, shape=shape, cmd=cmd: heap(n, shape, cmd),
                   lambda r: r["cell_s"] < 5 and not r["traceback"], timeout_s=600)
    return summary("a_holders_heap_keys")


if __name__ == "__main__":
    sys.exit(main())
