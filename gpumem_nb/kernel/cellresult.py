"""What the shell's ``info`` and ``result`` say about a cell, read without running the user's
code: its key, its number, whether it held code, and its error in one line.
"""

from __future__ import annotations

import hashlib

from .. import userexc
from ..cellnames import counts_ahead_at_start
from ..errtext import error_str
from ..oom import first_line

__all__ = ["cell_exception", "cell_key_of", "count_of", "error_text", "pre_count", "ran_code"]


def pre_count(shell: object, info: object) -> int | None:
    """The cell's number as seen before it runs; cells that store no history get none.
    IPython >= 9.8 has already advanced ``execution_count`` by then, older ones have not."""
    count = getattr(shell, "execution_count", None)
    if not isinstance(count, int) or not getattr(info, "store_history", True):
        return None
    return count - 1 if counts_ahead_at_start() else count


def cell_key_of(info: object) -> str:
    """The frontend's cell id when it sends one, else a hash of the source."""
    cell_id = getattr(info, "cell_id", None)
    if cell_id:
        return str(cell_id)
    raw = getattr(info, "raw_cell", "") or ""
    # surrogatepass: a cell holding a lone surrogate (pasted binary) still gets its key
    return "src:" + hashlib.sha1(raw.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def count_of(result: object) -> int | None:
    count = getattr(result, "execution_count", None)
    return count if isinstance(count, int) else None


def ran_code(result: object) -> bool:
    """A cell that held code (a blank one also ends without having begun)."""
    raw = getattr(getattr(result, "info", None), "raw_cell", None)
    return isinstance(raw, str) and bool(raw.strip())


def cell_exception(result: object) -> BaseException | None:
    err = getattr(result, "error_in_exec", None)
    return err if userexc.is_exception(err) else None


def error_text(result: object) -> str:
    """A cell's error in one short line for its record; never raises, whatever the
    exception's ``__str__``, ``__bool__`` or class do, and costs the same for a 10 MB
    message."""
    if result is None:
        return ""
    err = getattr(result, "error_in_exec", None)
    if err is None:
        err = getattr(result, "error_before_exec", None)
    if not userexc.is_exception(err):
        return ""
    name = userexc.type_name(err)
    text = first_line(error_str(err), 200)
    return f"{name}: {text}"[:200] if text else name
