"""The history table as a saved notebook shows it, without a kernel."""

from __future__ import annotations

import re

from gpumem_nb.model import CellDevice, CellRecord
from gpumem_nb.records import DISPLAY_HEADERS, HistoryTable


def cell_record(raised: bool) -> CellRecord:
    d = CellDevice(0, 0, 3 << 30, 0, 4 << 30, 3 << 30, True, 1 << 30, 5 << 30, 5 << 30,
                   500 << 20, (4 << 30) + (500 << 20))
    return CellRecord(7, "k", "x = torch.empty(3 * 2**30, dtype=torch.uint8)", 0.0, 0.25,
                      (d,), 1 << 30, 1 << 30, raised=raised)


def test_history_table_names_every_column_and_its_cells_never_wrap():
    """The last column had no header, and JupyterLab wrapped "+3.00 GiB" (defect 6)."""
    assert all(h.strip() for h in DISPLAY_HEADERS)
    table = HistoryTable([cell_record(False), cell_record(True)], total=2)
    page = table._repr_html_()
    head = re.findall(r"<th(?: [^>]*)?>(.*?)</th>", page)
    assert head == list(DISPLAY_HEADERS)
    cells = re.findall(r"<t[hd]( [^>]*)?>", page)
    assert cells and all("white-space:nowrap" in (attrs or "") for attrs in cells)
    rows = table.rows()
    assert [r[-1] for r in rows] == ["ok", "raised"]
    assert all(len(r) == len(DISPLAY_HEADERS) for r in rows)
    text = str(table).splitlines()
    assert text[1].split()[-1] == DISPLAY_HEADERS[-1]
