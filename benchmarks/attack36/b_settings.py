"""B1-B3 again: settings values of odd types through `%config GpumemNb.X = V` and through the
shell's configuration before `%load_ext` (as ipython_config.py sets it).

    PYTHONPATH=. python benchmarks/attack36/b_settings.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.attack36._harness import Cell, attack, make_shell, private_home, summary

HOME = private_home()
SHELL = make_shell(load=False)

VALUES = {
    "interval = 10**5000 (no str() possible)": ("interval", "10**5000"),
    "threshold = 10**5000": ("threshold", "10**5000"),
    "device = 10**5000": ("device", "10**5000"),
    "interval = a list of 10**7 floats": ("interval", "[1.0] * 10**7"),
    "threshold = bytes with ESC": ("threshold", "b'\\x1b[2J1GiB'"),
    "threshold = str with ESC and U+2028, 200k chars": ("threshold", "'\\x1b[2J\\u2028' * 100000"),
    "peak = a lone surrogate": ("peak", "'\\ud800'"),
    "peak = str subclass whose __str__ raises": (
        "peak", "type('S', (str,), {'__str__': lambda s: 1/0})('reset')"),
    "interval = float subclass whose __float__ raises": (
        "interval", "type('F', (float,), {'__float__': lambda s: 1/0, "
        "'__repr__': lambda s: 1/0})(1.0)"),
    "auto_show = numpy-like object with raising __bool__": (
        "auto_show", "type('B', (), {'__bool__': lambda s: 1/0})()"),
}


def via_config(trait: str, expr: str) -> dict[str, Any]:
    SHELL.run_cell("%load_ext gpumem_nb")
    c = Cell(SHELL, f"%config GpumemNb.{trait} = {expr}")
    after = Cell(SHELL, "%gpumem config")
    return {"error": repr(c.error)[:200], "text": c.text[:400], "len": len(c.text),
            "raw_esc": "\x1b" in c.text, "traceback": c.traceback_shown,
            "surrogate": any(0xD800 <= ord(ch) <= 0xDFFF for ch in c.text),
            "cell_s": round(c.seconds, 3), "config_after_ok": after.error is None}


def via_ipython_config(trait: str, expr: str) -> dict[str, Any]:
    setattr(SHELL.config.GpumemNb, trait, eval(expr))
    c = Cell(SHELL, "%load_ext gpumem_nb")
    loaded = "gpumem_nb" in SHELL.extension_manager.loaded
    return {"error": repr(c.error)[:200], "text": c.text[:400], "len": len(c.text),
            "raw_esc": "\x1b" in c.text, "traceback": c.traceback_shown, "loaded": loaded,
            "surrogate": any(0xD800 <= ord(ch) <= 0xDFFF for ch in c.text),
            "cell_s": round(c.seconds, 3)}


def main() -> int:
    for label, (trait, expr) in VALUES.items():
        attack("B settings %config", label, lambda t=trait, e=expr: via_config(t, e),
               lambda r: not r["traceback"] and not r["raw_esc"] and not r["surrogate"]
               and r["len"] < 600 and r["cell_s"] < 2 and r["config_after_ok"])
        attack("B settings ipython_config", label,
               lambda t=trait, e=expr: via_ipython_config(t, e),
               lambda r: not r["traceback"] and r["loaded"] and not r["raw_esc"]
               and not r["surrogate"] and r["len"] < 600 and r["cell_s"] < 5)
    return summary("b_settings")


if __name__ == "__main__":
    sys.exit(main())
