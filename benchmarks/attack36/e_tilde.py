"""E1 again: `~` in `history --csv` and `watch --replay` with a symlink loop, a ~user that
does not exist, a HOME that holds escapes, an empty HOME, a HOME that is a file, a FIFO.

    PYTHONPATH=. python benchmarks/attack36/e_tilde.py
"""

from __future__ import annotations

import os
import sys
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
(HOME / "loop1").symlink_to(HOME / "loop2")
(HOME / "loop2").symlink_to(HOME / "loop1")
os.mkfifo(HOME / "fifo.csv")
os.mkfifo(HOME / "fifo.json")
(HOME / "adir").mkdir()
ESC_HOME = HOME / "h\x1b[2Jome"
ESC_HOME.mkdir()
A_FILE = HOME / "plainfile"
A_FILE.write_text("x")


def run(line: str, home: str | None = None) -> dict[str, Any]:
    old = os.environ.get("HOME")
    if home is not None:
        os.environ["HOME"] = home
    try:
        SHELL.run_cell("print(1)")  # a recorded cell, so history has a row
        SHELL.user_ns["_line"] = line
        c = Cell(SHELL, "get_ipython().run_line_magic('gpumem', _line)")
    finally:
        if old is not None:
            os.environ["HOME"] = old
    s = c.usage_sentence()
    written = sorted(str(p) for p in Path("/").glob("a36_*.csv"))
    for p in written:  # an empty HOME expands ~/x to /x, as bash does: not left behind
        Path(p).unlink()
    return {"usage_error": c.usage_error, "error": repr(c.error)[:200], "sentence": s[:400],
            "raw_esc": "\x1b" in s + c.text, "traceback": c.traceback_shown,
            "cell_s": round(c.seconds, 3), "csv_in_root": written, "printed": c.text[:200]}


def refused(r: dict[str, Any]) -> bool:
    return (r["usage_error"] and one_sentence(r["sentence"]) and not r["raw_esc"]
            and not r["traceback"] and r["cell_s"] < 3 and not r["csv_in_root"])


CASES = [
    ("history --csv ~/loop1 (a symlink loop)", "history --csv ~/loop1", None),
    ("history --csv ~/loop1/x.csv (inside a loop)", "history --csv ~/loop1/x.csv", None),
    ("watch --replay ~/loop1", "watch --replay ~/loop1", None),
    ("history --csv ~nosuchuser_a36/x.csv", "history --csv ~nosuchuser_a36/x.csv", None),
    ("watch --replay ~nosuchuser_a36/x.json", "watch --replay ~nosuchuser_a36/x.json", None),
    ("history --csv ~ (the home directory itself)", "history --csv ~", None),
    ("history --csv ~/fifo.csv (a FIFO)", "history --csv ~/fifo.csv", None),
    ("watch --replay ~/fifo.json (a FIFO)", "watch --replay ~/fifo.json", None),
    ("history --csv ~/adir/", "history --csv ~/adir/", None),
    ("history --csv ~/x.csv with HOME holding ESC (missing subdir)",
     "history --csv ~/nodir/x.csv", str(ESC_HOME)),
    ("watch --replay ~/x.json with HOME holding ESC", "watch --replay ~/x.json", str(ESC_HOME)),
    ("history --csv ~/x.csv with HOME a plain file", "history --csv ~/x.csv", str(A_FILE)),
    ("history --csv ~/" + "d/" * 3000 + "x.csv (a 6,000-char path)",
     "history --csv ~/" + "d/" * 3000 + "x.csv", None),
]


def main() -> int:
    for label, line, home in CASES:
        attack("E1 ~ paths", label[:120], lambda line=line, home=home: run(line, home), refused)
    # Removed if the empty-HOME case wrote there (it should not have been able to).
    Path("/a36_x.csv").unlink(missing_ok=True)
    return summary("e_tilde")


if __name__ == "__main__":
    sys.exit(main())
