"""The trace's top-sites table in chromium: a long site wraps inside the output instead of
widening the table past it (the browser review found 08's table 64 px wider than its output,
the "site" header scrolled out of sight and rows cut at "(from ce"), and the site reads left
to right. No JupyterLab: the table's own HTML in an output-wide box, with JupyterLab's rule
that right-aligns table cells, so the table's inline styles are what is tested."""

from __future__ import annotations

from typing import Any

import pytest

from gpumem_nb.trace import DeviceTrace, Site, SiteBytes, TraceReport, TraceResult

from .browser_harness import chromium

pytestmark = pytest.mark.browser
OUTPUT_PX = 700
# JupyterLab's rendered-HTML table cells (@jupyterlab/rendermime's base.css), in short.
LAB_TABLE_CSS = ("table{border-collapse:collapse;border-spacing:0;border:none}"
                 "td,th{text-align:right;vertical-align:middle;padding:.5em;"
                 "line-height:normal;white-space:normal;max-width:none;border:none}")


def long_sites_report() -> TraceReport:
    # Sites as a real trace names them: a library's frames left out, the cell line that led
    # there, a path far from the notebook.
    sites = [
        Site("/home/user/projects/some-long-project-name/src/model_components/attention.py",
             412, "forward", via="<cell 3 line 17: loss = model(batch).logits.float().mean()>"),
        Site("/opt/conda/lib/python3.12/site-packages/torch/nn/modules/linear.py", 125,
             "forward", via="(no Python stack recorded: an allocation made by C++ code)"),
        Site("<ipython-input-3-0123456789abcdef>", 9, "<module>"),
    ]
    rows = tuple(SiteBytes(s, (3 - i) << 30, 10 + i) for i, s in enumerate(sites))
    device = DeviceTrace(device=0, entries=100, allocations=30, peak_bytes=6 << 30,
                         peak_ms=12.5, end_bytes=1 << 30, at_peak=rows, alive_at_end=rows[:1])
    result = TraceResult(devices=(device,), notes=(), added_s=0.01, entries=100)
    return TraceReport(result)


@pytest.fixture(scope="module")
def page() -> Any:
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1000, "height": 800})
        yield context.new_page()
        context.close()


def test_a_long_site_wraps_inside_the_output_instead_of_overflowing_it(page):
    report = long_sites_report()
    labels = [r.label for r in report.result.devices[0].at_peak]
    assert max(len(x) for x in labels) > 80, labels  # long enough to overflow on one line
    page.set_content(f"<style>{LAB_TABLE_CSS}</style><div id='out' style='width:{OUTPUT_PX}px;"
                     f"overflow-x:auto;font:13px sans-serif'>{report._repr_html_()}</div>")
    seen = page.evaluate("""() => {
      const out = document.getElementById('out');
      const tables = Array.from(out.querySelectorAll('table'));
      const sites = Array.from(out.querySelectorAll('tbody tr td:last-child'));
      return {sideways: out.scrollWidth - out.clientWidth,
              widths: tables.map(t => t.getBoundingClientRect().width),
              align: sites.map(td => getComputedStyle(td).textAlign),
              header: Array.from(out.querySelectorAll('th')).map(th => {
                const r = th.getBoundingClientRect();
                return [th.innerText, r.right <= out.getBoundingClientRect().right + 1]; })};
    }""")
    assert seen["sideways"] <= 0, seen
    assert all(w <= OUTPUT_PX for w in seen["widths"]), seen
    assert set(seen["align"]) == {"left"}, seen  # a site reads from its start
    assert all(inside for _, inside in seen["header"]), seen
    # The numbers still stay on one line each.
    numbers = page.evaluate("""() => Array.from(document.querySelectorAll(
        '#out tbody tr td:first-child')).map(td => {
          const r = document.createRange(); r.selectNodeContents(td);
          return r.getClientRects().length; })""")
    assert numbers and set(numbers) == {1}, numbers
