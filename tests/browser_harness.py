"""The browser tests' harness: a private JupyterLab, Debian's chromium, and an error watch that
fails a test on any error anywhere.

``ErrorWatch`` gathers five channels, each one a place where a real user would have met an error
that no assertion on the page looks for:

- ``kernel``: what tests/browser_kernel.py records inside the kernel (log records at ERROR,
  exceptions in ipywidgets message handlers, thread deaths, a stray ``sys.last_value``);
- ``log console``: the entries in JupyterLab's log console for the notebook (JupyterLab puts
  there every error and stderr the kernel sends outside a cell's own execution);
- ``notebook``: error outputs and stderr text in the notebook's cells;
- ``browser``: the browser console's errors and uncaught page errors;
- ``server``: tracebacks and error lines in the Jupyter server's log (the kernel's own stderr
  lands there too).

No browser is downloaded: Playwright drives /usr/bin/chromium.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = "/usr/bin/chromium"
# The Python that runs JupyterLab and its kernel. Point it at another virtual environment to run
# the same tests against other versions of plotly and ipywidgets (see test_browser.py).
PYTHON_ENV = "GPUMEM_NB_BROWSER_PYTHON"

STARTUP = """\
def _gpumem_browser_harness():
    import sys
    sys.path.insert(0, {root!r})
    from tests.browser_kernel import install
    install()
_gpumem_browser_harness()
del _gpumem_browser_harness
"""


def lab_python() -> str:
    return os.environ.get(PYTHON_ENV) or sys.executable


def versions(python: str) -> dict[str, str]:
    """What the kernel will import: reported in the test output and in failures."""
    # "absent" for one not installed: a JupyterLab of its own may lack anywidget on purpose.
    code = ("import importlib.metadata as m, json\n"
            "def v(p):\n"
            "    try: return m.version(p)\n"
            "    except m.PackageNotFoundError: return 'absent'\n"
            "print(json.dumps({p: v(p) for p in ('plotly', 'ipywidgets', 'jupyterlab_widgets', "
            "'jupyterlab', 'ipykernel', 'numpy', 'anywidget')}))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------------------------
# JupyterLab
# --------------------------------------------------------------------------------------------
@dataclass
class Lab:
    base: str
    token: str
    root: Path
    log_path: Path
    python: str
    env: dict[str, str] = field(default_factory=dict)  # the server's, which its kernels inherit
    versions: dict[str, str] = field(default_factory=dict)

    def url(self, path: str, frontend: str = "lab") -> str:
        """A workspace of its own per notebook: JupyterLab would otherwise reopen every
        notebook an earlier test left in the shared default workspace. ``frontend``
        "notebook" opens it in Notebook 7 (served by the same server)."""
        if frontend == "notebook":
            return f"{self.base}/notebooks/{path}?token={self.token}"
        workspace = re.sub(r"[^A-Za-z0-9]", "-", path)
        return f"{self.base}/lab/workspaces/{workspace}/tree/{path}?token={self.token}"

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def log_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def folder(self, name: str) -> Path:
        """A folder of its own per test: the kernel's working directory, where its error
        capture writes and its fakes are chosen."""
        path = self.root / name
        path.mkdir()
        return path


def _lab_settings(settings: Path, widget_state: bool = False) -> None:
    def put(plugin: str, values: dict[str, Any]) -> None:
        folder = settings / "@jupyterlab" / plugin.split(":")[0]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{plugin.split(':')[1]}.jupyterlab-settings").write_text(json.dumps(values))

    # The "get notified about news?" toast would cover the page.
    put("apputils-extension:notification", {"fetchNews": "false"})
    # Every cell attached to the page, so a cell far down is found and clicked like any other.
    put("notebook-extension:tracker", {"windowingMode": "none"})
    if widget_state:  # Settings > Save Widget State Automatically, as a user may turn it on
        folder = settings / "@jupyter-widgets" / "jupyterlab-manager"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "plugin.jupyterlab-settings").write_text(json.dumps({"saveState": True}))


@contextlib.contextmanager
def running_lab(tmp: Path, python: str | None = None, *, tree: Path = ROOT,
                widget_state: bool = False, extra_startup: str = "",
                extra_env: dict[str, str] | None = None,
                data_dir: Path | None = None) -> Iterator[Lab]:
    """A JupyterLab of its own: private settings and config, its own port and token, an IPython
    startup file that installs the kernel side of the error watch (and fakes on request).

    ``tree``: the checkout whose gpumem_nb (and tests/browser_kernel.py) the kernels import,
    this one unless a benchmark compares another. ``widget_state``: JupyterLab saves widget
    state into notebooks. ``extra_startup``: more IPython startup code for every kernel.
    ``extra_env``: more of the server's environment (a data folder holding a kernelspec of its
    own, for one). ``data_dir``: the server's Jupyter data folder (where it reads notebook
    signatures), for a test that signs notebooks; the user's own otherwise."""
    python = python or lab_python()
    root = tmp / "nb"
    root.mkdir()
    ipython_dir = tmp / "ipython"
    startup = ipython_dir / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-gpumem-browser-harness.py").write_text(STARTUP.format(root=str(tree)))
    if extra_startup:
        (startup / "01-extra.py").write_text(extra_startup)
    _lab_settings(tmp / "lab-settings", widget_state)
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ, GPUMEM_NB_CONFIG=str(tmp / "settings.json"),
               JUPYTER_CONFIG_DIR=str(tmp / "jupyter-config"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp / "lab-settings"),
               JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               IPYTHONDIR=str(ipython_dir))
    if data_dir is not None:
        env["JUPYTER_DATA_DIR"] = str(data_dir)
    # The kernel imports this tree's gpumem_nb and tests package, whatever the venv holds.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH")) if p)
    for name in ("GPUMEM_NB_AUTO_SHOW", "GPUMEM_NB_REPLAY"):
        env.pop(name, None)
    env.update(extra_env or {})
    log_path = tmp / "lab.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [python, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
         f"--port={port}", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", "--allow-root",
         # window.jupyterapp: the tests open the log console through its command.
         "--LabApp.expose_app_in_browser=True",
         "--JupyterNotebookApp.expose_app_in_browser=True",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class="
         "jupyterlab.NeverCheckForUpdate"],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n"
                                       + log_path.read_text()[-3000:]) from None
                time.sleep(0.3)
        yield Lab(base=base, token=token, root=root, log_path=log_path, python=python,
                  env=env, versions=versions(python))
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        raise RuntimeError("Debian's chromium is required: apt-get install chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=shutil.which("chromium") or CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            yield browser
        finally:
            browser.close()


def write_notebook(folder: Path, name: str, cells: list[str]) -> str:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, folder / name)
    return f"{folder.name}/{name}"


def use_two_fake_gpus(folder: Path) -> None:
    """The kernel started in this folder gets the two-H200 fakes (tests/browser_kernel.py)."""
    (folder / "gpumem-fakes.json").write_text(json.dumps({"gpus": 2}))


# --------------------------------------------------------------------------------------------
# The error watch
# --------------------------------------------------------------------------------------------
# The server's own lines that are errors ([E ...] from tornado and jupyter_server) and any
# Python traceback (the kernel's real stderr is the server's).
_SERVER_ERROR = re.compile(r"^\[E |Traceback \(most recent call last\)", re.M)

# Known and harmless, each with its reason; matched against the whole entry, never broadly.
BENIGN = (
    # JupyterLab's widget manager probes every new kernel for the ipywidgets control comm; until
    # the kernel has imported ipywidgets, ipykernel logs the probe's failure at ERROR level. No
    # code of ours runs, nothing is lost, and the user never sees it (kernel stderr only).
    re.compile(r"^log ipykernel\.comm: No such comm target registered: jupyter\.widget\.control$"),
    # Notebook 7.6.5's keyboard-shortcuts plugin, on opening any notebook: it reads the schema
    # of a settings plugin it does not know. Seen with a plain `1+1` notebook that imports
    # nothing of ours, and with each widget extension (ipywidgets, anywidget, plotly)
    # disabled in turn: upstream, and nothing on the page stops working.
    re.compile(r"^pageerror: Cannot read properties of undefined \(reading 'schema'\)\n"
               r"TypeError: Cannot read properties of undefined \(reading 'schema'\)\n"
               r"\s+at http://127\.0\.0\.1:\d+/static/notebook/notebook_core\.[0-9a-f]+\.js"),
    # Notebook 7.6.5 on reopening a notebook, now and then: the file browser's restore-on-route
    # code (its stack: filebrowser's restoreBrowser) runs in the notebook page, which registers
    # no file browser command, and a font of Notebook 7's own gets a 403 during that reload.
    # Both are Notebook 7's code and files; nothing on the page is missing.
    re.compile(r"^pageerror: Command 'filebrowser:open-path' not registered\.\n"
               r"Error: Command 'filebrowser:open-path' not registered\.\n"
               r"\s+at c\.execute \(http://127\.0\.0\.1:\d+/static/notebook/notebook_core\."),
    re.compile(r"^console\.error: Failed to load resource: the server responded with a status "
               r"of 403 \(Forbidden\) \(http://127\.0\.0\.1:\d+/static/notebook/"
               r"[0-9a-f]+\.woff2\)$"),
)


def benign(entry: str) -> bool:
    return any(p.match(entry) for p in BENIGN)


LOG_CONSOLE_ENTRIES = """() => {
  const panel = document.querySelector('.jp-LogConsolePanel');
  if (!panel) return null;
  return Array.from(panel.querySelectorAll('.jp-OutputArea-child')).map(child => {
    const prompt = child.querySelector('[data-log-level]');
    const out = child.querySelector('.jp-OutputArea-output');
    return {level: prompt ? prompt.dataset.logLevel : '?',
            text: (out ? out.innerText : child.innerText).slice(0, 4000)};
  });
}"""

NOTEBOOK_ERRORS = """() => Array.from(document.querySelectorAll(
    '.jp-Notebook .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'))
  .map(e => e.innerText.slice(0, 4000))"""


class ErrorWatch:
    """Attach before the page loads; ``collect()`` at the end; ``assert_clean()`` fails the test
    with every error found, by channel."""

    def __init__(self, page: Any, lab: Lab, folder: Path, *, saved_outputs: bool = False) -> None:
        """``saved_outputs``: the notebooks were opened with outputs saved earlier, whose error
        outputs are content; the notebook channel is then left out."""
        self.page, self.lab, self.folder = page, lab, folder
        self.saved_outputs = saved_outputs
        self.browser: list[str] = []
        self._earlier_log_console: list[str] = []
        self._log_offset = lab.log_size()
        page.on("console", self._on_console)
        page.on("pageerror", self._on_page_error)

    def _on_page_error(self, error: Any) -> None:
        stack = getattr(error, "stack", None) or ""
        self.browser.append(f"pageerror: {error}\n{stack[:1500]}".rstrip())

    def _on_console(self, msg: Any) -> None:
        if msg.type == "error":
            loc = msg.location or {}
            self.browser.append(f"console.error: {msg.text} ({loc.get('url', '')})")

    def kernel(self) -> list[str]:
        entries = []
        for path in sorted(self.folder.glob("kernel-errors-*.jsonl")):
            for line in path.read_text().splitlines():
                e = json.loads(line)
                where = e["channel"] + (f" {e['logger']}" if "logger" in e else "")
                if e["channel"] == "showtraceback":
                    where += " (in a cell)" if e.get("in_cell") else " (outside any cell)"
                entry = f"{where}: {e['text']}"
                if not benign(entry):
                    entries.append(entry)
        return entries

    def kernel_capture_installed(self) -> bool:
        return any(self.folder.glob("kernel-errors-*.jsonl"))

    def open_log_console(self) -> None:
        self.page.evaluate("() => window.jupyterapp.commands.execute('logconsole:open', "
                           "{insertMode: 'split-bottom'})")
        self.page.wait_for_selector(".jp-LogConsolePanel", timeout=15_000)
        self.page.wait_for_timeout(500)

    def log_console(self) -> list[str]:
        """Every entry JupyterLab's log console shows for this notebook, at its default level
        (warnings and errors: what a user sees counted in the status bar)."""
        if self.page.query_selector(".jp-LogConsolePanel") is None:
            if "/notebooks/" in self.page.url:
                return []  # Notebook 7 shows no log console; the kernel channel still counts
            self.open_log_console()
        entries = self.page.evaluate(LOG_CONSOLE_ENTRIES) or []
        return [f"{e['level']}: {e['text']}" for e in entries]

    def leaving_notebook(self) -> None:
        """Call before the page opens another notebook: the log console shows one notebook's
        entries, and a page load forgets them."""
        self._earlier_log_console += self.log_console()

    def notebook(self) -> list[str]:
        return [] if self.saved_outputs else list(self.page.evaluate(NOTEBOOK_ERRORS))

    def server(self) -> list[str]:
        text = self.lab.log_since(self._log_offset)
        return [text[max(0, m.start() - 200): m.start() + 1500]
                for m in _SERVER_ERROR.finditer(text)]

    def collect(self) -> dict[str, list[str]]:
        return {"kernel": self.kernel(),
                "log console": self._earlier_log_console + self.log_console(),
                "notebook": self.notebook(),
                "browser": [e for e in self.browser if not benign(e)],
                "server": self.server()}

    @staticmethod
    def describe(found: dict[str, list[str]]) -> str:
        parts = []
        for channel, items in found.items():
            for item in items:
                parts.append(f"--- {channel} ---\n{item}")
        return "\n".join(parts)

    def __enter__(self) -> ErrorWatch:
        return self

    def __exit__(self, tp: Any, value: BaseException | None, tb: Any) -> None:
        """Clean exit: fail on any error found. A failing test also reports what the watch
        found by then, since a background error is often the cause of what failed."""
        if value is None:
            self.assert_clean()
            return
        try:
            found = self.collect()
        except Exception as e:  # the page may be gone; the test's own failure comes first
            found = {"error watch": [f"could not collect: {e}"]}
        if any(found.values()) and hasattr(value, "add_note"):
            value.add_note("The error watch found, by then:\n" + self.describe(found)[:20_000])

    def assert_clean(self) -> dict[str, list[str]]:
        if not self.kernel_capture_installed():
            raise AssertionError("the kernel-side error capture never started: "
                                 "no kernel-errors-*.jsonl in " + str(self.folder))
        found = self.collect()
        if any(found.values()):
            counts = ", ".join(f"{k}: {len(v)}" for k, v in found.items() if v)
            raise AssertionError(f"errors during the session ({counts}) with "
                                 f"{self.lab.versions}:\n" + self.describe(found)[:20_000])
        return found


# --------------------------------------------------------------------------------------------
# Driving the notebook
# --------------------------------------------------------------------------------------------
def open_notebook(page: Any, lab: Lab, path: str, frontend: str = "lab") -> None:
    page.goto(lab.url(path, frontend))
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    page.wait_for_function("() => window.jupyterapp !== undefined", timeout=30_000)


KERNEL_STATUS = """() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session
            && w.sessionContext.session.kernel;
  return k ? k.status : null; }"""


def wait_kernel_idle(page: Any, timeout_ms: int = 60_000) -> None:
    """The notebook's kernel is connected and idle (JupyterLab and Notebook 7 alike)."""
    page.wait_for_function(f"() => ({KERNEL_STATUS})() === 'idle'", timeout=timeout_ms)


def cell(page: Any, index: int) -> Any:
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def prompt_of(page: Any, index: int) -> str:
    return str(cell(page, index).locator(".jp-InputPrompt").inner_text()).strip()


def run_cell(page: Any, index: int, *, wait: bool = True, timeout_ms: int = 60_000) -> None:
    """Click into the cell and press Shift+Enter, as a user does; wait for its number."""
    c = cell(page, index)
    c.scroll_into_view_if_needed()
    c.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    if wait:
        wait_cell_done(page, index, timeout_ms)


def wait_cell_done(page: Any, index: int, timeout_ms: int = 60_000) -> None:
    page.wait_for_function(
        """(i) => { const c = document.querySelectorAll('.jp-Notebook .jp-Cell')[i];
                   const p = c && c.querySelector('.jp-InputPrompt');
                   return p && /\\[\\d+\\]/.test(p.innerText); }""",
        arg=index, timeout=timeout_ms)


def run_first_cell(page: Any, expect: str) -> None:
    """A Shift+Enter sent before the kernel is connected is silently dropped: wait for the
    status bar, then give the first cell up to three tries."""
    wait_kernel_idle(page)
    for attempt in range(3):
        run_cell(page, 0, wait=False)
        try:
            page.wait_for_selector(f"text={expect}", timeout=20_000)
            wait_cell_done(page, 0)
            return
        except Exception:
            if attempt == 2:
                raise


class PhaseClock:
    """Prints how long each phase of a session took (pytest shows it with a failure)."""

    def __init__(self) -> None:
        self.start_s = self.last_s = time.monotonic()

    def phase(self, name: str) -> None:
        """Call as each phase begins; the previous phase's duration is printed with it."""
        now = time.monotonic()
        print(f"{now - self.start_s:6.1f} s: {name} begins (previous phase "
              f"{now - self.last_s:.1f} s)")
        self.last_s = now

    def elapsed_s(self) -> float:
        return time.monotonic() - self.start_s


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path
