"""The tutorials cannot teach a falsehood (issue 20).

Three rules bind a tutorial's text to what its own cells measured:

- **a quoted number is printed beside it**: every number with a unit in a markdown cell (B,
  KiB…TiB, KB…TB, bytes, ns…s, seconds, %) must be printed, with the same value and unit, by
  an output of the code cell right above or right below that markdown cell. The prose may drop
  trailing zeros ("60 GiB" for a printed "60.00 GiB", "1,024 MiB" for "1024 MiB") and nothing
  else: "1 GiB" is not "1.49 GiB", nor "1024.00 MiB";
- **a claim is checked where it is measured**: a code cell that calls ``claim(...)``
  (``notebooks/claims.py``) must show a ``✓`` line in its outputs, and none shows
  ``✗ CLAIM FAILED``; each tutorial checks at least one claim;
- **the notebook is its source, executed at the commit it names**: same cells, same ids, and
  the ``sources_sha256`` the runner recorded is the digest of the package and tutorial
  sources at that commit (this checkout's, or an earlier commit's that git still holds, in
  which case ``notebooks/README.md`` must say that the tutorials ran on older code).

A notebook executed by the current runner also records, in its metadata, every claim its cells
made (the sentence, the values it compared, the line it printed) and a digest of each code
cell's outputs: a ✓ line that no claim wrote, a claim whose cell is gone, or outputs changed
after the run then fail (the review's three forgeries, tested on a notebook executed here).
The notebooks executed before the record existed (at efadd2a) are checked against their
commit's sources, and ``notebooks/README.md`` says they ran on older code.

The tests on the executed notebooks read ``notebooks/NN_*.ipynb`` as committed; a source
without its notebook is "not yet executed", which the README must say. Only the GPU
machine can produce those (``python tools/tutorials/run_tutorials.py OUT_DIR``), so after any
change
to ``gpumem_nb/`` or a tutorial's source they fail until the tutorials are executed again
there. The tests of the checkers run anywhere, and show that each rule can fail.
"""

from __future__ import annotations

import copy
import functools
import html
import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, NoReturn

import nbformat
import pytest

from tests.helpers import notebook_module, tutorial_tool

# The tutorial machinery (runner, claims, output digests), not the extension.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
NOTEBOOKS = ROOT / "notebooks"


RUNNER = tutorial_tool("run_tutorials")
SOURCES = RUNNER.tutorial_sources()
ALL_NAMES = [p.stem for p in SOURCES]
# A source whose notebook the GPU machine has not produced yet is "not yet executed", which the
# README must say (test_the_readme_lists_every_tutorial_and_says_which_are_not_yet_executed);
# the rules on executed notebooks apply to the others.
NAMES = [n for n in ALL_NAMES if (NOTEBOOKS / f"{n}.ipynb").exists()]
NOT_YET_EXECUTED = [n for n in ALL_NAMES if n not in NAMES]

# Units a quantity can carry; written forms that name the same unit map to one.
UNITS = {
    "B": "B", "byte": "B", "bytes": "B", "KiB": "KiB", "MiB": "MiB", "GiB": "GiB",
    "TiB": "TiB", "KB": "kB", "kB": "kB", "MB": "MB", "GB": "GB", "TB": "TB",
    "ns": "ns", "µs": "µs", "μs": "µs", "us": "µs", "ms": "ms", "s": "s", "second": "s",
    "seconds": "s", "%": "%",
    # Spelled out: "512 mebibytes" hid its number from the rule (review, F6).
    "kibibyte": "KiB", "kibibytes": "KiB", "mebibyte": "MiB", "mebibytes": "MiB",
    "gibibyte": "GiB", "gibibytes": "GiB", "kilobyte": "kB", "kilobytes": "kB",
    "megabyte": "MB", "megabytes": "MB", "gigabyte": "GB", "gigabytes": "GB",
    "nanosecond": "ns", "nanoseconds": "ns", "microsecond": "µs", "microseconds": "µs",
    "millisecond": "ms", "milliseconds": "ms", "percent": "%",
}
_UNIT_RE = "|".join(sorted((re.escape(u) for u in UNITS), key=len, reverse=True))
# A number not glued to a word or another number ("H200", "v2.6" and "cu130" are no
# quantities), thousands separators allowed, then its unit as a whole word.
# Any run of white space between the two, a line break included: markdown renders "512  MiB"
# and "512" at a line's end with "MiB" on the next as "512 MiB" (review, F6). A number may be
# written with an exponent ("5.12e2 MiB").
QUANTITY = re.compile(
    r"(?<![\w.,])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*("
    + _UNIT_RE + r")(?!\w)")
# LaTeX a notebook renders as text: "$512\,\text{MiB}$" reads "512 MiB".
LATEX_SPACE = re.compile(r"\\[,;:! ]|\\q?quad|~")
LATEX_TEXT = re.compile(r"\\(?:text|mathrm|mathsf|textrm|rm|mbox)\s*\{([^{}]*)\}")
# "½ GiB" and "1½ GiB": a vulgar fraction is a number too.
FRACTION = re.compile(r"(\d*)([\u00bc-\u00be\u2150-\u215e])")
CODE_SPAN = re.compile(r"`[^`]*`")  # `max_split_size_mb:128` is a name, not a quantity
HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
TAGS = re.compile(r"<[^>]+>")
HELD, FAILED, SKIPPED = "✓", "✗ CLAIM FAILED", "⊘ skipped:"
MARKERS = re.compile(r"DEPENDS\(|TODO-GPU")


@dataclass(frozen=True)
class Quantity:
    text: str
    value: Decimal
    unit: str

    @property
    def decimals(self) -> int:
        exponent = self.value.as_tuple().exponent
        return -exponent if isinstance(exponent, int) and exponent < 0 else 0

    def quotes(self, printed: Quantity) -> bool:
        """This prose figure is the printed one, up to trailing zeros: "60 GiB" quotes
        "60.00 GiB"; "1.5 GiB" does not quote "1.49 GiB", nor "1 GiB" "1024.00 MiB"."""
        return (self.unit == printed.unit and printed.decimals >= self.decimals
                and printed.value == self.value)


def as_read(text: str) -> str:
    """Text as a reader reads it: a format character (zero-width space, word joiner, byte
    order mark) is nothing, and every space (thin, narrow no-break) is a space; "861\u2009ms"
    hid its number from the rule."""
    import unicodedata

    text = LATEX_TEXT.sub(r" \1", LATEX_SPACE.sub(" ", text))
    text = FRACTION.sub(lambda m: str(Decimal(m.group(1) or 0)
                                      + Decimal(str(unicodedata.numeric(m.group(2))))), text)
    return "".join("" if unicodedata.category(ch) == "Cf"
                   else " " if unicodedata.category(ch) == "Zs" else ch for ch in text)


def quantities(text: str) -> list[Quantity]:
    text = as_read(CODE_SPAN.sub(" ", HTML_COMMENT.sub(" ", text)))
    return [Quantity(m.group(0), Decimal(m.group(1).replace(",", "")), UNITS[m.group(2)])
            for m in QUANTITY.finditer(text)]


# Inline markup a reader does not see as a gap: "**0** ms" reads "0 ms".
INLINE_TAGS = re.compile(r"</?(?:strong|em|b|i|u|s|del|ins|mark|small|span|a|abbr|kbd)\b[^>]*>")
CODE_ELEMENT = re.compile(r"<code>(.*?)</code>", re.DOTALL)
BARE_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def prose_as_read(markdown: str) -> str:
    """A markdown cell's text as a reader sees it rendered: emphasis, escapes ("8\\.00") and
    entities ("&thinsp;") resolved, HTML tags and comments gone. Code is a name, not a figure
    ("`max_split_size_mb:128`"), unless it is a bare number beside a unit ("`0` ms")."""
    from markdown_it import MarkdownIt  # jupytext's own markdown parser

    # LaTeX first: markdown would take "\\," for an escaped comma.
    markdown = LATEX_TEXT.sub(r" \1", LATEX_SPACE.sub(" ", markdown))
    rendered = HTML_COMMENT.sub(" ", MarkdownIt("commonmark").enable(
        ["table", "strikethrough"]).render(markdown))
    rendered = CODE_ELEMENT.sub(
        lambda m: m.group(1) if BARE_NUMBER.fullmatch(html.unescape(m.group(1))) else " ",
        rendered)
    return html.unescape(TAGS.sub(" ", INLINE_TAGS.sub("", rendered)))


def output_text(cell: Any) -> str:
    """Everything a reader sees in a cell's outputs: streams, plain text, HTML as text,
    errors."""
    parts: list[str] = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            parts += [out.get("ename", ""), out.get("evalue", ""), *out.get("traceback", [])]
        parts.append(str(out.get("text", "")))
        data = out.get("data", {})
        for mime in ("text/plain", "text/markdown"):
            parts.append(str(data.get(mime, "")))
        if "text/html" in data:
            parts.append(html.unescape(TAGS.sub(" ", str(data["text/html"]))))
    return ANSI.sub("", "\n".join(parts))


def unquoted_numbers(nb: Any) -> list[str]:
    """The prose's quantities that neither neighbouring code cell printed."""
    missing = []
    cells = nb.cells
    for i, cell in enumerate(cells):
        if cell.cell_type != "markdown":
            continue
        beside = [c for c in cells[max(i - 1, 0):i] + cells[i + 1:i + 2] if c.cell_type == "code"]
        printed = [q for c in beside for q in quantities(output_text(c))]
        for q in quantities(prose_as_read(cell.source)):
            if not any(q.quotes(p) for p in printed):
                missing.append(f"{cell.get('id', i)}: {q.text!r}")
    return missing


def unchecked_claims(nb: Any) -> list[str]:
    """Cells that call claim() but show no ✓ line, or show a failed claim."""
    problems = []
    claiming = claiming_cells(nb)
    for cell in nb.cells:
        if cell.cell_type != "code" or cell.id not in claiming:
            continue
        lines = output_text(cell).splitlines()
        if any(line.startswith(FAILED) for line in lines):
            problems.append(f"{cell.id}: a claim failed")
        elif not any(line.startswith((HELD, SKIPPED)) for line in lines):
            problems.append(f"{cell.id}: claims, but printed no ✓ line")
    return problems


def executed(name: str) -> Any:
    path = NOTEBOOKS / f"{name}.ipynb"
    assert path.exists(), (f"{path.name} is missing: execute the tutorials on the GPU machine "
                           "(python tools/tutorials/run_tutorials.py OUT_DIR)")
    return nbformat.read(path, as_version=4)


MARKED = (HELD, FAILED, SKIPPED)


# What a reader sees as text, in each form a display output can take: JupyterLab shows the
# richest (HTML before plain text), GitHub another; each must show the same claim lines.
SHOWN_AS_TEXT = ("text/plain", "text/markdown", "text/html", "text/latex", "image/svg+xml")


def _clean(line: str) -> str:
    """A line as a reader reads it: no invisible format characters (a zero-width space before
    a ✓ hid it from the check), no surrounding space."""
    import unicodedata

    return "".join(ch for ch in line if unicodedata.category(ch) != "Cf").strip()


def _marked(text: str) -> list[str]:
    # A mark anywhere in a line makes it a claim's line to a reader, not only at its start.
    return [ln for ln in map(_clean, text.splitlines()) if any(m in ln for m in "✓⊘✗")]


def output_forms(out: Any) -> dict[str, list[str]]:
    """The claim lines each form of one output shows (a stream has one form)."""
    if out.get("output_type") == "stream":
        return {"stream": _marked(str(out.get("text", "")))}
    if out.get("output_type") == "error":
        return {"error": _marked(output_text({"outputs": [out]}))}
    data = out.get("data", {})
    forms = {}
    for mime in SHOWN_AS_TEXT:
        if mime in data:
            text = str(data[mime])
            if mime in ("text/html", "image/svg+xml"):
                text = html.unescape(TAGS.sub("\n", text))
            forms[mime] = _marked(ANSI.sub("", text))
    return forms


def marked_lines(cell: Any) -> list[str]:
    """The claim lines a reader sees in a cell's outputs (✓, ⊘ skipped, ✗), in order, on
    stdout and stderr alike; a report-mode failure's copy on stderr is not a second line."""
    lines: list[str] = []
    for out in cell.get("outputs", []):
        forms = output_forms(out)
        shown = next((v for v in forms.values() if v), [])
        if out.get("output_type") == "stream" and out.get("name") == "stderr":
            shown = [ln for ln in shown if not ln.startswith(FAILED)]
        lines += shown
    return lines


def forms_that_disagree(cell: Any) -> list[str]:
    """Outputs whose forms show different claim lines (a ✓ in the plain text, something else
    in the HTML that JupyterLab shows instead)."""
    disagree = []
    for i, out in enumerate(cell.get("outputs", [])):
        forms = output_forms(out)
        if len({tuple(v) for v in forms.values()}) > 1:
            disagree.append(f"output {i}: {sorted(forms)}")
    return disagree


def claim_line(record: dict[str, Any]) -> str:
    """The line a recorded claim printed, rebuilt from its sentence and values here (not with
    claims.py's code: the check must not share the code it checks).

    The values are put in the order the recorded line shows them: the notebook's metadata is
    written with sorted keys, so the record keeps which values, not their order (the first
    H200 run at b27572d failed every tutorial on that alone). Any other difference, a value
    or the sentence, still makes the rebuilt line differ."""
    recorded = record.get("values") or record.get("operands") or {}
    line = str(record.get("line", ""))

    def place(item: tuple[str, Any]) -> int:
        at = line.find(f"{item[0]} = {item[1]}")
        return at if at >= 0 else len(line)

    shown = dict(sorted(recorded.items(), key=place))
    values = "; ".join(f"{k} = {v}" for k, v in shown.items())
    if record["status"] == "skipped":
        return f"{SKIPPED} {record['says']} ({record['why']})"
    if record["status"] == "failed":
        listed = ", ".join(f"{k} = {v}" for k, v in shown.items()) or "(no values given)"
        return f"{FAILED}: {record['says']} ({listed})"
    return f"{HELD} {record['says']}" + (f" [{values}]" if values else "")


def records_checks(nb: Any) -> bool:
    """Executed by a runner that records each claim and its cell's outputs' digest."""
    return "checks_version" in nb.metadata.get("gpumem_nb", {})


@dataclass(frozen=True)
class ClaimCall:
    """A ``claim(...)``/``skipped(...)`` call in a cell's source: the sentence it can say (a
    pattern: an f-string's fields match anything) and whether every run of the cell makes it
    (a statement of the cell itself, not inside a branch, loop, ``try`` or function)."""

    says: re.Pattern[str]
    sentence: str  # as the source writes it, an f-string's fields as "{…}"
    always: bool
    kind: str = "claim"  # or "skipped"
    why: re.Pattern[str] | None = None  # a skip's reason, as a pattern like ``says``
    line: int = 0  # the line it starts on, in what the cell runs
    # A claim's condition (its first argument) and the code it is in, as IPython ran it.
    condition: Any = field(default=None, compare=False)
    code: str = field(default="", compare=False)

    def wrote(self, record: dict[str, Any]) -> bool:
        """``record`` could be this call's: its sentence, from its kind of call (``claim``
        records a claim that held or failed, only ``skipped`` a skip, with its reason)."""
        if not self.says.fullmatch(str(record.get("says", ""))):
            return False
        if (record.get("status") == "skipped") != (self.kind == "skipped"):
            return False
        return self.why is None or self.why.fullmatch(str(record.get("why", ""))) is not None


def _says_pattern(node: Any) -> tuple[re.Pattern[str], str]:
    import ast

    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.compile(re.escape(node.value)), node.value
    if isinstance(node, ast.JoinedStr):
        parts = [str(v.value) if isinstance(v, ast.Constant) else None for v in node.values]
        return (re.compile("".join(".*?" if p is None else re.escape(p) for p in parts),
                           re.DOTALL), "".join("{…}" if p is None else p for p in parts))
    return re.compile(".*", re.DOTALL), "{…}"  # a sentence built at run time: anything


# Cell magics whose body is Python that IPython runs as a cell: a claim there is a claim.
PYTHON_CELL_MAGICS = ("%%gpumem", "%%time", "%%timeit", "%%capture")
DEFAULT_CLAIM_NAMES = {"claim": "claim", "skipped": "skipped"}


@functools.cache  # each check reads every cell; parse each once
def python_of(source: str) -> Any:
    """The syntax tree of what a code cell runs (line magics and shell escapes as IPython
    transforms them; a Python cell magic's body likewise); None for a cell in another language
    (``%%bash``) or one that does not parse."""
    import ast


    text = python_text(source)
    if text is None:
        return None
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


@functools.cache
def python_text(source: str) -> str | None:
    """The Python a code cell runs, as text (None for another language)."""
    from IPython.core.inputtransformer2 import TransformerManager

    if source.startswith("%%"):
        first, _, source = source.partition("\n")
        if first.split()[0] not in PYTHON_CELL_MAGICS:
            return None
    try:
        return str(TransformerManager().transform_cell(source))
    except SyntaxError:
        return None


def claim_names(cells: list[Any]) -> dict[str, str]:
    """How the notebook spells ``claim`` and ``skipped``: their own names, ``claims.claim``,
    and the names an import gives them (``from claims import claim as check``)."""
    import ast

    names = dict(DEFAULT_CLAIM_NAMES)
    for cell in cells:
        tree = python_of(cell.source)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.ImportFrom) and node.module == "claims":
                names.update({a.asname or a.name: a.name for a in node.names
                              if a.name in DEFAULT_CLAIM_NAMES})
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == "claims":
                        names.update({f"{a.asname or a.name}.{k}": k
                                      for k in DEFAULT_CLAIM_NAMES})
    return names


def _called(node: Any) -> str:
    import ast

    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return ""


def claim_calls(source: str, names: dict[str, str] | None = None
                ) -> tuple[list[ClaimCall], list[ClaimCall]]:
    """The cell's own claim calls, and those inside the functions it defines (a helper that
    claims for the cells that call it). ``names``: how the notebook spells the two calls."""
    import ast

    names = names or DEFAULT_CLAIM_NAMES
    tree = python_of(source)
    if tree is None:
        return [], []
    own: list[ClaimCall] = []
    defined: list[ClaimCall] = []
    top = {id(stmt.value) for stmt in tree.body if isinstance(stmt, ast.Expr)}
    functions = [n for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    in_function = {id(c) for f in functions for c in ast.walk(f)}
    for node in ast.walk(tree):
        kind = names.get(_called(node.func)) if isinstance(node, ast.Call) else None
        if kind is None:
            continue
        position = 1 if kind == "claim" else 0
        said = node.args[position] if len(node.args) > position else next(
            (k.value for k in node.keywords if k.arg == "says"), None)
        why = None
        if kind == "skipped":
            why = _says_pattern(node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "why"), None))[0]
        call = ClaimCall(*_says_pattern(said), always=id(node) in top, kind=kind, why=why,
                         line=node.lineno,
                         condition=node.args[0] if kind == "claim" and node.args else None,
                         code=python_text(source) or "")
        (defined if id(node) in in_function else own).append(call)
    return own, defined


def claiming_cells(nb: Any) -> set[str]:
    """The ids of the code cells that make claims themselves (a call of their own, not one in
    a function they define or in a string)."""
    cells = [c for c in nb.cells if c.cell_type == "code"]
    names = claim_names(cells)
    return {c.id for c in cells if claim_calls(c.source, names)[0]}


def unsourced_claims(nb: Any) -> list[str]:
    """Records and claim lines that the cell's source could not have written: a recorded
    sentence that no claim call of the cell (or a function the notebook defines) says, and a
    claim every run of the cell makes that recorded nothing. The source is the commit's, so a
    forger who rewrites a record, its line and the digest still cannot change the sentence
    or drop a claim."""
    cells = [c for c in nb.cells if c.cell_type == "code"]
    names = claim_names(cells)
    calls = {c.id: claim_calls(c.source, names) for c in cells}
    helpers = [call for _, defined in calls.values() for call in defined]
    recorded: dict[str, list[dict[str, Any]]] = (
        nb.metadata.get("gpumem_nb", {}).get("claims", {}))
    problems = []
    for cell in cells:
        own, _ = calls[cell.id]
        records = recorded.get(cell.id, [])
        for r in records:
            if any(c.wrote(r) for c in own + helpers):
                if r.get("status") == "held" and not any(
                        holds_with(c, r.get("operands") or {}) is not False
                        for c in own + helpers if c.wrote(r)):
                    condition = next(ast_text(c) for c in own + helpers if c.wrote(r))
                    problems.append(f"{cell.id}: the values recorded for {r['says']!r} do "
                                    f"not make it hold: {condition}")
                continue
            saying = [c for c in own + helpers if c.says.fullmatch(str(r["says"]))]
            if not saying:
                problems.append(f"{cell.id}: no claim in its source says {r['says']!r}")
            elif r.get("status") != "skipped":
                problems.append(f"{cell.id}: no claim() call in its source says {r['says']!r}")
            elif any(c.kind == "skipped" for c in saying):
                problems.append(f"{cell.id}: its source skips {r['says']!r} for another "
                                f"reason than {r.get('why')!r}")
            else:  # a claim every run checks, recorded as skipped: a skip shows no values
                problems.append(f"{cell.id}: no skipped() call in its source says "
                                f"{r['says']!r}")
        # Only a cell that fails on purpose, and shows where, skips the claims after its error.
        raised_at = (raised_line(cell) if "raises-exception" in cell.metadata.get("tags", [])
                     else None)
        for c in own:
            if raised_at is not None and c.line >= raised_at:
                continue  # it comes after the error: it never ran
            if c.always and not any(c.wrote(r) for r in records):
                problems.append(f"{cell.id}: its claim {c.sentence!r} recorded nothing")
    return problems


# A unit constant is not recorded among a claim's operands (claims.py leaves it out).
UNIT_CONSTANTS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


class CannotTell(Exception):
    """A claim's condition the check cannot evaluate from the record alone."""


def ast_text(call: ClaimCall) -> str:
    import ast

    return ast.get_source_segment(call.code, call.condition) or ast.unparse(call.condition)


def holds_with(call: ClaimCall, operands: dict[str, str]) -> bool | None:
    """The claim's condition evaluated with the operands its record says it compared (a
    held claim whose recorded values make its own condition false was edited); None where
    it cannot be told: an operand not recorded, a call other than ``near``, ``abs``, ``min``,
    ``max``, ``len``, or a comparison closer than the recorded figures' rounding (a float is
    recorded to 6 significant digits: 16777216.0 as 1.67772e+07)."""
    import ast
    import math

    if call.condition is None:
        return None
    unknown = object()  # three-valued logic: a comparison within the rounding is unknown

    def recorded(text: str) -> tuple[Any, float]:
        """A recorded operand and how far its true value may be from it."""
        try:
            found = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise CannotTell(text) from None
        if isinstance(found, float) and math.isfinite(found) and found != 0:
            digits = len(text.lower().split("e")[0].replace("-", "").replace(".", "")
                         .lstrip("0"))
            return found, 0.5 * 10 ** (math.floor(math.log10(abs(found))) - digits + 1)
        return found, 0.0

    def number(x: tuple[Any, float]) -> float:
        if isinstance(x[0], bool) or not isinstance(x[0], (int, float)):
            raise CannotTell("not a number")
        return x[0]

    def arith(op: Any, a: tuple[Any, float], b: tuple[Any, float]) -> tuple[Any, float]:
        if a[1] == 0 and b[1] == 0:
            return {ast.Add: lambda: a[0] + b[0], ast.Sub: lambda: a[0] - b[0],
                    ast.Mult: lambda: a[0] * b[0], ast.Div: lambda: a[0] / b[0],
                    ast.FloorDiv: lambda: a[0] // b[0], ast.Mod: lambda: a[0] % b[0],
                    ast.Pow: lambda: a[0] ** b[0]}[type(op)](), 0.0
        x, ex, y, ey = number(a), a[1], number(b), b[1]
        if isinstance(op, (ast.Add, ast.Sub)):
            return (x + y if isinstance(op, ast.Add) else x - y), ex + ey
        if isinstance(op, ast.Mult):
            return x * y, abs(x) * ey + abs(y) * ex + ex * ey
        if isinstance(op, (ast.Div, ast.FloorDiv)) and abs(y) > ey:
            q = x / y
            err = (abs(x) * ey + abs(y) * ex) / (abs(y) * (abs(y) - ey)) + (
                1 if isinstance(op, ast.FloorDiv) else 0)
            return (math.floor(q) if isinstance(op, ast.FloorDiv) else q), err
        raise CannotTell("inexact arithmetic")

    def compare(op: Any, a: tuple[Any, float], b: tuple[Any, float]) -> Any:
        slack = a[1] + b[1]
        if slack == 0 or not all(isinstance(v[0], (int, float)) for v in (a, b)):
            return {ast.Eq: lambda: a[0] == b[0], ast.NotEq: lambda: a[0] != b[0],
                    ast.Lt: lambda: a[0] < b[0], ast.LtE: lambda: a[0] <= b[0],
                    ast.Gt: lambda: a[0] > b[0], ast.GtE: lambda: a[0] >= b[0],
                    ast.Is: lambda: a[0] is b[0], ast.IsNot: lambda: a[0] is not b[0],
                    ast.In: lambda: a[0] in b[0],
                    ast.NotIn: lambda: a[0] not in b[0]}[type(op)]()
        gap = a[0] - b[0]
        if abs(gap) <= slack:
            return unknown
        return {ast.Eq: False, ast.NotEq: True, ast.Lt: gap < 0, ast.LtE: gap < 0,
                ast.Gt: gap > 0, ast.GtE: gap > 0}.get(type(op), unknown)

    def truth(x: Any) -> Any:
        return x if x is unknown else bool(x[0] if isinstance(x, tuple) else x)

    def known_truth(node: Any) -> Any:
        """One side of an ``and``/``or``: the other side may still decide it."""
        try:
            return truth(value(node))
        except (CannotTell, TypeError, ValueError, ArithmeticError, KeyError):
            return unknown

    def value(node: Any) -> Any:
        if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)):
            text = ast.get_source_segment(call.code, node)
            if text in operands:
                return recorded(operands[text])
            if isinstance(node, ast.Name) and node.id in UNIT_CONSTANTS:
                return UNIT_CONSTANTS[node.id], 0.0
            raise CannotTell(text)
        if isinstance(node, ast.Constant):
            return node.value, 0.0
        if isinstance(node, ast.BoolOp):
            found = [known_truth(v) for v in node.values]
            decisive = isinstance(node.op, ast.Or)  # True decides an `or`, False an `and`
            if decisive in found:
                return decisive
            return unknown if unknown in found else not decisive
        if isinstance(node, ast.UnaryOp):
            inner = value(node.operand)
            if isinstance(node.op, ast.Not):
                t = truth(inner)
                return t if t is unknown else not t
            if isinstance(node.op, ast.USub) and inner is not unknown:
                return -number(inner), inner[1]
            raise CannotTell("unary")
        if isinstance(node, ast.BinOp):
            return arith(node.op, value(node.left), value(node.right))
        if isinstance(node, ast.Compare):
            left, verdict = value(node.left), True
            for op, right_node in zip(node.ops, node.comparators, strict=True):
                right = value(right_node)
                if left is unknown or right is unknown or isinstance(left, bool):
                    raise CannotTell("chained truth")
                step = compare(op, left, right)
                if step is False:
                    return False
                verdict = unknown if step is unknown else verdict
                left = right
            return verdict
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            args = [value(a) for a in node.args]
            kwargs = {k.arg: value(k.value) for k in node.keywords if k.arg is not None}
            if node.func.id == "near" and len(args) == 2:
                (a, ea), (b, eb) = args
                limit = max(number(kwargs.get("within", (0.0, 0.0))),
                            number(kwargs.get("rel", (0.0, 0.0))) * (max(abs(a), abs(b))
                                                                     + max(ea, eb)))
                return compare(ast.LtE(), (abs(a - b), ea + eb), (limit, 0.0))
            if node.func.id == "abs" and len(args) == 1:
                return abs(number(args[0])), args[0][1]
            if node.func.id in ("min", "max") and len(args) > 1:
                pick = min if node.func.id == "min" else max
                return pick(number(a) for a in args), max(a[1] for a in args)
        raise CannotTell(type(node).__name__)

    try:
        verdict = truth(value(call.condition))
    except (CannotTell, TypeError, ValueError, ArithmeticError, KeyError):
        return None
    return None if verdict is unknown else bool(verdict)


# IPython names the cell's own frame first: "Cell In[12], line 5".
RAISED_AT = re.compile(r"Cell In\[\d+\], line (\d+)")


def raised_line(cell: Any) -> int | None:
    """The line of the cell where its error was raised, from the traceback it shows; None for
    a cell that shows no error (whatever its tags say) or none that names its line."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            found = RAISED_AT.search(ANSI.sub("", "\n".join(out.get("traceback", []))))
            return int(found.group(1)) if found else None
    return None


def forged_claims(nb: Any) -> list[str]:
    """What does not match the claims the run recorded (notebooks that record them):

    - a cell whose outputs are not those the run saved (their digest), or a recorded cell
      that is gone;
    - a ✓ (or ⊘, ✗) line that no claim wrote, or a recorded claim whose line is not shown;
    - a claim's line that no longer holds the values the claim compared;
    - a cell that calls ``claim(``/``skipped(`` and recorded none, or a claim that failed;
    - a recorded claim its cell's source does not make, or one it always makes that is gone
      (``unsourced_claims``).
    """
    meta = nb.metadata.get("gpumem_nb", {})
    recorded: dict[str, list[dict[str, Any]]] = meta.get("claims", {})
    digests: dict[str, str] = meta.get("outputs_sha256", {})
    cells = {c.id: c for c in nb.cells}
    claiming = claiming_cells(nb)
    problems = [f"{i}: the cell of a recorded claim is missing" for i in recorded
                if i not in cells]
    problems += [f"{i}: a measured cell is missing" for i in digests
                 if i not in cells and i not in recorded]
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        records = recorded.get(cell.id, [])
        if (cell.get("execution_count") or cell.get("outputs")) and cell.id not in digests:
            problems.append(f"{cell.id}: shows outputs, but the run recorded no digest of them")
        elif cell.id in digests and RUNNER.outputs_digest(cell) != digests[cell.id]:
            problems.append(f"{cell.id}: its outputs are not those the run saved")
        if cell.id in claiming and not records:
            problems.append(f"{cell.id}: claims, but the run recorded no claim")
        for r in records:
            if r["status"] == "failed":
                problems.append(f"{cell.id}: a claim failed: {r['says']}")
            if r.get("line") != claim_line(r):
                problems.append(f"{cell.id}: the recorded line is not its claim's: {r}")
        problems += [f"{cell.id}: {d} show different claim lines"
                     for d in forms_that_disagree(cell)]
        shown, written = marked_lines(cell), [claim_line(r) for r in records]
        if shown != written:
            unwritten = [ln for ln in shown if ln not in written]
            unshown = [ln for ln in written if ln not in shown]
            problems.append(f"{cell.id}: claim lines that no claim wrote {unwritten}, claims "
                            f"whose line is not shown {unshown}" if unwritten or unshown else
                            f"{cell.id}: the claim lines are not in the order written")
    return problems + unsourced_claims(nb)


# The runner: an input of every tutorial, though not in the recorded digest since it left
# notebooks/ (the digest keeps its rule, so that older commits' digests still reproduce).
RUNNER_FILE = "tools/tutorials/run_tutorials.py"
# What runs beside the tutorials but not in their run: editing it leaves every notebook current.
AFTER_THE_RUN = ("tools/tutorials/plotly_pictures.py",)
# The script that executes them on the GPU machine sets their environment (the settings file,
# the claims' mode, the path): it is an input too, though not in the recorded digest.
RUN_SCRIPT = "tools/tutorials/run_on_gpu.sh"
# Where the tutorial machinery lay at the commits before it moved to tools/tutorials/: an older
# commit's files are compared under their present names, so the move alone leaves every
# notebook current.
MOVED = {"notebooks/run_tutorials.py": RUNNER_FILE, "notebooks/run_on_gpu.sh": RUN_SCRIPT,
         "notebooks/plotly_pictures.py": AFTER_THE_RUN[0]}
TUTORIAL_SOURCE = re.compile(r"notebooks/\d\d_\w+\.py")


def inputs_of(name: str, files: dict[str, bytes]) -> str:
    """Digest of what a tutorial's outputs depend on, of ``files`` (path -> contents): the
    package, the runner, every module beside the tutorials (what they import, what those
    import), the script that runs them, and its own source. Another tutorial's source is not
    among them, nor a tool that runs after the run: changing one tutorial leaves the others'
    outputs current, and only it must run again."""
    import hashlib

    digest = hashlib.sha256()
    files = {MOVED.get(path, path): text for path, text in files.items()}
    for path in sorted(files):
        if path in AFTER_THE_RUN or (TUTORIAL_SOURCE.fullmatch(path)
                                     and path != f"notebooks/{name}.py"):
            continue
        digest.update(path.encode() + b"\0" + files[path].replace(b"\r\n", b"\n") + b"\0")
    return digest.hexdigest()


def checkout_files() -> dict[str, bytes]:
    paths = {p for g in RUNNER.DIGEST_GLOBS for p in ROOT.glob(g)
             if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")}
    files = {p.relative_to(ROOT).as_posix(): p.read_bytes() for p in paths}
    for path in (RUNNER_FILE, RUN_SCRIPT):
        if (ROOT / path).exists():
            files[path] = (ROOT / path).read_bytes()
    return files


def git_clone_kind() -> str:
    """"full", or why commits may be missing here ("no git here", "a shallow clone")."""
    import subprocess

    try:
        shallow = subprocess.run(["git", "-C", str(ROOT), "rev-parse",
                                  "--is-shallow-repository"], capture_output=True, text=True,
                                 check=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "no git here"
    return "full" if shallow == "false" else "a shallow clone"


def unreadable_commit(commit: Any, what: str = "") -> NoReturn:
    """A commit the notebook names that git cannot read: skipped only where the history may
    be missing (no git, a shallow clone); in a full clone the commit does not exist, and a
    notebook that names one escaped every check that reads it (review: a commit id one
    character longer than the real one)."""
    clone = git_clone_kind()
    if clone != "full":
        pytest.skip(f"{clone}: commit {commit}{what} cannot be read")
    pytest.fail(f"the notebook names commit {commit!r}{what}, which this full clone does not "
                "have: no commit of this repository ran it")


_COMMIT_FILES: dict[str, dict[str, bytes] | None] = {}


def commit_files(commit: str) -> dict[str, bytes] | None:
    """The same files at a commit, from git's objects; None where git or the commit is not
    there (a shallow clone)."""
    import subprocess

    if commit not in _COMMIT_FILES:
        def git(*args: str) -> bytes:
            return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                                  check=True, timeout=60).stdout
        try:
            names = [n for n in git("ls-tree", "-r", "-z", "--name-only", commit, "--",
                                    "gpumem_nb", "notebooks", "tools/tutorials"
                                    ).decode().split("\0")
                     if n and "__pycache__" not in n.split("/")
                     and not n.endswith((".pyc", ".pyo"))
                     and (n.startswith("gpumem_nb/") or n in (RUNNER_FILE, RUN_SCRIPT)
                          or n in MOVED or re.fullmatch(r"notebooks/[^/]+\.py", n))]
            _COMMIT_FILES[commit] = {n: git("show", f"{commit}:{n}") for n in names}
        except (OSError, subprocess.SubprocessError):
            _COMMIT_FILES[commit] = None
    return _COMMIT_FILES[commit]


def ran_on_older_inputs(name: str, meta: dict[str, Any]) -> bool:
    """The tutorial's inputs (``inputs_of``) have changed since the commit it ran at; without
    git to tell, whenever anything the sources digest covers has. (The recorded digest alone
    cannot say that the inputs are the checkout's: the runner is outside it.)"""
    then = commit_files(str(meta.get("commit", "")))
    if then is None:
        return meta.get("sources_sha256") != RUNNER.sources_digest()
    return inputs_of(name, then) != inputs_of(name, checkout_files())


def source_text_as_executed(name: str, meta: dict[str, Any]) -> bytes:
    """The text of the source the notebook was executed from: this checkout's, or for a
    notebook that ran on older code (its recorded digest is an earlier commit's) that
    commit's."""
    import subprocess

    if not ran_on_older_inputs(name, meta):
        return (NOTEBOOKS / f"{name}.py").read_bytes()
    try:
        return subprocess.run(["git", "-C", str(ROOT), "show",
                               f"{meta['commit']}:notebooks/{name}.py"], capture_output=True,
                              check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError, KeyError):
        unreadable_commit(meta.get("commit"), f" ({name}.py)")


def source_as_executed(name: str, meta: dict[str, Any], tmp: Path) -> Any:
    """The source the notebook was executed from, loaded as the runner loads it."""
    path = tmp / f"{name}.py"
    path.write_bytes(source_text_as_executed(name, meta))
    return RUNNER.load_source(path)


# What executing a cell adds to its metadata (nbclient's timings); the rest is the source's.
RUN_METADATA = ("execution",)


def source_metadata(cell: Any) -> dict[str, Any]:
    return {k: v for k, v in cell.metadata.items() if k not in RUN_METADATA}


def not_its_source(nb: Any, source: Any) -> list[str]:
    """Where the executed notebook is not the source it ran: its cells, their ids and text,
    and their metadata (a ``raises-exception`` tag added to the notebook alone excused a
    deleted claim)."""
    ran = [(c.id, c.cell_type, c.source) for c in nb.cells]
    if ran != [(c.id, c.cell_type, c.source) for c in source.cells]:
        return ["the notebook is not its source: execute it again"]
    return [f"{c.id}: its metadata is not its source's"
            for c, s in zip(nb.cells, source.cells, strict=True)
            if source_metadata(c) != source_metadata(s)]


def commit_digest_problems(meta: dict[str, Any]) -> list[str]:
    """The sources digest the notebook records is not the digest of the commit it names."""
    commit = str(meta.get("commit", ""))
    if commit not in _DIGEST_AT:
        _DIGEST_AT[commit] = RUNNER.sources_digest_at(commit)
    at_commit = _DIGEST_AT[commit]
    if at_commit is None:
        unreadable_commit(commit)
    if meta.get("sources_sha256") != at_commit:
        return [f"its recorded sources are neither this checkout's nor commit {commit}'s"]
    return []


def tutorial_problems(nb: Any, name: str, source: Any) -> list[str]:
    """Every rule the tests below apply to one executed tutorial, on any copy of it (the
    forging tests edit one): ``source`` is the source it says it ran."""
    meta = nb.metadata.get("gpumem_nb", {})
    problems = not_its_source(nb, source) + unquoted_numbers(nb) + unchecked_claims(nb)
    problems += commit_digest_problems(meta) + relabelled(meta) + not_the_cells_that_ran(nb)
    if records_checks(nb):
        problems += forged_claims(nb)
    return problems


_DIGEST_AT: dict[str, str | None] = {}


# -- the executed tutorials ------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_the_executed_tutorial_is_exactly_its_source(name, tmp_path):
    """Same cells, ids and text as the source it ran: this checkout's, or the commit's it
    names when it ran on older code (notebooks/README.md says so, and the digest rule below ties
    the digest to that commit)."""
    ran = executed(name)
    source = source_as_executed(name, ran.metadata.get("gpumem_nb", {}), tmp_path)
    assert not_its_source(ran, source) == [], name


@pytest.mark.parametrize("name", NAMES)
def test_every_number_in_the_prose_is_printed_by_the_cell_beside_it(name):
    missing = unquoted_numbers(executed(name))
    assert not missing, f"{name}: prose numbers that the cell above or below did not print: " \
                        f"{missing}"


@pytest.mark.parametrize("name", NAMES)
def test_every_claim_of_the_prose_was_checked_by_the_cell_that_measured_it(name):
    nb = executed(name)
    assert claiming_cells(nb), (
        f"{name} checks no claim")
    problems = unchecked_claims(nb)
    assert not problems, f"{name}: {problems}"


def runner_checks_version_at(commit: str) -> int | None:
    """The ``CHECKS_VERSION`` of the runner at ``commit``, 0 for one that recorded no claims
    (None: git cannot tell)."""
    import subprocess

    for path in (RUNNER_FILE, *[old for old, new in MOVED.items() if new == RUNNER_FILE]):
        try:
            text = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path}"],
                                  capture_output=True, check=True, timeout=60,
                                  text=True).stdout
            break
        except (OSError, subprocess.SubprocessError):
            continue
    else:
        return None
    found = re.search(r"^CHECKS_VERSION = (\d+)", text, re.MULTILINE)
    return int(found.group(1)) if found else 0


def runner_recorded_checks_at(commit: str) -> bool | None:
    """Whether the runner at ``commit`` recorded claims (None: git cannot tell)."""
    version = runner_checks_version_at(commit)
    return None if version is None else version > 0


def commit_date(commit: str) -> Any:
    """When ``commit`` was made (its committer date); None where git cannot tell."""
    import datetime
    import subprocess

    try:
        text = subprocess.run(["git", "-C", str(ROOT), "show", "-s", "--format=%cI", commit],
                              capture_output=True, check=True, timeout=60, text=True).stdout
        return datetime.datetime.fromisoformat(text.strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def cell_as_run_digest(cell: Any) -> str:
    """A cell's type, text and source metadata, digested as the runner records them (written
    again here: the check must not share the code it checks)."""
    import hashlib

    text = json.dumps([cell.cell_type, cell.source, source_metadata(cell)], sort_keys=True,
                      ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def not_the_cells_that_ran(nb: Any) -> list[str]:
    """Cells whose text or metadata is not what the run executed (runners from version 2
    record a digest of each cell): prose turned around after the run, whatever commit the
    notebook names since."""
    meta = nb.metadata.get("gpumem_nb", {})
    if int(meta.get("checks_version", 0)) < 2:
        return []
    ran = meta.get("cells_sha256")
    if not isinstance(ran, dict):
        return ["the run recorded no digest of its cells: its metadata was edited"]
    cells = {c.id: c for c in nb.cells}
    problems = [f"{i}: a cell the run executed is gone" for i in ran if i not in cells]
    for cell_id, cell in cells.items():
        if cell_id not in ran:
            problems.append(f"{cell_id}: a cell the run did not execute")
        elif cell_as_run_digest(cell) != ran[cell_id]:
            problems.append(f"{cell_id}: its text is not the text the run executed")
    return problems


# The GPU machine's clock and the committer's may differ a little; a relabel comes later.
CLOCK_SKEW_S = 600


def relabelled(meta: dict[str, Any]) -> list[str]:
    """A notebook labelled with a commit it did not run at: one made after the run's recorded
    date, or one whose runner writes another version of the record than the notebook
    carries (a relabel to a commit after the record grew leaves the old record)."""
    import datetime

    commit = str(meta.get("commit", ""))
    problems = []
    made = commit_date(commit)
    try:
        ran = datetime.datetime.fromisoformat(str(meta.get("executed")))
    except ValueError:
        ran = None
    if made is None:
        unreadable_commit(commit)
    if ran is None:
        problems.append(f"the date of the run, {meta.get('executed')!r}, is no date")
    elif made - datetime.timedelta(seconds=CLOCK_SKEW_S) > ran:
        problems.append(f"it names commit {commit[:7]}, made after the run it records "
                        f"({made.isoformat()} > {ran.isoformat()}): relabelled after the run")
    version = runner_checks_version_at(commit)
    if version is not None and int(meta.get("checks_version", 0)) != version:
        problems.append(f"it records checks version {meta.get('checks_version', 0)}, and the "
                        f"runner at {commit[:7]} writes version {version}: its metadata was "
                        "edited")
    return problems


@pytest.mark.parametrize("name", NAMES)
def test_every_check_line_was_written_by_its_claim_over_the_outputs_the_run_saved(name):
    """A notebook executed by a runner that records claims: each ✓ line is its claim's, with
    the values the claim compared, over the outputs the run saved (review 2026-12-01b, §4).
    Only a notebook from a commit whose runner did not record claims may lack the record;
    those are covered by the stale notice (test_the_tutorials_page_says_when_...)."""
    nb = executed(name)
    if not records_checks(nb):
        commit = nb.metadata.get("gpumem_nb", {}).get("commit", "")
        recorded = runner_recorded_checks_at(commit)
        if recorded is None:
            unreadable_commit(commit)
        assert not recorded, (f"{name} ran at {commit}, whose runner records claims, and "
                              "carries no record: its metadata was edited")
        assert nb.metadata["gpumem_nb"]["sources_sha256"] != RUNNER.sources_digest(), name
        return
    problems = forged_claims(nb)
    assert not problems, f"{name}: " + "\n".join(problems)


PROVENANCE = ("gpu", "gpu_count", "mig", "driver", "cuda_driver_api", "cuda_runtime", "torch",
              "ipython", "ipykernel", "gpumem_nb", "python", "commit", "executed",
              "sources_sha256")


@pytest.mark.parametrize("name", NAMES)
def test_the_executed_tutorial_records_what_produced_it_and_it_is_that_commit(name):
    """GPU, driver, CUDA, torch, IPython, gpumem_nb, commit, a clean tree and the date; and the
    digest of the sources it ran, which must be the digest of the commit it names: the
    outputs are that code's, nothing edited by hand since."""
    meta = executed(name).metadata.get("gpumem_nb", {})
    missing = [k for k in PROVENANCE if meta.get(k) in (None, "", "none")]
    assert not missing, f"{name}: metadata lacks {missing}: {meta}"
    assert "H200" in meta["gpu"], meta
    assert meta.get("tree_clean") is True, f"{name}: executed from a tree with changes: {meta}"
    # Also when it is this checkout's digest: copied into an older notebook, it would make
    # the notebook look current without being its commit's.
    assert commit_digest_problems(meta) == [], name


@pytest.mark.parametrize("name", NAMES)
def test_the_executed_tutorial_ran_at_the_commit_it_names_and_is_the_text_it_ran(name):
    """Not relabelled with a later commit, and (from runner version 2) each cell is the text
    the run executed: prose turned around after the run fails whatever the label says."""
    nb = executed(name)
    problems = relabelled(nb.metadata.get("gpumem_nb", {})) + not_the_cells_that_ran(nb)
    assert not problems, f"{name}: {problems}"


STALE_NOTICE = re.compile(
    r"executed at `([0-9a-f]{7,40})`; (?:gpumem_nb|its source) has changed since")
# The notice lives with the tutorials' provenance, after this marker; the README's list of
# tutorials links there.
STALE_NOTICE_PAGE = NOTEBOOKS / "README.md"
STALE_NOTICE_MARK = "<!-- stale-tutorials -->"


def test_the_tutorials_page_says_when_the_tutorials_ran_on_older_code():
    """Outputs of an earlier gpumem_nb (or tutorial source) are still real GPU output, but a
    reader must be told that they are not this checkout's: ``notebooks/README.md`` names the
    commit, and only while true."""
    stale = sorted({executed(n).metadata["gpumem_nb"]["commit"] for n in NAMES
                    if ran_on_older_inputs(n, executed(n).metadata["gpumem_nb"])})
    page = STALE_NOTICE_PAGE.read_text()
    assert STALE_NOTICE_MARK in page, f"{STALE_NOTICE_PAGE} has lost its {STALE_NOTICE_MARK}"
    said = STALE_NOTICE.findall(page)
    if stale:
        assert said, (f"the tutorials ran at {stale}, older code, and "
                      f"{STALE_NOTICE_PAGE.relative_to(ROOT)} does not say so")
        assert all(any(c.startswith(s) or s.startswith(c) for s in said) for c in stale), (
            stale, said)
    else:
        assert not said, (f"{STALE_NOTICE_PAGE.relative_to(ROOT)} says the tutorials ran on "
                          "older code; they ran on this")
    # Only there: a second copy elsewhere would be left behind when the tutorials run again.
    assert not STALE_NOTICE.findall((ROOT / "README.md").read_text())


def test_the_readme_lists_every_tutorial_and_says_which_are_not_yet_executed():
    """A tutorial whose source is written but whose notebook the GPU machine has not produced
    yet is listed as such, and only while it is true."""
    readme = (ROOT / "README.md").read_text()
    listed = set(re.findall(r"^- `(\d\d_\w+)\.ipynb`", readme, re.MULTILINE))
    assert listed == set(ALL_NAMES), (sorted(set(ALL_NAMES) - listed), sorted(listed))
    said = set(re.findall(r"^- `(\d\d_\w+)\.ipynb` \(not yet executed\)", readme,
                          re.MULTILINE))
    assert said == set(NOT_YET_EXECUTED), (sorted(said), NOT_YET_EXECUTED)


def test_one_tutorials_source_edited_leaves_the_others_outputs_current():
    """A fix to one tutorial runs that tutorial again, not all thirteen; the package, the
    runner, the modules beside the tutorials and the script that runs them still concern
    every one."""
    files = {"gpumem_nb/__init__.py": b"v1", RUNNER_FILE: b"runner",
             "notebooks/claims.py": b"claims", AFTER_THE_RUN[0]: b"pictures",
             "notebooks/conf_util.py": b"imported by a helper only",
             RUN_SCRIPT: b"export GPUMEM_NB_CONFIG=...",
             "notebooks/01_a.py": b"from claims import claim\n",
             "notebooks/02_b.py": b"import os, claims\n"}

    def changed(path: str) -> list[str]:
        edited = dict(files, **{path: files[path] + b" edited"})
        return [n for n in ("01_a", "02_b") if inputs_of(n, edited) != inputs_of(n, files)]

    assert changed("notebooks/01_a.py") == ["01_a"]
    for path in ("gpumem_nb/__init__.py", RUNNER_FILE, "notebooks/claims.py",
                 "notebooks/conf_util.py", RUN_SCRIPT):
        assert changed(path) == ["01_a", "02_b"], path
    assert changed(AFTER_THE_RUN[0]) == []
    # A commit from before the machinery moved to tools/tutorials/: the same files where they
    # lay then are the same inputs.
    before_the_move = {next((old for old, new in MOVED.items() if new == path), path): text
                       for path, text in files.items()}
    assert "notebooks/run_tutorials.py" in before_the_move
    assert all(inputs_of(n, before_the_move) == inputs_of(n, files) for n in ("01_a", "02_b"))


def test_a_commits_sources_digest_is_the_checkouts_when_nothing_changed():
    import subprocess

    try:
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                                "gpumem_nb", "notebooks"], capture_output=True, text=True,
                               check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("no git here")
    if any(line[3:].startswith("gpumem_nb/") or re.fullmatch(r"notebooks/[^/]+\.py", line[3:])
           for line in dirty.splitlines()):
        pytest.skip("the package or a tutorial has uncommitted changes")
    assert RUNNER.sources_digest_at("HEAD") == RUNNER.sources_digest()


@pytest.mark.parametrize("name", NAMES)
def test_the_saved_tutorial_is_at_most_1_MB(name):
    size = (NOTEBOOKS / f"{name}.ipynb").stat().st_size
    assert size <= 1_000_000, f"{name}.ipynb is {size:,} bytes"


@pytest.mark.parametrize("name", NAMES)
def test_every_chart_in_a_saved_tutorial_carries_a_static_image(name):
    """GitHub's renderer shows no widget and no plotly JSON: a picture must be in the bundle."""
    for cell in executed(name).cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            data = out.get("data", {})
            charts = {"application/vnd.plotly.v1+json", RUNNER.WIDGET_VIEW} & set(data)
            if charts:
                assert {"image/png", "image/svg+xml"} & set(data), (
                    f"{name} cell {cell.id}: {sorted(charts)} without a static image")


@pytest.mark.parametrize("name", NAMES)
def test_no_tutorial_still_waits_on_unlanded_code_or_a_gpu_figure(name):
    """DEPENDS(issue N) and TODO-GPU mark text written before the code or the GPU run it needs;
    the lead settles each one (from the first GPU run) before the final execution."""
    text = (NOTEBOOKS / f"{name}.py").read_text()
    found = [ln.strip() for ln in text.splitlines() if MARKERS.search(ln)]
    assert not found, f"{name}: {found}"


# -- the sources -------------------------------------------------------------------------------
def test_every_tutorial_has_a_source_with_stable_unique_ids():
    assert len(SOURCES) >= 9, NAMES
    for path in SOURCES:
        nb = RUNNER.load_source(path)  # raises on a cell without an id, or a duplicate
        prefix = path.stem[:2] + "-"
        assert all(c.id.startswith(prefix) for c in nb.cells), path.name


def test_the_quickstarts_next_list_links_every_other_tutorial():
    """A new user clicks through from 00 (browser review 2026-12-05: the list was plain text).
    The executed notebook shows it from its next run on; the source says it now."""
    quickstart = RUNNER.load_source(NOTEBOOKS / "00_quickstart.py")
    (cell,) = [c for c in quickstart.cells
               if c.cell_type == "markdown" and "## Next" in c.source]
    listed = cell.source.split("## Next", 1)[1]
    linked = re.findall(r"^- \[`(\d\d_\w+)\.ipynb`\]\((\d\d_\w+)\.ipynb\)", listed,
                        re.MULTILINE)
    assert all(text == target for text, target in linked), linked
    assert [t for t, _ in linked] == [n for n in ALL_NAMES if n != "00_quickstart"]
    assert len(re.findall(r"^- ", listed, re.MULTILINE)) == len(linked), listed


def test_every_notebook_in_the_folder_has_a_source():
    stray = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb") if p.stem not in NAMES)
    assert not stray, f"notebooks without a source: {stray}"


# -- the checkers ------------------------------------------------------------------------------
def notebook(*cells: tuple[str, str]) -> Any:
    """("md", text) or ("out", printed) cells, in order."""
    nb = nbformat.v4.new_notebook()
    for i, (kind, text) in enumerate(cells):
        if kind == "md":
            cell = nbformat.v4.new_markdown_cell(text)
        else:
            cell = nbformat.v4.new_code_cell("x")
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        cell.id = f"c{i}"
        nb.cells.append(cell)
    return nb


PRINTED = "20000×20000 float32: 1.49 GiB = 1.60 GB (the article: about 3 GB)\n"


def test_a_number_the_cell_beside_it_did_not_print_fails():
    assert unquoted_numbers(notebook(("out", PRINTED), ("md", "It takes 1.49 GiB."))) == []
    assert unquoted_numbers(notebook(("md", "It takes 1.6 GB."), ("out", PRINTED))) == []
    for wrong in ("1.5 GiB", "1 GiB", "1.6 GiB", "3.05 GB", "2 GiB", "1,526 MiB", "512 B",
                  "430 ms", "15 %", "8 bytes", "2 seconds"):
        missing = unquoted_numbers(notebook(("out", PRINTED), ("md", f"It takes {wrong}.")))
        assert len(missing) == 1 and wrong in missing[0], (wrong, missing)


def test_a_number_printed_by_a_cell_further_away_fails():
    nb = notebook(("out", PRINTED), ("md", "Intro."), ("md", "It takes 1.49 GiB."),
                  ("out", "nothing"))
    assert unquoted_numbers(nb) == ["c2: '1.49 GiB'"]


def test_the_prose_may_drop_trailing_zeros_and_separators_only():
    printed = "reserved 1024 MiB; held 60.00 GiB; blocked 431 ms; 12.50% of the GPU; 8 bytes"
    for prose in ("1,024 MiB", "60 GiB", "60.0 GiB", "431 ms", "12.5%", "12.50 %", "8 bytes",
                  "8 B"):
        assert unquoted_numbers(notebook(("out", printed), ("md", f"It was {prose}."))) == [], \
            prose
    for prose in ("1 GiB", "0.43 s", "13 %", "60.01 GiB"):
        assert unquoted_numbers(notebook(("out", printed), ("md", f"It was {prose}."))) != [], \
            prose


def test_names_code_and_comments_are_not_quantities():
    text = ("H200, v2.6, cu130, Python 3.14, 20000×20000, a 4-byte tensor, 2 steps, 100M "
            "parameters, `max_split_size_mb:128`, `2 GiB`, protocol 4, %gpumem "
            "<!-- TODO-GPU: 3 GiB -->")
    assert quantities(text) == []
    assert [q.text for q in quantities("+256 MiB, (2 MiB), 0.76 GB and 4 bytes.")] == [
        "256 MiB", "2 MiB", "0.76 GB", "4 bytes"]


def test_a_tutorial_without_its_outputs_fails_both_rules():
    """As a tutorial is before execution (or with its outputs stripped): its quoted numbers and
    its claims have nothing to rest on."""
    for name in ("01_allocated_reserved_nvidia_smi", "04_out_of_memory"):
        bare = RUNNER.load_source(NOTEBOOKS / f"{name}.py")
        assert unquoted_numbers(bare), name
        assert unchecked_claims(bare), name


def test_a_failed_or_missing_check_is_caught():
    nb = nbformat.v4.new_notebook()
    held, failed, silent = (nbformat.v4.new_code_cell('claim(x, "it holds")') for _ in range(3))
    held.outputs = [nbformat.v4.new_output("stream", name="stdout", text="✓ it holds\n")]
    failed.outputs = [nbformat.v4.new_output(
        "stream", name="stdout", text="✓ one\n✗ CLAIM FAILED: it holds (x = 0)\n")]
    for i, cell in enumerate((held, failed, silent)):
        cell.id = f"c{i}"
    nb.cells = [held, failed, silent]
    assert unchecked_claims(nb) == ["c1: a claim failed", "c2: claims, but printed no ✓ line"]


def test_claims_py_raises_with_the_sentence_and_the_values(capsys, monkeypatch):
    claims = notebook_module("claims")
    claims.claim(True, "reserved fell to 0 B")
    assert capsys.readouterr().out == "✓ reserved fell to 0 B\n"
    with pytest.raises(claims.ClaimFailed) as err:
        claims.claim(False, "reserved fell to 0 B", reserved="2.00 MiB")
    assert "reserved fell to 0 B" in str(err.value) and "reserved = 2.00 MiB" in str(err.value)
    monkeypatch.setenv("TUTORIAL_CLAIMS", "report")
    claims.claim(False, "peak is exact", exact=False)
    assert capsys.readouterr().out.startswith("✗ CLAIM FAILED: peak is exact (exact = False)")
    assert claims.near(100, 104, within=4) and not claims.near(100, 105, within=4)
    assert claims.near(100, 101, rel=0.01) and not claims.near(100, 102, rel=0.01)


def test_a_source_loads_with_its_ids_and_a_reported_failure_is_listed(tmp_path):
    src = tmp_path / "09_demo.py"
    src.write_text('# %% [markdown] id="09-00"\n# Text.\n\n# %% id="09-01"\nx = 1\n')
    nb = RUNNER.load_source(src)
    assert [(c.id, c.cell_type) for c in nb.cells] == [("09-00", "markdown"), ("09-01", "code")]
    assert nb.cells[1].outputs == [] and "jupytext" not in nb.metadata
    reported = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("claim(...)")
    cell.id = "09-00"
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                           text="✗ CLAIM FAILED: peak is exact (exact = False)\n")]
    reported.cells = [cell]
    assert RUNNER.failed_claims(reported) == [
        "09-00: ✗ CLAIM FAILED: peak is exact (exact = False)"]


@pytest.mark.kernel
def test_the_runner_stops_a_notebook_at_a_failed_claim_names_it_and_saves_what_ran(tmp_path):
    import shutil

    work = tmp_path / "src"
    work.mkdir()
    shutil.copy(NOTEBOOKS / "claims.py", work / "claims.py")
    src = work / "09_demo.py"
    src.write_text('# %% id="09-00"\nfrom claims import claim\nclaim(True, "it holds")\n\n'
                   '# %% id="09-01"\nclaim(False, "reserved fell to 0 B", reserved="2.00 MiB")'
                   '\n\n# %% id="09-02"\nprint("never runs")\n')
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(RUNNER.ClaimError, match=r"09_demo cell 09-01: .*reserved fell to 0 B"):
        RUNNER.run(src, out)  # the kernel starts in the source's folder, beside claims.py
    saved = nbformat.read(out / "09_demo.ipynb", as_version=4)
    assert [c.execution_count for c in saved.cells] == [1, 2, None]
    assert "✓ it holds" in output_text(saved.cells[0])
    assert "ClaimFailed" in output_text(saved.cells[1])
    # Saved as far as it got, it still says what produced it (and its chart was ended).
    assert saved.metadata["gpumem_nb"]["sources_sha256"], saved.metadata


# -- the record of claims: the review's three forgeries, on notebooks executed here ----------
def claim_cells(nb: Any) -> list[Any]:
    recorded = nb.metadata.get("gpumem_nb", {}).get("claims", {})
    return [c for c in nb.cells if c.cell_type == "code" and c.id in recorded]


def contradict_a_measured_line(nb: Any) -> Any:
    """Review E2 ("after del error: 8.00 GiB"): a number in a claim cell's printed lines is
    changed, the ✓ line left as it was."""
    nb = copy.deepcopy(nb)
    for cell in claim_cells(nb):
        for out in cell.outputs:
            if out.get("output_type") != "stream":
                continue
            lines = out["text"].splitlines(keepends=True)
            for i, line in enumerate(lines):
                m = re.search(r"\d", line)
                if m and not line.startswith(MARKED):
                    digit = str((int(m.group()) + 1) % 10)
                    lines[i] = line[:m.start()] + digit + line[m.end():]
                    out["text"] = "".join(lines)
                    return nb
    raise AssertionError("no claim cell prints a measured number: nothing to contradict")


def cut_down_to_claim_lines(nb: Any) -> Any:
    """Review E4: every table, traceback and measured line deleted; the ✓ lines kept."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = marked_lines(cell)
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                               text="".join(f"{ln}\n" for ln in kept))
                        ] if kept else []
    return nb


def forge_anything(nb: Any) -> Any:
    """Review E5 (07's outputs): each claim cell shows one hand-written "✓ anything"."""
    nb = copy.deepcopy(nb)
    claiming = claiming_cells(nb)
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.id in claiming:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                                   text="✓ anything\n")]
    return nb


FORGERIES = {"outputs contradicting their ✓ lines": contradict_a_measured_line,
             "cut down to the ✓ lines": cut_down_to_claim_lines,
             'outputs replaced by "✓ anything"': forge_anything}
RECORDED = [n for n in NAMES if records_checks(executed(n))]


@pytest.mark.parametrize("name", RECORDED)
@pytest.mark.parametrize("forgery", FORGERIES)
def test_each_of_the_reviews_forgeries_of_an_executed_tutorial_fails(name, forgery):
    nb = executed(name)
    assert forged_claims(FORGERIES[forgery](nb)), f"{name}, {forgery}: not caught"


SYNTHETIC = """\
# %% [markdown] id="99-00"
# A lesson about two blocks, measured on the CPU.

# %% id="99-01"
from claims import claim, skipped
MiB = 2**20
blocks = [3 * MiB, 5 * MiB]
total = sum(blocks)
print(f"after del error: {total // MiB} MiB in {len(blocks)} blocks")
claim(total == 8 * MiB, "the two blocks add up to 8 MiB", total=f"{total // MiB} MiB")

# %% id="99-02" tutorial={"runs": 2}
runs = globals().get("runs", 0) + 1
free = blocks[0] - 3 * MiB
print(f"run {runs}: free {free} B")
claim(free == 0 and runs >= 1, "nothing is left free")
skipped("NVML agrees", "no GPU on this machine")

# %% [markdown] id="99-03"
# No claim below, only a table.

# %% id="99-04"
print("block  size\\n0      3 MiB\\n1      5 MiB")
"""


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory: Any) -> Any:
    """A small tutorial whose claims rest on numbers computed here, executed by the runner in
    a real kernel, as the GPU machine executes the tutorials."""
    import shutil

    work = tmp_path_factory.mktemp("synthetic")
    shutil.copy(NOTEBOOKS / "claims.py", work / "claims.py")
    src = work / "99_synthetic.py"
    src.write_text(SYNTHETIC)
    out = work / "out"
    out.mkdir()
    RUNNER.run(src, out)
    return nbformat.read(out / "99_synthetic.ipynb", as_version=4)


@pytest.mark.kernel
def test_the_runner_records_each_claim_with_its_values_and_its_cells_outputs(synthetic_run):
    nb = synthetic_run
    assert forged_claims(nb) == [], forged_claims(nb)
    meta = nb.metadata["gpumem_nb"]
    assert meta["checks_version"] == RUNNER.CHECKS_VERSION
    first, second = meta["claims"]["99-01"], meta["claims"]["99-02"]
    assert [r["line"] for r in first] == [
        "✓ the two blocks add up to 8 MiB [total = 8 MiB]"]
    # Without values given, the line shows what the expression compared, as it was; the cell
    # ran twice and keeps its last run's claims only, as it keeps that run's outputs.
    assert [r["line"] for r in second] == [
        "✓ nothing is left free [free = 0; runs = 2]",
        "⊘ skipped: NVML agrees (no GPU on this machine)"]
    assert set(meta["outputs_sha256"]) == {"99-01", "99-02", "99-04"}
    assert "run 2: free 0 B" in output_text(nb.cells[2])


@pytest.mark.kernel
@pytest.mark.parametrize("forgery", FORGERIES)
def test_each_of_the_reviews_forgeries_fails_on_a_notebook_executed_here(synthetic_run,
                                                                         forgery):
    problems = forged_claims(FORGERIES[forgery](synthetic_run))
    assert problems, f"{forgery}: not caught"


@pytest.mark.kernel
def test_a_check_line_no_claim_wrote_a_missing_claim_cell_and_changed_values_fail(
        synthetic_run):
    nb = copy.deepcopy(synthetic_run)
    table = nb.cells[4]
    table.outputs.append(nbformat.v4.new_output("stream", name="stdout", text="✓ it fits\n"))
    assert any("no claim wrote ['✓ it fits']" in p for p in forged_claims(nb))

    nb = copy.deepcopy(synthetic_run)
    del nb.cells[1]
    assert "99-01: the cell of a recorded claim is missing" in forged_claims(nb)

    # The numbers the claim compared, changed in its line and (by a careful forger) in the
    # digest too: the line no longer holds its claim's values.
    nb = copy.deepcopy(synthetic_run)
    out = nb.cells[1].outputs[0]
    out["text"] = out["text"].replace("[total = 8 MiB]", "[total = 9 MiB]")
    nb.metadata["gpumem_nb"]["outputs_sha256"]["99-01"] = RUNNER.outputs_digest(nb.cells[1])
    assert any("no claim wrote ['✓ the two blocks add up to 8 MiB [total = 9 MiB]']" in p
               for p in forged_claims(nb)), forged_claims(nb)

    # A skip is a line too: one removed is a claim whose line is not shown.
    nb = copy.deepcopy(synthetic_run)
    out = nb.cells[2].outputs[0]
    out["text"] = out["text"].replace("⊘ skipped: NVML agrees (no GPU on this machine)\n", "")
    nb.metadata["gpumem_nb"]["outputs_sha256"]["99-02"] = RUNNER.outputs_digest(nb.cells[2])
    assert any("whose line is not shown ['⊘ skipped" in p for p in forged_claims(nb))


def test_legitimate_ways_of_claiming_are_found_and_a_claim_in_a_string_is_none():
    """Found by attacking the check (2026-12-02): a helper that claims for the cells calling it,
    ``claims.claim``, an alias, and a ``%%gpumem`` body with magics in it are claims; a
    fresh-process snippet whose text has a line starting ``claim(`` is not, nor a ``%%bash``."""
    nb = nbformat.v4.new_notebook()
    sources = {
        "helper": "from claims import claim, skipped\ndef check(x):\n    claim(x, 'x holds')",
        "alias": "import claims\nfrom claims import claim as verify\n"
                 "claims.claim(True, 'by module')\nverify(True, f'by alias {1}')",
        "magic": "%%gpumem\n%time y = 1\n!true\nclaim(True, 'inside the magic')",
        "snippet": "CODE = '''\nclaim(True, 'in another process')\n'''",
        "bash": "%%bash\nclaim(True, 'not python')",
        "empty": "%%gpumem",
    }
    for cell_id, text in sources.items():
        cell = nbformat.v4.new_code_cell(text)
        cell.id = cell_id
        nb.cells.append(cell)
    assert claiming_cells(nb) == {"alias", "magic"}
    names = claim_names(nb.cells)
    own, _ = claim_calls(sources["alias"], names)
    assert [c.sentence for c in own] == ["by module", "by alias {…}"]
    assert [c.sentence for c in claim_calls(sources["helper"], names)[1]] == ["x holds"]
    assert claim_calls(sources["empty"], names) == ([], [])


def with_digests_rewritten(nb: Any) -> Any:
    """What a careful forger does last: the digest of every cell recomputed."""
    nb.metadata["gpumem_nb"]["outputs_sha256"] = {
        c.id: RUNNER.outputs_digest(c) for c in nb.cells if c.cell_type == "code"
        and (c.get("execution_count") or c.get("outputs"))}
    return nb


@pytest.mark.kernel
def test_a_forger_who_rewrites_the_record_and_the_digests_still_cannot_change_a_claim(
        synthetic_run):
    """Review 2026-12-02 (F2b, F3, F6, F9): the record and the digests live in the notebook,
    so a forger can rewrite both; the sentences and the claims every run makes come from the
    source, which the commit pins."""
    def record(nb: Any, cell_id: str) -> list[dict[str, Any]]:
        return nb.metadata["gpumem_nb"]["claims"][cell_id]

    # F2b: a claim's sentence turned around, in its line and its record.
    nb = copy.deepcopy(synthetic_run)
    out = nb.cells[1].outputs[-1]
    out["text"] = out["text"].replace("add up to 8 MiB", "add up to 9 MiB")
    r = record(nb, "99-01")[0]
    r["says"] = r["says"].replace("8 MiB", "9 MiB")
    r["line"] = r["line"].replace("add up to 8 MiB", "add up to 9 MiB")
    problems = forged_claims(with_digests_rewritten(nb))
    assert any("no claim in its source says 'the two blocks add up to 9 MiB'" in p
               for p in problems), problems

    # F3: a claim every run makes, removed with its line and its record.
    nb = copy.deepcopy(synthetic_run)
    out = nb.cells[2].outputs[-1]
    out["text"] = "".join(ln for ln in out["text"].splitlines(keepends=True)
                          if "nothing is left free" not in ln)
    nb.metadata["gpumem_nb"]["claims"]["99-02"] = [
        r for r in record(nb, "99-02") if r["says"] != "nothing is left free"]
    problems = forged_claims(with_digests_rewritten(nb))
    assert "99-02: its claim 'nothing is left free' recorded nothing" in problems, problems

    # F6: a claim no source makes, added with a record that matches its line.
    nb = copy.deepcopy(synthetic_run)
    nb.cells[4].outputs.append(nbformat.v4.new_output(
        "stream", name="stdout", text="✓ the table shows no leak\n"))
    nb.metadata["gpumem_nb"]["claims"]["99-04"] = [
        {"says": "the table shows no leak", "values": {}, "operands": {}, "status": "held",
         "line": "✓ the table shows no leak"}]
    problems = forged_claims(with_digests_rewritten(nb))
    assert "99-04: no claim in its source says 'the table shows no leak'" in problems, problems

    # A ✓ line a reader sees where the check did not look: on stderr, behind a zero-width
    # space, in bold HTML; and HTML (what JupyterLab shows) that says other than the plain text.
    hidden = {"stderr": nbformat.v4.new_output("stream", name="stderr", text="✓ it fits\n"),
              "zero-width": nbformat.v4.new_output("stream", name="stdout",
                                                   text="\u200b✓ it fits\n"),
              "bold HTML": nbformat.v4.new_output("display_data", data={
                  "text/plain": "<IPython.core.display.HTML object>",
                  "text/html": "<p><b>✓ it fits</b></p>"})}
    for where, out in hidden.items():
        nb = copy.deepcopy(synthetic_run)
        nb.cells[4].outputs.append(out)
        problems = forged_claims(with_digests_rewritten(nb))
        assert any("no claim wrote ['✓ it fits']" in p for p in problems), (where, problems)
    nb = copy.deepcopy(synthetic_run)
    line = record(nb, "99-01")[0]["line"]
    nb.cells[1].outputs.append(nbformat.v4.new_output("display_data", data={
        "text/plain": line, "text/html": "<p>✗ the two blocks do not add up</p>"}))
    problems = forged_claims(with_digests_rewritten(nb))
    assert any("show different claim lines" in p for p in problems), problems

    # F9: a cell the run never executed, showing an output, digests untouched.
    nb = copy.deepcopy(synthetic_run)
    added = nbformat.v4.new_code_cell("print('it needs 20 MiB')")
    added.id = "99-05"
    added.outputs = [nbformat.v4.new_output("stream", name="stdout", text="it needs 20 MiB\n")]
    nb.cells.append(added)
    assert "99-05: shows outputs, but the run recorded no digest of them" in forged_claims(nb)


@pytest.mark.kernel
def test_the_digest_of_a_saved_cell_is_the_digest_of_the_cell_read_back(synthetic_run,
                                                                        tmp_path):
    nbformat.write(synthetic_run, tmp_path / "again.ipynb")
    again = nbformat.read(tmp_path / "again.ipynb", as_version=4)
    assert forged_claims(again) == []


def figure_cell(picture: str | None = None, title: str = "peak") -> Any:
    data: dict[str, Any] = {RUNNER.PLOTLY_MIME: {"data": [], "layout": {"title": title}},
                            "text/html": "<div></div>"}
    if picture is not None:
        data[RUNNER.PLOTLY_PICTURE_MIME] = picture
    cell = nbformat.v4.new_code_cell("fig.show()")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="a\n"),
                    nbformat.v4.new_output("display_data", data=data)]
    return cell


def test_jupyterlabs_picture_of_a_plotly_figure_does_not_break_the_runs_digest():
    """plotly's renderer adds a PNG to each figure as the notebook opens; the run cannot (no
    JupyterLab on the GPU machine), so it is added here afterwards and must keep the checks."""
    assert (RUNNER.outputs_digest(figure_cell("iVBORw0KGgo="))
            == RUNNER.outputs_digest(figure_cell()))
    # The figure itself is still covered, and so is a PNG that pictures no plotly figure.
    assert (RUNNER.outputs_digest(figure_cell(title="forged"))
            != RUNNER.outputs_digest(figure_cell()))
    picture = nbformat.v4.new_code_cell("show()")
    picture.outputs = [nbformat.v4.new_output(
        "display_data", data={RUNNER.PLOTLY_PICTURE_MIME: "iVBORw0KGgo="})]
    bare = copy.deepcopy(picture)
    bare.outputs[0]["data"][RUNNER.PLOTLY_PICTURE_MIME] = "AAAA"
    assert RUNNER.outputs_digest(picture) != RUNNER.outputs_digest(bare)


def test_pictures_go_to_their_own_figures_when_jupyterlab_merged_the_streams_before_them():
    pictures = tutorial_tool("plotly_pictures")
    saved = nbformat.v4.new_notebook()
    saved.cells = [nbformat.v4.new_markdown_cell("# A"), figure_cell(title="one")]
    saved.cells[1].outputs.insert(0, nbformat.v4.new_output("stream", name="stdout", text="b"))
    saved.cells[1].outputs.append(figure_cell(title="two").outputs[1])
    model = copy.deepcopy(saved)
    first, second = model.cells[1].outputs[2]["data"], model.cells[1].outputs[3]["data"]
    del model.cells[1].outputs[0]  # merged into one stream output, as JupyterLab keeps them
    first[RUNNER.PLOTLY_PICTURE_MIME], second[RUNNER.PLOTLY_PICTURE_MIME] = "ONE", "TWO"
    assert pictures.add_pictures(saved, model) == 2
    shown = [o["data"][RUNNER.PLOTLY_PICTURE_MIME] for o in saved.cells[1].outputs[2:]]
    assert shown == ["ONE", "TWO"]
    assert pictures.unpictured(saved) == []


def test_a_notebook_without_the_record_is_accepted_only_from_a_runner_that_kept_none():
    """The notebooks executed at efadd2a predate the record; a commit whose runner writes it
    (this one) must leave it in every notebook it executed."""
    assert runner_recorded_checks_at("efadd2a") in (False, None)
    # What runner_recorded_checks_at looks for is what this runner defines.
    assert "\nCHECKS_VERSION = " in (ROOT / RUNNER_FILE).read_text()


def test_a_source_without_ids_or_with_a_duplicate_is_refused(tmp_path):
    src = tmp_path / "09_demo.py"
    src.write_text("# %%\nx = 1\n")
    with pytest.raises(ValueError, match="no id"):
        RUNNER.load_source(src)
    src.write_text('# %% id="09-00"\nx = 1\n\n# %% id="09-00"\ny = 2\n')
    with pytest.raises(ValueError, match="duplicate"):
        RUNNER.load_source(src)


def test_heavy_widget_state_is_left_out_with_its_views_and_light_state_kept():
    nb = nbformat.v4.new_notebook()
    heavy = {"model_name": "AnyModel", "state": {"_esm": "x" * 300_000}}
    box = {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_fig"]}}
    light = {"model_name": "AnyModel", "state": {"_esm": "export default {}"}}
    nb.metadata["widgets"] = {RUNNER.WIDGET_STATE: {"state": {"fig": heavy, "box": box,
                                                              "chart": light}}}
    cell = nbformat.v4.new_code_cell("%gpumem watch")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        RUNNER.WIDGET_VIEW: {"model_id": "box", "version_major": 2, "version_minor": 0},
        "image/svg+xml": "<svg/>", "text/plain": "chart"}),
        nbformat.v4.new_output("display_data", data={
            RUNNER.WIDGET_VIEW: {"model_id": "chart", "version_major": 2, "version_minor": 0},
            "text/plain": "chart"})]
    nb.cells = [cell]
    assert sorted(RUNNER.drop_heavy_widget_state(nb)) == ["AnyModel", "VBoxModel"]
    assert set(nb.metadata["widgets"][RUNNER.WIDGET_STATE]["state"]) == {"chart"}
    first, second = cell.outputs
    assert set(first["data"]) == {"image/svg+xml", "text/plain"}  # the picture is shown
    assert RUNNER.WIDGET_VIEW in second["data"]
    assert len(json.dumps(nb)) < 10_000


def test_the_sources_digest_changes_with_the_package_and_the_tutorials(tmp_path):
    for rel in ("gpumem_nb/a.py", "gpumem_nb/data/trace.json", "gpumem_nb/livechart.js",
                "notebooks/00_x.py", "README.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("1")
    first = RUNNER.sources_digest(tmp_path)
    (tmp_path / "README.md").write_text("2")
    assert RUNNER.sources_digest(tmp_path) == first  # docs do not change outputs
    for rel in ("gpumem_nb/a.py", "gpumem_nb/data/trace.json", "gpumem_nb/livechart.js",
                "notebooks/00_x.py"):
        (tmp_path / rel).write_text("changed")
        assert RUNNER.sources_digest(tmp_path) != first, rel
        first = RUNNER.sources_digest(tmp_path)


def test_a_record_written_with_sorted_keys_still_matches_its_line_and_a_swapped_value_does_not():
    """nbformat writes the metadata with sorted keys, so a claim's values come back in another
    order than its line shows them; the line still matches, and a line whose values were
    exchanged between names still does not."""
    line = f"{HELD} the pool holds the output [pool = 572.00 MiB; output = 256.00 MiB]"
    record = json.loads(json.dumps({"line": line, "says": "the pool holds the output",
                                    "status": "held",
                                    "values": {"pool": "572.00 MiB", "output": "256.00 MiB"}},
                                   sort_keys=True))
    assert list(record["values"]) == ["output", "pool"]
    assert claim_line(record) == line
    swapped = dict(record, line=f"{HELD} the pool holds the output "
                                "[pool = 256.00 MiB; output = 572.00 MiB]")
    assert claim_line(swapped) != swapped["line"]


# -- forging a copy of an executed tutorial (review 2026-12-05, §7) ---------------------------
def forged_copy(name: str, tmp_path: Path, edit_notebook: Any,
                edit_source: Any = None) -> tuple[Any, Any]:
    """A copy of an executed tutorial and of the source it ran, edited as a forger would and
    written to ``tmp_path``, read back as the tests read the committed ones."""
    nb = executed(name)
    text = source_text_as_executed(name, nb.metadata["gpumem_nb"]).decode()
    edit_notebook(nb)
    if edit_source is not None:
        text = edit_source(text)
    folder = tmp_path / "forged"
    folder.mkdir(exist_ok=True)
    nbformat.write(nb, folder / f"{name}.ipynb")
    (folder / f"{name}.py").write_text(text)
    return (nbformat.read(folder / f"{name}.ipynb", as_version=4),
            RUNNER.load_source(folder / f"{name}.py"))


def cell_of(nb: Any, cell_id: str) -> Any:
    return next(c for c in nb.cells if c.id == cell_id)


def redigest(nb: Any, cell: Any) -> None:
    """What a careful forger does last: the edited cell's digest recomputed."""
    nb.metadata["gpumem_nb"]["outputs_sha256"][cell.id] = RUNNER.outputs_digest(cell)


@functools.cache
def holder_of(cell_id: str) -> str | None:
    """The executed tutorial that holds the cell ``cell_id`` (None: none does). The forgeries
    below edit given cells; a tutorial split in two keeps each cell's id in the part it went
    to, and its old notebook holds every cell until the new parts are executed."""
    found = [n for n in NAMES if n.startswith(cell_id[:2] + "_")
             and any(c.id == cell_id for c in executed(n).cells)]
    assert len(found) <= 1, f"cell {cell_id} is in more than one executed tutorial: {found}"
    return found[0] if found else None


def forged_name(cell_id: str) -> str:
    name = holder_of(cell_id)
    if name is None:
        pytest.skip(f"no executed tutorial holds cell {cell_id}")
    return name


FORGED_NAMES = sorted({n for n in map(holder_of, ("01-30", "01-31", "04-11")) if n})
EMPTY_CACHE_CLAIM = "with a block to free, empty_cache() blocked behind the queued work (> 100 ms)"
HARMLESS = "So it is not harmless:"


@pytest.mark.parametrize("name", FORGED_NAMES)
def test_an_unedited_copy_of_the_forged_tutorials_passes_every_rule(name, tmp_path):
    """The forging tests below fail on the forgery, not on the copy."""
    nb, source = forged_copy(name, tmp_path, lambda nb: None)
    assert tutorial_problems(nb, name, source) == []


def test_a_claim_every_run_makes_recorded_as_skipped_fails(tmp_path):
    """F-A: 01-30's claim that empty_cache() blocked behind the queued work, recorded as a
    skip (which carries no values), beside an output that says it blocked for 0 ms."""
    why = "the GPU was shared during this run, so no timing is claimed"
    skip_line = f"{SKIPPED} {EMPTY_CACHE_CLAIM} ({why})"

    def forge(nb: Any) -> None:
        cell = cell_of(nb, "01-30")
        out = cell.outputs[0]
        out["text"] = "".join(
            skip_line + "\n" if EMPTY_CACHE_CLAIM in ln
            else re.sub(r"blocked for \d+ ms", "blocked for 0 ms", ln)
            for ln in out["text"].splitlines(keepends=True))
        records = nb.metadata["gpumem_nb"]["claims"]["01-30"]
        at = next(i for i, r in enumerate(records) if r["says"] == EMPTY_CACHE_CLAIM)
        records[at] = {"says": EMPTY_CACHE_CLAIM, "values": {}, "operands": {},
                       "status": "skipped", "why": why, "line": skip_line}
        redigest(nb, cell)

    name = forged_name("01-30")
    nb, source = forged_copy(name, tmp_path, forge)
    assert "cached blocked for 0 ms" in output_text(cell_of(nb, "01-30"))
    problems = tutorial_problems(nb, name, source)
    assert f"01-30: no skipped() call in its source says {EMPTY_CACHE_CLAIM!r}" in problems, \
        problems
    assert f"01-30: its claim {EMPTY_CACHE_CLAIM!r} recorded nothing" in problems, problems


def test_a_raises_exception_tag_added_after_the_run_excuses_no_claim(tmp_path):
    """F-B: 04-11 tagged ``raises-exception`` in the notebook only, its claim that deleting
    the stored exception frees the tensors deleted, and "after del error: 8.00 GiB" shown."""
    said = "deleting the stored exception frees the attempt's tensors"

    def forge(nb: Any) -> None:
        cell = cell_of(nb, "04-11")
        out = cell.outputs[0]
        out["text"] = "".join(
            ln.replace("0 B", "8.00 GiB") if ln.startswith("after del error:") else ln
            for ln in out["text"].splitlines(keepends=True) if said not in ln)
        claims = nb.metadata["gpumem_nb"]["claims"]
        claims["04-11"] = [r for r in claims["04-11"] if r["says"] != said]
        cell.metadata["tags"] = ["raises-exception"]
        redigest(nb, cell)

    name = forged_name("04-11")
    nb, source = forged_copy(name, tmp_path, forge)
    assert "after del error:                   8.00 GiB" in output_text(cell_of(nb, "04-11"))
    problems = tutorial_problems(nb, name, source)
    assert "04-11: its metadata is not its source's" in problems, problems
    assert f"04-11: its claim {said!r} recorded nothing" in problems, problems


def head_commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pytest.skip("no git here")


def test_prose_reversed_after_the_run_and_relabelled_with_the_new_commit_fails(tmp_path):
    """F-C: 01-31's "So it is not harmless" turned around in the source and the notebook alike
    (committed), then the notebook relabelled with that commit and its sources' digest; and
    the same with the date of the run moved after the commit too."""
    head = head_commit()

    def reverse(text: str) -> str:
        assert HARMLESS in text
        return text.replace(HARMLESS, "So it is harmless:")

    def relabel(nb: Any, executed_now: bool = False) -> None:
        cell = cell_of(nb, "01-31")
        cell.source = reverse(cell.source)
        meta = nb.metadata["gpumem_nb"]
        meta["commit"], meta["sources_sha256"] = head, RUNNER.sources_digest_at(head)
        if executed_now:
            import datetime

            meta["executed"] = datetime.datetime.now(datetime.UTC).isoformat(
                timespec="seconds")

    # A notebook the runner recorded its cells for fails on them; an older one on its label.
    reversed_cell = "01-31: its text is not the text the run executed"
    name = forged_name("01-31")
    nb, source = forged_copy(name, tmp_path, relabel, reverse)
    problems = tutorial_problems(nb, name, source)
    assert reversed_cell in problems or any(
        p.startswith(f"it names commit {head[:7]}, made after the run it records")
        for p in problems), problems
    nb, source = forged_copy(name, tmp_path, lambda nb: relabel(nb, executed_now=True),
                             reverse)
    problems = tutorial_problems(nb, name, source)
    assert reversed_cell in problems or any("its metadata was edited" in p
                                            for p in problems), problems


def test_a_notebook_that_names_a_commit_this_full_clone_lacks_fails_instead_of_skipping():
    """Review F7: 10's prose turned around and its commit written one character longer
    (`a19276b0`), which still starts with the stale notice's `a19276b`: every check that reads
    the commit skipped ("shallow?"), and CI's plain pytest counts a skip as a pass."""
    if git_clone_kind() != "full":
        pytest.skip(f"{git_clone_kind()} may lack a real commit")
    meta = dict(executed("00_quickstart").metadata["gpumem_nb"])
    meta["commit"] = str(meta["commit"]) + "0"
    checks = [lambda: relabelled(meta), lambda: commit_digest_problems(meta),
              lambda: source_text_as_executed("00_quickstart",
                                              {**meta, "sources_sha256": "0" * 64})]
    for check in checks:
        try:
            check()
        except pytest.fail.Exception as e:
            assert "which this full clone does not have" in str(e)
        except pytest.skip.Exception as e:
            pytest.fail(f"a full clone skipped the check instead of failing it: {e}")
        else:
            pytest.fail("a commit no clone has passed the check")


def problems_with_a_sentence_in_01_31(sentence: str, tmp_path: Path) -> list[str]:
    """The checks' problems once ``sentence`` is slipped into 01-31's prose, in its source and
    its executed notebook alike (a number the run never printed, say)."""
    def add(text: str) -> str:
        return text.replace(HARMLESS, f"{sentence} {HARMLESS}")

    def forge(nb: Any) -> None:
        cell = cell_of(nb, "01-31")
        cell.source = add(cell.source)

    name = forged_name("01-31")
    nb, source = forged_copy(name, tmp_path, forge, add)
    return tutorial_problems(nb, name, source)


@pytest.mark.parametrize("space", ["\u2009", "\u202f", "\u200b", "\u2060", "\ufeff"],
                         ids=["thin", "narrow-nbsp", "zero-width", "word-joiner", "bom"])
def test_a_number_joined_to_its_unit_by_a_thin_or_zero_width_space_is_still_a_number(
        space, tmp_path):
    """A prose number that no cell printed, hidden from the number rule by the character
    between it and its unit (the ✓-line check already drops such characters)."""
    problems = problems_with_a_sentence_in_01_31(f"It blocked for 0{space}ms.", tmp_path)
    assert any(re.fullmatch(r"01-31: '0 ?ms'", p) for p in problems), problems


@pytest.mark.parametrize("written", [
    "517  MiB", "517\tMiB", "517\nMiB", "517 <!-- -->MiB", "517&nbsp;&nbsp;MiB",
    "$517\\,\\text{MiB}$", "517 mebibytes", "5.17e2 MiB", "⅝ GiB"],
    ids=["two-spaces", "tab", "line-break", "html-comment", "two-entities", "latex",
         "spelled-out", "exponent", "vulgar-fraction"])
def test_a_made_up_number_written_the_way_markdown_still_renders_it_is_still_a_number(
        written, tmp_path):
    """Review F6: each of these forms rendered as "517 MiB" (or "0.625 GiB") in JupyterLab, and
    hid a number no cell printed from the rule; a line break is what the sources' 100-column
    wrapping makes of it, so an honest run could ship one too."""
    problems = problems_with_a_sentence_in_01_31(f"Here it gave back {written} of it.",
                                                 tmp_path)
    assert any(p.startswith("01-31: ") and ("MiB" in p or "GiB" in p or "mebibytes" in p)
               for p in problems), problems


@pytest.mark.kernel
def test_prose_or_a_tag_changed_after_a_run_fails_by_the_digest_it_recorded_of_its_cells(
        synthetic_run):
    """What a forger who relabels the notebook does not rewrite: the runner's digest of each
    cell as it ran (written again in the check, so the two must agree)."""
    assert not_the_cells_that_ran(synthetic_run) == []
    nb = copy.deepcopy(synthetic_run)
    nb.cells[0].source = nb.cells[0].source.replace("two blocks", "three blocks")
    assert not_the_cells_that_ran(nb) == ["99-00: its text is not the text the run executed"]
    nb = copy.deepcopy(synthetic_run)
    nb.cells[2].metadata["tags"] = ["raises-exception"]
    assert not_the_cells_that_ran(nb) == ["99-02: its text is not the text the run executed"]
    nb = copy.deepcopy(synthetic_run)
    del nb.metadata["gpumem_nb"]["cells_sha256"]
    assert not_the_cells_that_ran(nb) == [
        "the run recorded no digest of its cells: its metadata was edited"]


def test_a_cell_that_fails_on_purpose_excuses_only_the_claims_after_its_error():
    """The claims before the line its traceback names ran, and must have recorded; a cell
    tagged but showing no error excuses none."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("from claims import claim\nclaim(True, 'before')\n"
                                     "raise RuntimeError('on purpose')\nclaim(True, 'after')")
    cell.id = "c0"
    cell.metadata["tags"] = ["raises-exception"]
    error = nbformat.v4.new_output("error", ename="RuntimeError", evalue="on purpose", traceback=[
        "\x1b[0;31m----\x1b[0m", "\x1b[0;31mRuntimeError\x1b[0m  Traceback (most recent call last)",
        "Cell \x1b[0;32mIn[3], line 3\x1b[0m\n\x1b[0;32m----> 3\x1b[0m raise RuntimeError()"])
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="✓ before\n"), error]
    nb.cells = [cell]
    before = {"says": "before", "values": {}, "operands": {}, "status": "held",
              "line": "✓ before"}
    nb.metadata["gpumem_nb"] = {"claims": {"c0": [before]}}
    assert raised_line(cell) == 3
    assert unsourced_claims(nb) == []
    nb.metadata["gpumem_nb"]["claims"] = {}
    assert unsourced_claims(nb) == ["c0: its claim 'before' recorded nothing"]
    cell.outputs = cell.outputs[:1]
    nb.metadata["gpumem_nb"]["claims"] = {"c0": [before]}
    assert unsourced_claims(nb) == ["c0: its claim 'after' recorded nothing"]


# -- a second look (2026-12-05): two more ways, tried after the review's were closed ----------
@pytest.mark.parametrize("written", ["**0** ms", "0&thinsp;ms", "0&#8201;ms", "<b>0</b> ms",
                                     "0 *ms*", "0\\.5 ms", "`0` ms"])
def test_a_prose_number_hidden_by_markdown_markup_is_still_a_number(written, tmp_path):
    """The number rule read the markdown source, not the text a reader sees: bold around the
    figure, an HTML entity for its thin space, an escaped point, put a number no cell printed
    out of its sight."""
    def add(text: str) -> str:
        return text.replace(HARMLESS, f"It blocked for {written}. {HARMLESS}")

    def forge(nb: Any) -> None:
        cell = cell_of(nb, "01-31")
        cell.source = add(cell.source)

    name = forged_name("01-31")
    nb, source = forged_copy(name, tmp_path, forge, add)
    problems = tutorial_problems(nb, name, source)
    assert any(re.fullmatch(r"01-31: '0(\.5)? ms'", p) for p in problems), problems


def test_a_claims_values_changed_in_its_line_its_record_and_the_output_fail(tmp_path):
    """A forger who keeps the ✓ and changes what it rests on everywhere the check compares:
    04-11's "after del error: 8.00 GiB", its line's and record's value, and the operand the
    claim compared (``gone == 0`` with gone = 8 GiB). The recorded operands must still make
    the claim's own condition true."""
    said = "deleting the stored exception frees the attempt's tensors"

    def forge(nb: Any) -> None:
        cell = cell_of(nb, "04-11")
        out = cell.outputs[0]
        out["text"] = "".join(
            ln.replace("0 B", "8.00 GiB") if ln.startswith("after del error:")
            else ln.replace("[after_del = 0 B]", "[after_del = 8.00 GiB]")
            for ln in out["text"].splitlines(keepends=True))
        record = next(r for r in nb.metadata["gpumem_nb"]["claims"]["04-11"]
                      if r["says"] == said)
        record["values"]["after_del"] = "8.00 GiB"
        record["operands"]["gone"] = str(8 << 30)
        record["line"] = record["line"].replace("[after_del = 0 B]", "[after_del = 8.00 GiB]")
        redigest(nb, cell)

    name = forged_name("04-11")
    nb, source = forged_copy(name, tmp_path, forge)
    problems = tutorial_problems(nb, name, source)
    assert f"04-11: the values recorded for {said!r} do not make it hold: gone == 0" in \
        problems, problems


def test_a_claims_condition_is_evaluated_from_its_record_within_its_figures_rounding():
    """A float is recorded to 6 significant digits: a comparison closer than that cannot be
    told, one beyond it can; an operand not recorded or a call the check does not know makes
    the condition unknown, never false."""
    (call,) = claim_calls("claim(total == 64 * MiB // 4 and x > 0.5 * y, 'it holds')")[0]
    assert holds_with(call, {"total": "16777216", "x": "861.199", "y": "859.49"}) is True
    assert holds_with(call, {"total": "16777216", "x": "0.4", "y": "859.49"}) is False
    assert holds_with(call, {"total": "1.67772e+07", "x": "861.199", "y": "859.49"}) is None
    assert holds_with(call, {"total": "1.6e+07", "x": "861.199", "y": "859.49"}) is False
    assert holds_with(call, {"total": "16777216"}) is None
    (call,) = claim_calls("claim(near(a, b, rel=0.01) and f(a), 'close')")[0]
    assert holds_with(call, {"a": "100", "b": "150"}) is False
    assert holds_with(call, {"a": "100", "b": "100.5"}) is None  # f(a): not known
