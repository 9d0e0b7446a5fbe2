"""The tutorials' prose quotes no number that the notebook did not print (issue 11).

Every number with a unit in a markdown cell (B, KiB…TiB, KB…TB, ns, µs, ms, s, %) must appear
in an output of the same executed notebook, allowing for rounding and for the unit it is
written in: "1 GiB" is found in "1024.00 MiB", "1,024 MiB" in "1024 MiB". A tutorial's prose
that drifts from its outputs, or a number typed from memory, fails here.

The tests on the executed notebooks read notebooks/0*.ipynb as committed. Only the GPU machine
can produce those (``python notebooks/run_tutorials.py OUT_DIR``), so after any change to a
tutorial's text these tests fail until the tutorials are executed again there. The tests of
the checker itself run anywhere, and show that a wrong number fails.
"""

from __future__ import annotations

import html
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def load_builder() -> Any:
    spec = importlib.util.spec_from_file_location("build_tutorials",
                                                  NOTEBOOKS / "build_tutorials.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TUTORIAL_NAMES = list(load_builder().TUTORIALS)

# unit -> (family, size of one unit in the family's base)
UNITS: dict[str, tuple[str, float]] = {
    "B": ("bytes", 1), "KiB": ("bytes", 2**10), "MiB": ("bytes", 2**20),
    "GiB": ("bytes", 2**30), "TiB": ("bytes", 2**40), "KB": ("bytes", 1e3),
    "kB": ("bytes", 1e3), "MB": ("bytes", 1e6), "GB": ("bytes", 1e9), "TB": ("bytes", 1e12),
    "ns": ("seconds", 1e-9), "µs": ("seconds", 1e-6), "μs": ("seconds", 1e-6),
    "us": ("seconds", 1e-6), "ms": ("seconds", 1e-3), "s": ("seconds", 1.0),
    "%": ("percent", 1.0),
}
_UNIT_RE = "|".join(sorted((re.escape(u) for u in UNITS), key=len, reverse=True))
# A number not glued to a word or another number ("H200", "v2.6" and "cu130" are no
# quantities), thousands separators allowed, then its unit as a whole word.
QUANTITY = re.compile(
    r"(?<![\w.,])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)[ \u00a0\u202f]?(" + _UNIT_RE
    + r")(?!\w)")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
TAGS = re.compile(r"<[^>]+>")


@dataclass(frozen=True)
class Quantity:
    text: str
    family: str
    value: float  # in the family's base unit
    tolerance: float  # half of the last written digit, in the base unit

    def supported_by(self, printed: Quantity) -> bool:
        """The printed figure, as precise as this one or more, rounds to this one: "8 GiB" is
        supported by "8.00 GiB", "8.41 GiB" or "8192 MiB"; "3.05 GB" is not supported by
        "3 GB", nor "2 GiB" by "1.49 GiB"."""
        slack = 1e-9 * max(abs(self.value), abs(printed.value))
        return (self.family == printed.family
                and printed.tolerance <= self.tolerance + slack
                and abs(self.value - printed.value) <= self.tolerance + slack)


def quantities(text: str) -> list[Quantity]:
    found = []
    for m in QUANTITY.finditer(text):
        number, unit = m.group(1).replace(",", ""), m.group(2)
        family, scale = UNITS[unit]
        decimals = len(number.split(".")[1]) if "." in number else 0
        found.append(Quantity(m.group(0), family, float(number) * scale,
                              0.5 * 10**-decimals * scale))
    return found


def output_text(nb: Any) -> str:
    """Everything a reader sees in the outputs: streams, plain text, HTML as text, errors."""
    parts: list[str] = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                parts += [out.get("ename", ""), out.get("evalue", ""),
                          *out.get("traceback", [])]
            parts.append(str(out.get("text", "")))
            data = out.get("data", {})
            for mime in ("text/plain", "text/markdown"):
                parts.append(str(data.get(mime, "")))
            if "text/html" in data:
                parts.append(html.unescape(TAGS.sub(" ", str(data["text/html"]))))
    return ANSI.sub("", "\n".join(parts))


def unsupported_numbers(nb: Any) -> list[str]:
    """The prose's quantities that no output of the same notebook supports."""
    printed = quantities(output_text(nb))
    missing = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for q in quantities(cell.source):
            if not any(q.supported_by(p) for p in printed):
                missing.append(f"{cell.get('id', '?')}: {q.text!r}")
    return missing


# -- the executed tutorials ------------------------------------------------------------------
@pytest.mark.parametrize("name", TUTORIAL_NAMES)
def test_every_number_in_a_tutorials_prose_is_printed_by_the_same_notebook(name):
    """Fails until the tutorials are executed on the GPU machine with the current sources."""
    path = NOTEBOOKS / name
    assert path.exists(), f"{name} is missing: run notebooks/build_tutorials.py, then execute"
    nb = nbformat.read(path, as_version=4)
    missing = unsupported_numbers(nb)
    assert not missing, f"{name}: prose numbers found in no output: {missing}"


PROVENANCE = ("gpu", "driver", "torch", "gpumem_nb", "commit", "executed")


@pytest.mark.parametrize("name", TUTORIAL_NAMES)
def test_each_executed_tutorial_records_what_produced_its_outputs(name):
    """run_tutorials.py writes GPU, driver, torch, gpumem_nb, commit and date into the
    notebook's metadata. Fails until the tutorials are executed with it on the GPU machine."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    meta = nb.metadata.get("gpumem_nb", {})
    missing = [k for k in PROVENANCE if not meta.get(k) or meta.get(k) == "none"]
    assert not missing, f"{name}: metadata lacks {missing}: {meta}"
    assert "H200" in meta["gpu"], meta


# -- the checker -----------------------------------------------------------------------------
def notebook(prose: str, printed: str, error: str = "") -> Any:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("x")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed)]
    if error:
        cell.outputs.append(nbformat.v4.new_output("error", ename="OutOfMemoryError",
                                                   evalue=error, traceback=[error]))
    nb.cells = [nbformat.v4.new_markdown_cell(prose), cell]
    return nb


def test_a_deliberately_wrong_number_in_the_prose_fails():
    printed = "20000×20000 float32: 1.49 GiB = 1.60 GB (the article: about 3 GB)\n"
    assert unsupported_numbers(notebook("The tensor takes 1.49 GiB.", printed)) == []
    for wrong in ("1.94 GiB", "3.05 GB", "2 GiB", "1,526 MiB", "512 B", "430 ms", "15 %"):
        missing = unsupported_numbers(notebook(f"The tensor takes {wrong}.", printed))
        assert len(missing) == 1 and wrong in missing[0], (wrong, missing)


def test_numbers_match_across_formatting_rounding_and_units():
    printed = ("reserved 1024 MiB; block 512 B; empty_cache blocked for 431 ms; "
               "traced: +1.73 µs per allocation; peak 8.00 GiB; 12.5% of the GPU")
    for prose in ("1,024 MiB", "1 GiB", "1.0 GiB", "512 B", "0.5 KiB", "431 ms", "0.43 s",
                  "1.7 us", "2 µs", "8 GiB", "12.5%", "13 %"):
        assert unsupported_numbers(notebook(f"It was {prose}.", printed)) == [], prose


def test_numbers_in_an_error_output_count_as_printed():
    error = "CUDA out of memory. Tried to allocate 280.00 GiB."
    assert unsupported_numbers(notebook("It asked for 280 GiB.", "", error)) == []
    assert unsupported_numbers(notebook("It asked for 280 GiB.", "nothing")) != []


def test_words_and_names_with_digits_are_not_quantities():
    text = ("H200, v2.6, cu130, Python 3.14, 20000×20000, a 4-byte tensor, 8 bytes, "
            "2 steps, 100M parameters, `max_split_size_mb:128`, protocol 4, %gpumem")
    assert quantities(text) == []
    assert [q.text for q in quantities("+256 MiB, (2 MiB) and 0.76 GB.")] == [
        "256 MiB", "2 MiB", "0.76 GB"]
