"""The OOM form recogniser (gpumem_nb/oom/forms.py) against hostile exception classes:
a str-subclass __module__/__name__ whose methods count their calls, a huge message, a
__str__ returning a str subclass, long chains and wide exception groups, ESC in the text.
Called directly (find_oom) and through the shell (a cell that raises it).

    PYTHONPATH=. python benchmarks/attack36/oom_forms_hostile.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.attack36._harness import Cell, attack, make_shell, private_home, summary

HOME = private_home()
SHELL = make_shell()
ran: list[str] = []


class CountingStr(str):
    def __hash__(self) -> int:
        ran.append("__hash__")
        return str.__hash__(self)

    def __eq__(self, o: object) -> bool:
        ran.append("__eq__")
        return str.__eq__(self, o)

    def split(self, *a: Any, **k: Any) -> list[str]:  # type: ignore[override]
        ran.append("split")
        return str.split(self, *a, **k)

    def __str__(self) -> str:
        ran.append("__str__")
        return self

    def __contains__(self, x: object) -> bool:
        ran.append("__contains__")
        return str.__contains__(self, x)  # type: ignore[operator]


def hostile_module_class() -> type:
    cls = type("AcceleratorError", (RuntimeError,), {})
    cls.__module__ = CountingStr("torch")  # type: ignore[assignment]
    return cls


def hostile_name_class() -> type:
    cls = type("CudaErr", (RuntimeError,), {})
    cls.__name__ = CountingStr("OutOfMemoryError")
    cls.__module__ = "cupy.cuda.memory"
    return cls


def direct(make: Any) -> dict[str, Any]:
    from gpumem_nb.oom.forms import find_oom

    exc = make()
    ran.clear()
    t0 = time.perf_counter()
    found = find_oom(exc)
    dt = time.perf_counter() - t0
    return {"ran": sorted(set(ran)), "calls": len(ran), "found": None if found is None else
            (getattr(found[1], "key", None)), "find_s": round(dt, 4)}


def in_cell(make_src: str) -> dict[str, Any]:
    SHELL.user_ns.update(CountingStr=CountingStr, ran=ran,
                         hostile_module_class=hostile_module_class,
                         hostile_name_class=hostile_name_class)
    ran.clear()
    c = Cell(SHELL, make_src)
    text = c.text + " ".join(str(b.get("text/plain", "")) for b in c.bundles)
    return {"ran": sorted(set(ran)), "calls": len(ran), "cell_s": round(c.seconds, 3),
            "explained": "out of memory" in text.lower() and "gpumem" in text.lower(),
            "raw_esc_in_explanation": "\x1b[2J" in text.split("Traceback")[0]}


BIG = "CUDA error: out of memory\n" + "x" * (200 << 20)


def main() -> int:
    S = "OOM forms"
    cuda_oom = "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"
    attack(S, "AcceleratorError whose __module__ is a str subclass (split, __eq__ count)",
           lambda: direct(lambda: hostile_module_class()(cuda_oom)),
           lambda r: r["calls"] == 0)
    attack(S, "CuPy-like class whose __name__ is a str subclass (__str__, __hash__ count)",
           lambda: direct(lambda: hostile_name_class()(
               "Out of memory allocating 1,024 bytes (allocated so far: 0 bytes).")),
           lambda r: r["calls"] == 0)
    attack(S, "a RuntimeError whose __str__ returns a counting str subclass",
           lambda: direct(lambda: type("E", (RuntimeError,), {
               "__str__": lambda s: CountingStr(cuda_oom)})()),
           lambda r: r["calls"] <= 1)
    attack(S, "a 200 MiB 'CUDA error: out of memory' message",
           lambda: direct(lambda: RuntimeError(BIG)),
           lambda r: r["find_s"] < 0.5 and r["peak_mib"] - r["rss_before_mib"] < 700)
    attack(S, "an ExceptionGroup of 8 groups x 200,000 members, the OOM last",
           lambda: direct(lambda: ExceptionGroup("g", [ExceptionGroup(
               "h", [ValueError(str(i)) for i in range(200_000)]) for _ in range(8)]
               + [RuntimeError(cuda_oom)])),
           lambda r: r["find_s"] < 0.5)
    attack(S, "a __context__ chain of 100,000 then the OOM",
           lambda: direct(_long_chain), lambda r: r["find_s"] < 0.5)
    attack(S, "a CUDA OOM text with ESC[2J and U+202E, raised in a cell",
           lambda: in_cell("raise RuntimeError('CUDA error: out of memory \\x1b[2J\\u202e')"),
           lambda r: not r["raw_esc_in_explanation"])
    attack(S, "a cell raising the hostile-__module__ AcceleratorError",
           lambda: in_cell(f"raise hostile_module_class()({cuda_oom!r})"),
           lambda r: r["calls"] == 0)
    return summary("oom_forms_hostile")


def _long_chain() -> BaseException:
    e: BaseException = RuntimeError("CUDA error: out of memory")
    for i in range(100_000):
        n = ValueError(i)
        n.__context__ = e
        e = n
    return e


if __name__ == "__main__":
    sys.exit(main())
