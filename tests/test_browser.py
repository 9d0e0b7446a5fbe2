"""JupyterLab 4 in Debian's chromium: the chart renders, grows during a sleeping cell, and the
cleanup button reports. The test starts and stops its own server; no browser is downloaded.

A screenshot is kept in artifacts/browser-widget.png.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import nbformat
import pytest

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def lab(tmp_path: Path) -> Any:
    if not os.path.exists(CHROMIUM):
        pytest.fail("Debian's chromium is required: apt-get install chromium (see README)")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in (
        "%load_ext gpumem_nb",
        "%gpumem watch --replay bundled",
        "import time; time.sleep(8)",
    )]
    (tmp_path / "nb").mkdir()
    nbformat.write(nb, tmp_path / "nb" / "demo.ipynb")
    port, token = free_port(), secrets.token_hex(16)
    # JupyterLab's "get notified about news?" toast would cover the page.
    settings = tmp_path / "lab-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    env = dict(os.environ, GPUMEM_NB_CONFIG=str(tmp_path / "settings.json"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "lab-settings"))
    log = open(tmp_path / "lab.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
         f"--port={port}", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={tmp_path / 'nb'}", "--allow-root",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class="
         "jupyterlab.NeverCheckForUpdate"],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if server.poll() is not None:
                break
            time.sleep(0.5)
    else:
        server.kill()
        pytest.fail("JupyterLab did not start: " + (tmp_path / "lab.log").read_text()[-2000:])
    yield f"{base}/lab/tree/demo.ipynb?token={token}"
    server.terminate()
    try:
        server.wait(15)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()


def run_cell(page: Any, index: int) -> None:
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")


PLOT_STATE = """() => {
  const p = document.querySelector('.js-plotly-plot');
  if (!p || !p.data) return null;
  const xs = p.data.slice(0, 10).map(t => (t.x ? Array.from(t.x) : []));
  return {points: xs.reduce((a, x) => a + x.length, 0),
          last: Math.max(...xs.map(x => x.length ? x[x.length - 1] : -1))};
}"""


def test_chart_renders_grows_while_a_cell_sleeps_and_cleanup_reports(lab):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=shutil.which("chromium") or CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        try:
            page.goto(lab)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            # A Shift+Enter sent before the kernel is connected is silently dropped, so wait
            # for the status bar, and give the first cell one more try.
            page.wait_for_selector("text=Python 3 (ipykernel) | Idle", timeout=60_000)
            for attempt in range(3):
                run_cell(page, 0)
                try:
                    page.wait_for_selector("text=gpumem_nb 0.1.0", timeout=20_000)
                    break
                except Exception:
                    if attempt == 2:
                        raise
            run_cell(page, 1)
            page.wait_for_function(
                "() => { const p = document.querySelector('.js-plotly-plot');"
                " return p && p.data && p.data[0].x && p.data[0].x.length > 0; }",
                timeout=60_000)
            run_cell(page, 2)  # sleeps 8 s; the chart must keep moving meanwhile
            page.wait_for_timeout(1000)
            seen = []
            for _ in range(5):
                seen.append(page.evaluate(PLOT_STATE))
                page.wait_for_timeout(1000)
            lasts = [s["last"] for s in seen]
            assert lasts[-1] - lasts[0] >= 3.0, seen  # new points arrived during the sleep
            assert len(set(lasts)) >= 4, seen
            page.screenshot(path=str(ARTIFACTS / "browser-widget-live.png"), full_page=True)
            page.wait_for_selector("text=Clean up", timeout=30_000)
            page.locator("button:has-text('Clean up')").first.click()
            report = page.wait_for_selector("text=what each step freed", timeout=30_000)
            assert report is not None
            page.locator(".jp-OutputArea-output").nth(1).scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "browser-widget.png"), full_page=True)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "browser-failure.png"), full_page=True)
            raise
        finally:
            browser.close()
