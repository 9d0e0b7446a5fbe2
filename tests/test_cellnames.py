"""A cell's number from the file name its code was compiled under, on IPython 7.34 to 9, plain
and under ipykernel (whose compiler names a cell after its text alone)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from gpumem_nb.cellnames import CellNames, counts_ahead_at_start, is_cell_top


class Ipykernel6Compiler:
    """ipykernel 6's XCachingCompiler on IPython 7: a temp file named by a hash of the raw
    text, and no ``_filename_map``."""

    def get_code_name(self, raw_code: str, transformed_code: str, number: int) -> str:
        return f"/tmp/ipykernel_4242/{abs(hash(raw_code)) % 10**8}.py"


def test_ipython_8_and_later_are_read_from_their_own_map():
    shell = SimpleNamespace(compile=SimpleNamespace(_filename_map={"/tmp/ipykernel_1/9.py": 3}))
    names = CellNames(shell)
    names.note("x = 1", 4)  # nothing noted: IPython's map is the truth
    assert names.number("/tmp/ipykernel_1/9.py") == 3
    assert names.number("/usr/lib/python3/site.py") is None


def test_plain_ipython_7_carries_the_number_in_the_name():
    names = CellNames(SimpleNamespace(compile=SimpleNamespace()))
    assert names.number("<ipython-input-12-0123abcd>") == 12
    assert names.number("<timed exec>") is None


def test_ipykernel_6_on_ipython_7_is_found_by_the_name_noted_at_the_cells_start():
    compiler = Ipykernel6Compiler()
    names = CellNames(SimpleNamespace(compile=compiler))
    name = compiler.get_code_name("x = cuda.tensor(4)", "", 0)
    assert names.number(name) is None  # before: not a known cell
    names.note("x = cuda.tensor(4)", 5)
    assert names.number(name) == 5 and names.is_cell_file(name)
    names.note("x = cuda.tensor(4)", 9)  # the same text run again: the latest number
    assert names.number(name) == 9


def test_a_real_ipykernel_compiler_names_cells_the_way_they_are_noted():
    compiler_mod = pytest.importorskip("ipykernel.compiler")
    compiler = compiler_mod.XCachingCompiler()
    shell = SimpleNamespace(compile=compiler)
    names = CellNames(shell)
    raw = "y = 2\n"
    names.note(raw, 7)
    compiled_as = compiler.cache(raw, 7)  # what IPython's run_cell names the cell
    assert names.number(compiled_as) == 7


@pytest.mark.parametrize(("name", "top"), [("<module>", True), ("<cell line: 0>", True),
                                           ("<cell line: 3>", True), ("step", False),
                                           ("<lambda>", False)])
def test_a_cells_top_level_is_module_or_ipython_7s_cell_line(name, top):
    assert is_cell_top(name) is top


@pytest.mark.parametrize(("version", "ahead"), [((7, 34, 0), False), ((8, 37, 0), False),
                                                ((9, 7, 0), False), ((9, 8, 0), True),
                                                ((9, 19, 1), True)])
def test_ipython_advances_the_count_before_pre_run_cell_only_from_9_8(monkeypatch, version,
                                                                      ahead):
    monkeypatch.setitem(sys.modules, "IPython", SimpleNamespace(version_info=version))
    assert counts_ahead_at_start() is ahead
