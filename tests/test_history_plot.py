"""``%gpumem history --plot``: a bar per cell, as the chart's own SVG picture."""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as ET
from typing import Any

from gpumem_nb.kernel import current_monitor

from .helpers import spaced

SVG_NS = "{http://www.w3.org/2000/svg}"


def run(ip: Any, source: str, cell_id: str | None = None) -> Any:
    result = ip.run_cell(source, store_history=True, cell_id=cell_id)
    spaced(ip)
    return result


def plot_of(shell: Any, monkeypatch: Any, line: str = "%gpumem history --plot") -> dict:
    import gpumem_nb.ipython.commands.reports as reports

    shown: list[Any] = []
    monkeypatch.setattr(reports, "display", lambda obj, **kw: shown.append(obj))
    result = run(shell, line)
    assert result.error_in_exec is None, result.error_in_exec
    (bundle,) = shown
    return bundle


def test_history_plot_is_well_formed_svg_with_a_bar_per_cell(loaded, shell, monkeypatch):
    run(shell, "a = cuda.tensor(2**30)")
    run(shell, "b = cuda.tensor(3 * 2**30)")
    current_monitor(shell).flush()
    bundle = plot_of(shell, monkeypatch)
    svg = bundle["image/svg+xml"]
    root = ET.fromstring(svg)  # parses as XML
    assert root.tag == f"{SVG_NS}svg"
    assert "reserved Δ (growth)" in svg and "allocator peak during the cell" in svg
    assert 'data-series="reserved"' in svg and 'data-series="peak"' in svg
    labels = re.findall(r'class="mark-label"[^>]*>(\[\d+\])<', svg)
    assert len(labels) == 2, labels  # a and b
    html = bundle["text/html"]
    assert base64.b64decode(html.split("base64,", 1)[1].split('"', 1)[0]).decode() == svg


def test_a_flagged_rerun_is_drawn_red(loaded, shell, monkeypatch):
    for _ in range(3):
        run(shell, "y = cuda.tensor(64 * 2**20)\ny", cell_id="rerun")
    mon = current_monitor(shell)
    mon.flush()
    mon.sampler.tick()
    assert mon.verdicts, "no re-run was flagged"
    svg = plot_of(shell, monkeypatch)["image/svg+xml"]
    ET.fromstring(svg)
    flagged = re.search(r'<path class="series" data-series="flagged" d="([^"]+)"', svg)
    assert flagged
    top, base = re.fullmatch(r"M\d+ (\d+).*V(\d+)H\d+Z", flagged.group(1)).groups()
    assert int(top) < int(base)  # a bar that rises above the axis
    assert re.search(r'class="mark-label"[^>]*fill="#d62728">\[\d+\]<', svg)


def test_history_plot_with_o_is_a_usage_error(loaded, shell):
    result = run(shell, "%gpumem history --plot -o")
    assert type(result.error_in_exec).__name__ == "UsageError"
