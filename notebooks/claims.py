"""The tutorials' prose, checked by the cells that measure it.

A sentence such as "reserved fell to 0 B" is only true on the GPU and torch where the notebook
ran. Each code cell that measures something the text then states ends with the claim it
supports::

    claim(reserved_after == 0, "empty_cache() gave every cached byte back",
          reserved=fmt(reserved_after))

A claim that holds prints one line starting with ``✓``: the sentence, then the values it rests
on (``reserved = 0 B``), so a reader sees what was checked and with which numbers. Without
values given, the line shows the operands of ``holds`` itself (the names, attributes and
subscripts it compared, as they were), read from the cell's source. One that does not hold
raises ``ClaimFailed`` with the sentence and the measured values: executing the notebook on a
GPU or a torch that behaves differently then stops at that cell, instead of saving a tutorial
whose text its own outputs contradict. ``run_tutorials.py`` names the claim and the cell.

A claim that cannot apply on this host (no GPU, no NVML figure) is not dropped in silence:
``skipped(says, why)`` prints a line starting with ``⊘`` that says which claim and why.

Every claim, held, failed or skipped, is also recorded: ``take_records()`` hands the records
made since its last call to the runner, which saves them in the notebook's metadata with a
digest of the cell's outputs (``tools/tutorials/run_tutorials.py``);
``tools/tutorials/tests/test_tutorial_prose.py`` then fails on a ``✓`` line no claim wrote, a
claim whose cell is gone, or outputs changed since.

With ``TUTORIAL_CLAIMS=report`` in the environment a failed claim prints a line starting with
``✗ CLAIM FAILED`` and the notebook goes on: a first run on a new machine then lists every
claim to revisit at once. Saved tutorials are executed in the default, strict mode.

This module is deliberately independent of gpumem_nb: the checks must not share the code they
check.
"""

from __future__ import annotations

import ast
import json
import linecache
import numbers
import os
import re
import sys
from types import FrameType
from typing import Any

FAILED_MARK = "✗ CLAIM FAILED"
HELD_MARK = "✓"
SKIPPED_MARK = "⊘ skipped:"
# The longest operand text shown; a longer string or a container is no value a reader reads.
VALUE_CHARS = 120
# A unit constant (MiB = 2**20) is how a value is written, not a value the claim compared.
UNIT_NAME = re.compile(r"[KMGT]i?B")

_records: list[dict[str, Any]] = []


class ClaimFailed(AssertionError):
    """The run contradicts a sentence of the tutorial."""


def _shown(value: Any) -> str | None:
    """How an operand reads on a ✓ line; None for what is no single value."""
    if value is None or isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return f"{float(value):.6g}"
    if isinstance(value, str) and len(value) <= VALUE_CHARS:
        return repr(value)
    return None


def _call_site(frame: FrameType) -> ast.Call | None:
    """The ``claim(...)`` call that is running in ``frame``, from the cell's source (IPython
    keeps each cell's source in ``linecache``)."""
    lines = linecache.getlines(frame.f_code.co_filename)
    if not lines:
        return None
    try:
        tree = ast.parse("".join(lines))
    except SyntaxError:
        return None
    line = frame.f_lineno
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id == "claim"
             and n.lineno <= line <= (n.end_lineno or n.lineno)]
    return min(calls, key=lambda n: n.lineno) if calls else None


def _operand(node: ast.AST, frame: FrameType) -> Any:
    """The value of a name, ``a.b`` or ``a[k]`` (k a constant or a name), read without calling
    anything the cell did not call; raises LookupError when it is no such expression."""
    if isinstance(node, ast.Name):
        if node.id in frame.f_locals:
            return frame.f_locals[node.id]
        if node.id in frame.f_globals:
            return frame.f_globals[node.id]
        raise LookupError(node.id)
    if isinstance(node, ast.Attribute):
        return getattr(_operand(node.value, frame), node.attr)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, (ast.Constant, ast.Name)):
        container = _operand(node.value, frame)
        if not isinstance(container, (list, tuple, dict)):
            raise LookupError("not a plain container")
        key = (node.slice.value if isinstance(node.slice, ast.Constant)
               else _operand(node.slice, frame))
        return container[key]
    raise LookupError(type(node).__name__)


def operands(frame: FrameType | None) -> dict[str, str]:
    """What the running ``claim`` call's first argument compared: each name, attribute and
    subscript in it that holds a single value, by its source text."""
    if frame is None:
        return {}
    call = _call_site(frame)
    if call is None or not call.args:
        return {}
    source = "".join(linecache.getlines(frame.f_code.co_filename))
    found: dict[str, str] = {}
    for node in ast.walk(call.args[0]):
        if not isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)):
            continue
        text = ast.get_source_segment(source, node)
        if not text or text in found or UNIT_NAME.fullmatch(text):
            continue
        try:
            shown = _shown(_operand(node, frame))
        except Exception:  # an operand we cannot read is simply not shown
            continue
        if shown is not None:
            found[text] = shown
    return found


def _line(mark: str, says: str, values: dict[str, str]) -> str:
    shown = "; ".join(f"{k} = {v}" for k, v in values.items())
    return f"{mark} {says}" + (f" [{shown}]" if shown else "")


def claim(holds: Any, says: str, **measured: Any) -> None:
    """Check one sentence of the prose against this run: ``holds`` must be true.

    ``says`` is the sentence as the text states it; ``measured`` are the values it rests on,
    as the reader would want to see them (formatted sizes, counts), shown on its line. Without
    them the line shows the operands ``holds`` compared.
    """
    values = {k: str(v) for k, v in measured.items()}
    compared = operands(sys._getframe(1))
    shown = values or compared
    record = {"says": says, "values": values, "operands": compared}
    if holds:
        line = _line(HELD_MARK, says, shown)
        _records.append({**record, "status": "held", "line": line})
        print(line)
        return
    text_values = ", ".join(f"{k} = {v}" for k, v in shown.items()) or "(no values given)"
    line = f"{FAILED_MARK}: {says} ({text_values})"
    _records.append({**record, "status": "failed", "line": line})
    text = (f"The tutorial says: {says}\nThis run measured: {text_values}\n"
            "Either the text is wrong, or this GPU / torch behaves differently: find out which "
            "before saving the notebook.")
    if os.environ.get("TUTORIAL_CLAIMS") == "report":
        print(line)
        print(line, file=sys.stderr)
        return
    raise ClaimFailed(text)


def skipped(says: str, why: str) -> None:
    """A claim that does not apply on this host, said so instead of left out: ``⊘ skipped:
    <the sentence> (<why>)``."""
    line = f"{SKIPPED_MARK} {says} ({why})"
    _records.append({"says": says, "values": {}, "operands": {}, "status": "skipped",
                     "why": why, "line": line})
    print(line)


def take_records() -> str:
    """The claims recorded since the last call, as JSON, for the runner (which calls this
    silently after each cell)."""
    taken = list(_records)
    _records.clear()
    return json.dumps(taken, ensure_ascii=False)


def near(a: float, b: float, *, within: float = 0.0, rel: float = 0.0) -> bool:
    """``a`` and ``b`` differ by at most ``within`` (absolute) or ``rel`` of the larger one."""
    return abs(a - b) <= max(within, rel * max(abs(a), abs(b)))
