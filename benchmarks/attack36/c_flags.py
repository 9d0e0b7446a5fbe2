"""C1-C2 again: flags with `=`, unicode dashes, ambiguous prefixes, lone surrogates, NUL,
U+2028, one huge word, the 200-word edge, and option values that carry escapes.

    PYTHONPATH=. python benchmarks/attack36/c_flags.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.attack36._harness import (
    Cell,
    attack,
    make_shell,
    one_sentence,
    private_home,
    summary,
)

HOME = private_home()
SHELL = make_shell()
ESC = "\x1b[31m"

LINES = {
    "--device=ESC": f"who --device={ESC}red",
    "--interval=ESC (config)": f"config --interval={ESC}",
    "--threshold=U+202E": "config --threshold=\u202e1GiB",
    "--vars=ESC (cleanup)": f"cleanup --dry-run --vars=a,{ESC}b",
    "--replay=ESC (watch, missing file)": f"watch --replay=/nonexistent/{ESC}x.json",
    "--csv=ESC (history, missing dir)": f"history --csv=/nonexistent/{ESC}x.csv",
    "--trace=ESC (whatif, missing file)": f"whatif --trace=/nonexistent/{ESC}x.pickle",
    "ambiguous prefix with = and ESC": f"cleanup --d={ESC}",
    "ambiguous prefix --d alone": "cleanup --d",
    "em dash flag": "config \u2014interval 1",
    "en dash flag": "config \u2013interval 1",
    "U+2010 hyphens": "config \u2010\u2010interval 1",
    "minus signs U+2212": "config \u2212\u2212interval 1",
    "fullwidth hyphen-minus": "config \uff0d\uff0dinterval 1",
    "lone surrogate flag": "who --\ud800x",
    "NUL in a flag": "who --gc\x00x",
    "U+2028 in a flag": "who --g\u2028c",
    "a flag of 1,000,000 chars": "who --" + "g" * 1_000_000,
    "1,000,000-char flag of ESC": "who --" + "\x1b" * 1_000_000,
    "199 unknown + a value flag at the edge": "who " + " ".join(["--x"] * 199) + " --device 0",
    "20,000 words of '=' flags": "who " + " ".join(f"--a{i}=\x1b" for i in range(20_000)),
    "-- then junk": "who -- " + ESC,
    "interval 5e-324 (subnormal)": "config --interval 5e-324",
    "interval -0.0": "config --interval -0.0",
    "threshold -1e999": "config --threshold -1e999",
    "device 10**5000 digits": "config --device " + "9" * 5000,
    "--peak with ESC": f"config --peak {ESC}",
    "unbalanced quote with ESC": f"who '{ESC}",
}


def run(line: str) -> dict[str, Any]:
    SHELL.user_ns["_line"] = line
    t0 = time.perf_counter()
    # The magic's own function, past IPython's $-expansion of the line (quadratic in its
    # length: 18.8 s at 20,000 characters, 75 s at 40,000, before gpumem_nb sees it).
    c = Cell(SHELL, "get_ipython().magics_manager.registry['GpumemMagics'].gpumem(_line)")
    s = c.usage_sentence()
    return {"usage_error": c.usage_error, "error": repr(c.error)[:200], "sentence": s[:500],
            "sentence_len": len(s), "raw_esc": "\x1b" in s + c.text,
            "raw_bidi": any(ch in s for ch in "\u202e\u2028\x00"),
            "raw_surrogate": any(0xD800 <= ord(ch) <= 0xDFFF for ch in s),
            "traceback": c.traceback_shown, "cell_s": round(time.perf_counter() - t0, 3),
            "printed": c.text[:300]}


def refused_cleanly(r: dict[str, Any]) -> bool:
    if r["error"] == "None":  # taken as a valid command: nothing raw printed
        return not r["raw_esc"] and not r["traceback"] and r["cell_s"] < 2
    return (r["usage_error"] and one_sentence(r["sentence"]) and not r["raw_esc"]
            and not r["raw_bidi"] and not r["raw_surrogate"] and not r["traceback"]
            and r["cell_s"] < 2)


def main() -> int:
    for label, line in LINES.items():
        attack("C flags", label, lambda line=line: run(line), refused_cleanly)
    return summary("c_flags")


if __name__ == "__main__":
    sys.exit(main())
