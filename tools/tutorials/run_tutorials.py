"""Execute the tutorials and keep their outputs.

Each tutorial's source is one file in Jupytext's percent format beside its notebook in
``notebooks/``: ``00_quickstart.py`` is the source of ``00_quickstart.ipynb``. A contributor
edits the ``.py`` (in any editor, or in JupyterLab with jupytext installed); this runner reads
it, executes it in a fresh kernel (started in ``notebooks/``, beside the modules the tutorials
import) and writes the ``.ipynb`` with its outputs. Each cell's id is in its header
(``# %% id="01-11"``), so ids survive edits and reviews can cite them.

A code cell whose header says ``tutorial={"runs": 3}`` is executed three times in a row, as a
user re-running it would; the notebook keeps the last run's outputs. ``tags=["raises-exception"]``
marks a cell that fails on purpose (an OOM the lesson is about).

The tutorials check their own prose (``claims.py``): a cell whose run contradicts the text
raises ``ClaimFailed``. The runner then stops that notebook, saves it as far as it got, goes on
with the next one (one GPU call should show everything), prints which claim failed in which
cell, and exits with status 1.

What a saved notebook needs to show its charts without a kernel, and to open unmodified:

- a settle step after the last cell (or the cell that failed): a silent execution (no cell,
  no history entry, no mark on the chart) that lets the sampler take a last reading and then
  ends the chart, as ``%gpumem watch --stop`` does: its outputs, found by display_id, become
  its static picture and numbers, the chart as it was at the end of the run, and need no
  widget state to show everywhere (JupyterLab trusted or not, nbconvert's HTML, GitHub);
- the kernel's full ``language_info`` and ``kernelspec``; JupyterLab fills in what is missing
  on open and then shows the notebook as modified;
- the state (``application/vnd.jupyter.widget-state+json``) only of widgets an output still
  shows (nbclient keeps every widget ever opened, the ended chart's too), and no model above
  ``WIDGET_STATE_LIMIT_BYTES`` (a bundled script, not data): such a model is left out with
  every view of it, and its outputs fall back to their static picture. ``--no-widget-state``
  leaves all widget state out.

Each claim a cell makes (``claims.py``: the sentence, the values it compared, the line it
printed, or why it was skipped) is read from the kernel after the cell and saved in the
metadata (``gpumem_nb.claims``, by cell id), with a digest of every code cell's outputs as
saved (``gpumem_nb.outputs_sha256``): tools/tutorials/tests/test_tutorial_prose.py then fails
on a ``✓`` line that no claim wrote, a claim whose cell is gone, or an output edited after the
run.

Provenance goes into the metadata (key ``gpumem_nb``): GPU, driver, CUDA, torch, IPython,
ipykernel, gpumem_nb, Python, commit, whether the tree was clean, the date, and a digest of the
package and tutorial sources, which tests compare with the checkout.

    python tools/tutorials/run_tutorials.py [--no-widget-state] [--budget-s S] OUT_DIR [NAME ...]
    python tools/tutorials/run_tutorials.py --dry-run [OUT_DIR] [NAME ...]

``--dry-run`` executes nothing: it parses every code cell as IPython would and lists, per
tutorial, its cells, claims, the cells that fail on purpose, and how long its last H200 run
took (``benchmarks/results/tutorial_timings_h200.json``).

NAME is a tutorial's stem or file name (``00_quickstart``, ``00_quickstart.py``); all of
them by default, in order. After ``--budget-s`` seconds no further notebook is started.
``TUTORIAL_CELL_TIMEOUT_S`` (900 by default) bounds each cell; a cell past it ends its
notebook, saved as far as it got, and the next one starts.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

# nbformat, jupytext and nbclient are imported where a notebook is read, run or written, not
# here: the test suite loads this module for its constants and tutorial_sources(), and
# nbformat's JSON schemas alone leave some 140,000 objects on the heap of every test process
# that imports it, which the extension's heap walks then visit in every later test.
if TYPE_CHECKING:
    from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent  # tools/tutorials/
ROOT = HERE.parents[1]
NOTEBOOKS = ROOT / "notebooks"  # the tutorials, and the modules they import

LANGUAGE_INFO_KEYS = ("name", "version", "mimetype", "file_extension", "codemirror_mode",
                      "nbconvert_exporter", "pygments_lexer")
KERNELSPEC_KEYS = ("name", "display_name", "language")
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# A saved model above this is a bundled script (plotly's is 5 MB), not chart data.
WIDGET_STATE_LIMIT_BYTES = 200_000
CLAIM_FAILED = "ClaimFailed"
FAILED_MARK = "✗ CLAIM FAILED"  # claims.py, in TUTORIAL_CLAIMS=report mode
# The version of what the runner records about claims in the metadata (``claims`` and
# ``outputs_sha256`` under PROVENANCE_KEY; from 2, ``cells_sha256``):
# tools/tutorials/tests/test_tutorial_prose.py applies the rules that need the record to every
# notebook that carries it, and a notebook must carry the version its commit's runner writes:
# relabelled with a later commit, it does not.
CHECKS_VERSION = 2
# Evaluated silently after each run of a cell: the claims it made (claims.take_records).
TAKE_RECORDS = ("__import__('sys').modules['claims'].take_records() "
                "if 'claims' in __import__('sys').modules else '[]'")


def tutorial_sources(folder: Path = NOTEBOOKS) -> list[Path]:
    """The tutorials' sources, in reading order: ``NN_name.py``."""
    return sorted(p for p in folder.glob("[0-9][0-9]_*.py"))


def load_source(path: Path) -> Any:
    """The notebook a percent-format source describes, with the ids from its cell headers,
    ready to execute (no outputs)."""
    import jupytext
    import nbformat

    nb = jupytext.read(path, fmt="py:percent")
    for index, cell in enumerate(nb.cells):
        cell_id = cell.metadata.pop("id", None)
        if not cell_id:
            raise ValueError(f"{path.name}: cell {index} has no id= in its header")
        cell.id = str(cell_id)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    ids = [c.id for c in nb.cells]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"{path.name}: duplicate cell ids {dupes}")
    nb.metadata.pop("jupytext", None)  # the .ipynb is the runner's output, not a paired copy
    nb.metadata.setdefault("kernelspec", {"name": "python3", "language": "python",
                                          "display_name": "Python 3 (ipykernel)"})
    nbformat.validate(nb)
    return nb


# Runs silently: IPython fires no pre/post_run_cell for it, so gpumem_nb records no cell and
# draws no mark. ``end_chart`` replaces the chart's outputs (by display_id) with its picture
# and table, as the chart does when a kernel shuts down with JupyterLab watching: the saved
# tutorials then need no widget state and open with the picture everywhere. The sleep lets
# the sampler's last readings reach the chart first.
SETTLE = """\
import time as _gpumem_time
from gpumem_nb.magics import current_monitor as _gpumem_current
_gpumem_m = _gpumem_current()
if _gpumem_m is not None and _gpumem_m.widget is not None:
    _gpumem_m.sampler.request_tick()
    _gpumem_time.sleep(max(1.0, 3 * _gpumem_m.sampler.interval_s))
    if hasattr(_gpumem_m, "end_chart"):
        _gpumem_m.end_chart()
    elif hasattr(_gpumem_m.widget, "refresh_static"):
        _gpumem_m.widget.refresh_static()
del _gpumem_time, _gpumem_current, _gpumem_m
"""


def kernel_metadata(client: NotebookClient) -> dict[str, Any]:
    """``language_info`` from the kernel's own reply and ``kernelspec`` from its spec, as
    JupyterLab would write them."""
    assert client.kc is not None and client.km is not None
    reply = client.wait_for_reply(client.kc.kernel_info())
    info = dict((reply or {}).get("content", {}).get("language_info", {}))
    missing = [k for k in LANGUAGE_INFO_KEYS if k not in info]
    if missing:
        raise RuntimeError(f"the kernel's language_info lacks {missing}: {info}")
    spec = client.km.kernel_spec
    kernelspec = {"name": client.kernel_name or client.km.kernel_name,
                  "display_name": spec.display_name if spec else "Python 3 (ipykernel)",
                  "language": spec.language if spec else info["name"]}
    return {"language_info": info, "kernelspec": kernelspec}


def settle(client: NotebookClient, code: str = SETTLE) -> None:
    """Run ``code`` silently and route its messages like a cell's: display updates reach the
    saved outputs through nbclient's display_id map, comm messages the saved widget state."""
    import nbformat
    from nbclient.exceptions import CellExecutionComplete
    from nbclient.util import ensure_async, run_sync

    assert client.kc is not None
    scratch = nbformat.v4.new_code_cell(code)
    scratch.metadata["execution"] = {}
    index = len(client.nb.cells)  # no cell of the notebook: its outputs are thrown away
    msg_id = client.kc.execute(code, silent=True, store_history=False)

    async def drain() -> None:
        assert client.kc is not None
        while True:
            msg = await ensure_async(client.kc.iopub_channel.get_msg(timeout=120))
            if msg["parent_header"].get("msg_id") == msg_id:
                try:
                    client.process_message(msg, scratch, index)
                except CellExecutionComplete:
                    return

    run_sync(drain)()
    reply = client.wait_for_reply(msg_id)
    content = (reply or {}).get("content", {})
    if content.get("status") != "ok":
        raise RuntimeError("settle step failed: " + "\n".join(content.get("traceback", [])))


def drop_unshown_widgets(nb: Any) -> int:
    """Remove the saved state of widgets no output shows (nbclient keeps every widget ever
    opened, the closed chart's too): what an output's view references, directly or through
    ``IPY_MODEL_`` links, stays."""
    states = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    todo = [o["data"][WIDGET_VIEW]["model_id"] for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if WIDGET_VIEW in o.get("data", {})]
    keep: set[str] = set()
    while todo:
        model_id = todo.pop()
        if model_id in keep or model_id not in states:
            continue
        keep.add(model_id)
        todo += re.findall(r"IPY_MODEL_([0-9a-f]+)", json.dumps(states[model_id]["state"]))
    dropped = [k for k in states if k not in keep]
    for k in dropped:
        del states[k]
    if not states and "widgets" in nb.metadata:
        del nb.metadata["widgets"]
    return len(dropped)


def drop_stale_buffers(nb: Any) -> int:
    """Remove saved widget buffers that no longer have a place in their model's state.

    nbclient keeps every binary buffer a widget ever sent, by path, while the state keeps
    only the last value. plotly sends each update as ``_py2js_update`` with binary arrays and
    then resets it to None; the saved buffers still point into it, and JupyterLab then fails
    to create the figure ("widget model not found") and with it the whole chart. A buffer
    belongs where its path ends in a placeholder still waiting for it.
    """
    dropped = 0
    states = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for model in states.values():
        buffers = model.get("buffers")
        if not buffers:
            continue
        kept = [b for b in buffers if _placeholder(model["state"], b["path"])]
        dropped += len(buffers) - len(kept)
        if kept:
            model["buffers"] = kept
        else:
            del model["buffers"]
    return dropped


def _has(node: Any, key: Any) -> bool:
    if isinstance(node, dict):
        return key in node
    return isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node)


def _placeholder(state: Any, path: list[Any]) -> bool:
    node = state
    for key in path[:-1]:
        if not _has(node, key):
            return False
        node = node[key]
    last = path[-1]
    if isinstance(node, dict):
        return last not in node or node[last] is None
    return _has(node, last)


def drop_heavy_widget_state(nb: Any, limit_bytes: int = WIDGET_STATE_LIMIT_BYTES) -> list[str]:
    """Leave out saved widget models above ``limit_bytes``, the models that show them, and
    their views in the outputs; return the dropped models' names.

    A view whose model is missing reads "Error displaying widget: model not found" in a
    trusted JupyterLab, so the view entry goes with the model and the output falls back to
    the next entry of its bundle: the static picture.
    """
    states = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    dropped = {mid for mid, model in states.items()
               if len(json.dumps(model)) > limit_bytes}
    changed = bool(dropped)
    while changed:  # a box that shows a dropped model cannot be rendered either
        changed = False
        for mid, model in states.items():
            text = json.dumps(model.get("state", {}))
            if mid not in dropped and any(f"IPY_MODEL_{d}" in text for d in dropped):
                dropped.add(mid)
                changed = True
    names = [states[mid].get("model_name", "?") for mid in sorted(dropped)]
    for mid in dropped:
        del states[mid]
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            view = out.get("data", {}).get(WIDGET_VIEW)
            if view and view.get("model_id") in dropped:
                del out["data"][WIDGET_VIEW]
    return names


# ------------------------------------------------------------------------------------------
# Provenance: what the outputs were produced with, recorded in the notebook's metadata.
# ------------------------------------------------------------------------------------------
PROVENANCE_KEY = "gpumem_nb"
# Evaluated in the kernel after the last cell, so they name what the cells really used.
KERNEL_EXPRESSIONS = {
    "torch": "getattr(__import__('sys').modules.get('torch'), '__version__', None)",
    "cuda_runtime": "getattr(getattr(__import__('sys').modules.get('torch'), 'version', None),"
                    " 'cuda', None)",
    "gpumem_nb": "__import__('gpumem_nb').__version__",
    "ipython": "__import__('IPython').__version__",
    "ipykernel": "__import__('ipykernel').__version__",
    "python": "__import__('platform').python_version()",
}
# What the digest covers: the package (its code, the chart's front end, its data), the
# tutorials' sources and the modules beside them that they import. The rule is the one every
# recorded digest was made with, so that sources_digest_at still reproduces an older commit's:
# notebooks/*.py one level, whatever lay there then (this runner did, before it moved to
# tools/tutorials/). The runner and run_on_gpu.sh are inputs too, outside the digest: the
# tutorial tests compare them with the run's commit (test_tutorial_prose.inputs_of).
DIGEST_GLOBS = ("gpumem_nb/**/*", "notebooks/*.py")


def sources_digest(root: Path = ROOT) -> str:
    """SHA-256 over the package's and the tutorials' sources (paths and contents), so that a
    saved notebook can be checked against the checkout without git on the GPU machine."""
    import hashlib

    digest = hashlib.sha256()
    paths = sorted({p for g in DIGEST_GLOBS for p in root.glob(g)
                    if p.is_file() and "__pycache__" not in p.parts
                    and p.suffix not in (".pyc", ".pyo")})
    for p in paths:
        digest.update(p.relative_to(root).as_posix().encode() + b"\0")
        digest.update(p.read_bytes().replace(b"\r\n", b"\n") + b"\0")
    return digest.hexdigest()


def sources_digest_at(commit: str, root: Path = ROOT) -> str | None:
    """``sources_digest`` of the files a commit holds (git's objects, not the working tree),
    so that a notebook executed at an earlier commit can still be checked against what
    produced it. None when git or the commit is not there (a shallow clone)."""
    import fnmatch
    import hashlib
    import subprocess
    from pathlib import PurePosixPath

    def git(*args: str) -> bytes:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                              check=True, timeout=60).stdout

    try:
        names = git("ls-tree", "-r", "-z", "--name-only", commit).decode().split("\0")
    except (OSError, subprocess.SubprocessError):
        return None
    # Path.glob's "**/*" and "*" read as: anything below the folder, and one level only.
    paths = sorted(PurePosixPath(n) for n in names if n and "__pycache__" not in n.split("/")
                   and not n.endswith((".pyc", ".pyo"))
                   and (n.startswith("gpumem_nb/") or (fnmatch.fnmatch(n, "notebooks/*.py")
                        and n.count("/") == 1)))
    digest = hashlib.sha256()
    for p in paths:
        digest.update(p.as_posix().encode() + b"\0")
        digest.update(git("show", f"{commit}:{p.as_posix()}").replace(b"\r\n", b"\n") + b"\0")
    return digest.hexdigest()


def gpu_facts() -> dict[str, Any]:
    """The GPUs, their MIG mode, the driver and its CUDA version, from NVML; empty without a
    driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return {}

    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    try:
        names, mig = [], []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            names.append(text(pynvml.nvmlDeviceGetName(handle)))
            try:
                mig.append("on" if pynvml.nvmlDeviceGetMigMode(handle)[0] else "off")
            except pynvml.NVMLError:
                mig.append("n/a")
        facts: dict[str, Any] = {"gpu": ", ".join(names), "gpu_count": len(names),
                                 "mig": ", ".join(mig),
                                 "driver": text(pynvml.nvmlSystemGetDriverVersion())}
        try:
            v = pynvml.nvmlSystemGetCudaDriverVersion_v2()
            facts["cuda_driver_api"] = f"{v // 1000}.{v % 1000 // 10}"
        except pynvml.NVMLError:
            pass
        return facts
    finally:
        pynvml.nvmlShutdown()


def git_state() -> tuple[str | None, bool | None]:
    """(commit, tree clean). ``GPUMEM_NB_COMMIT`` and ``GPUMEM_NB_TREE_CLEAN`` (``1``/``0``)
    when set, for a GPU host that gets a copy without .git; else HEAD and ``git status``."""
    import subprocess

    if os.environ.get("GPUMEM_NB_COMMIT"):
        clean = os.environ.get("GPUMEM_NB_TREE_CLEAN")
        return os.environ["GPUMEM_NB_COMMIT"], None if clean is None else clean == "1"
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=HERE, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None, None
    return head, not dirty


def kernel_values(client: NotebookClient) -> dict[str, str | None]:
    """``KERNEL_EXPRESSIONS`` evaluated silently in the running kernel."""
    assert client.kc is not None
    msg_id = client.kc.execute("", silent=True, store_history=False,
                               user_expressions=KERNEL_EXPRESSIONS)
    reply = client.wait_for_reply(msg_id) or {}
    found = reply.get("content", {}).get("user_expressions", {})
    values: dict[str, str | None] = {}
    for key in KERNEL_EXPRESSIONS:
        text = found.get(key, {}).get("data", {}).get("text/plain")
        values[key] = None if text in (None, "None") else str(text).strip("'\"")
    return values


def provenance(client: NotebookClient) -> dict[str, object]:
    """What produced the outputs: GPU, driver, CUDA, torch, IPython, gpumem_nb, commit, date."""
    import datetime

    commit, clean = git_state()
    facts = {"gpu": "none", "gpu_count": 0, "driver": "none", **gpu_facts()}
    return {**facts, **kernel_values(client), "commit": commit, "tree_clean": clean,
            "sources_sha256": sources_digest(),
            "executed": datetime.datetime.now(datetime.UTC).isoformat(
                timespec="seconds")}


CELL_GAP_S = 0.25


def take_claim_records(client: NotebookClient) -> list[dict[str, Any]]:
    """The claims the last cell made, from ``claims.take_records`` in the kernel."""
    assert client.kc is not None
    msg_id = client.kc.execute("", silent=True, store_history=False,
                               user_expressions={"records": TAKE_RECORDS})
    reply = client.wait_for_reply(msg_id) or {}
    found = reply.get("content", {}).get("user_expressions", {}).get("records", {})
    if found.get("status") != "ok":
        raise RuntimeError(f"could not read the claims' records: {found}")
    text = found["data"]["text/plain"]
    records: list[dict[str, Any]] = json.loads(ast.literal_eval(text))
    return records


# plotly's JupyterLab renderer adds a picture of each plotly figure it draws to the output's
# bundle, and the notebook then opens modified unless the file holds that picture already. The
# run cannot make it (no JupyterLab on the GPU machine); tools/tutorials/plotly_pictures.py adds it
# here, afterwards, from JupyterLab's own model. The figure it pictures is in the digest.
PLOTLY_MIME = "application/vnd.plotly.v1+json"
PLOTLY_PICTURE_MIME = "image/png"


def outputs_digest(cell: Any) -> str:
    """SHA-256 of a code cell's outputs as nbformat reads them back (multi-line strings
    joined), so that the digest of a saved cell is the digest of the cell as written; a
    plotly figure's picture, which JupyterLab adds after the run, is left out."""
    import hashlib

    def normal(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            if key == "data" and PLOTLY_MIME in value:
                value = {k: v for k, v in value.items() if k != PLOTLY_PICTURE_MIME}
            return {k: normal(v, k) for k, v in value.items()}
        if isinstance(value, list):
            if value and all(isinstance(v, str) for v in value) and (
                    key == "text" or "/" in key):
                return "".join(value)
            return [normal(v) for v in value]
        return value

    text = json.dumps(normal(list(cell.get("outputs", []))), sort_keys=True,
                      ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def merge_streams(nb: Any) -> None:
    """Consecutive stream outputs of one name (stdout, stderr) as one, as JupyterLab's model
    merges them on open: saved apart, 08 opened marked modified before any kernel answered."""
    for cell in nb.cells:
        merged: list[Any] = []
        for out in cell.get("outputs", []):
            prev = merged[-1] if merged else None
            if (out.get("output_type") == "stream" and prev is not None
                    and prev.get("output_type") == "stream"
                    and prev.get("name") == out.get("name")):
                prev["text"] = prev.get("text", "") + out.get("text", "")
            else:
                merged.append(out)
        if "outputs" in cell:
            cell["outputs"] = merged


# What executing a cell adds to its metadata (nbclient's timings); the rest is the source's.
RUN_METADATA = ("execution",)


def cell_digest(cell: Any) -> str:
    """SHA-256 of a cell as the run executed it: its type, its text and its metadata (tags
    such as raises-exception), without what executing adds. Prose or a tag changed after the
    run then shows, even in a notebook relabelled with the commit that changed it."""
    import hashlib

    meta = {k: v for k, v in cell.metadata.items() if k not in RUN_METADATA}
    text = json.dumps([cell.cell_type, cell.source, meta], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def record_checks(nb: Any, claims: dict[str, list[dict[str, Any]]]) -> None:
    """Save each cell's claims, the digest of every code cell's outputs, and of every cell as
    it ran, in the metadata: a ✓ line is then tied to the claim that wrote it, its values and
    its cell's outputs, and the prose to the run."""
    meta = nb.metadata.setdefault(PROVENANCE_KEY, {})
    meta["checks_version"] = CHECKS_VERSION
    meta["claims"] = {cell_id: records for cell_id, records in claims.items() if records}
    meta["outputs_sha256"] = {c.id: outputs_digest(c) for c in nb.cells
                              if c.cell_type == "code" and c.get("execution_count")}
    meta["cells_sha256"] = {c.id: cell_digest(c) for c in nb.cells}


class ClaimError(RuntimeError):
    """A tutorial's cell contradicted its prose (``claims.ClaimFailed``)."""


class CellFailed(RuntimeError):
    """A tutorial's cell raised an error it was not tagged to raise."""


def failed_claims(nb: Any) -> list[str]:
    """``cell id: sentence`` for each claim that failed in report mode."""
    found = []
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                found += [f"{cell.id}: {line}" for line in out.get("text", "").splitlines()
                          if line.startswith(FAILED_MARK)]
    return found


def run(path: Path, out_dir: Path, widget_state: bool = True,
        widget_state_limit_bytes: int | None = WIDGET_STATE_LIMIT_BYTES) -> dict[str, Any]:
    """Execute one tutorial (its ``.py`` source, or an ``.ipynb``) and write
    ``out_dir/<stem>.ipynb``; return the seconds each cell took. Raises ``ClaimError`` when a
    cell contradicts the prose, after saving the notebook as far as it got. Widget models
    above ``widget_state_limit_bytes`` are left out (None keeps them all)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = load_source(path) if path.suffix == ".py" else nbformat.read(path, as_version=4)
    # A cell that never returns costs the GPU machine's whole call; TUTORIAL_CELL_TIMEOUT_S
    # bounds each cell so that the notebooks after it still run.
    cell_timeout_s = int(os.environ.get("TUTORIAL_CELL_TIMEOUT_S", "900"))
    client = NotebookClient(nb, timeout=cell_timeout_s, kernel_name="python3", allow_errors=False,
                            store_widget_state=widget_state,
                            resources={"metadata": {"path": str(path.parent)}})
    timings: dict[str, Any] = {}
    claims: dict[str, list[dict[str, Any]]] = {}
    failure: RuntimeError | None = None
    try:
        with client.setup_kernel():
            nb.metadata.update(kernel_metadata(client))
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                runs = cell.metadata.get("tutorial", {}).get("runs", 1)
                t0 = time.monotonic()
                try:
                    for _ in range(runs):
                        # The notebook keeps the last run's outputs, and its claims.
                        try:
                            client.execute_cell(cell, index)
                        except BaseException:
                            with contextlib.suppress(Exception):  # a dead kernel has none
                                claims[cell.id] = take_claim_records(client)
                            raise
                        claims[cell.id] = take_claim_records(client)
                        # People pause between cells; the sampler's reading after each one
                        # (at most 0.1 s later) completes the cell's NVML figures.
                        time.sleep(CELL_GAP_S)
                except CellExecutionError as e:
                    if e.ename == CLAIM_FAILED:
                        failure = ClaimError(f"{path.stem} cell {cell.id}: {e.evalue}")
                    else:
                        failure = CellFailed(
                            f"{path.stem} cell {cell.id}: {e.ename}: {e.evalue}")
                    break
                timings[cell.id] = round(time.monotonic() - t0, 2)
            # Also after a failure: the notebook saved as far as it got still shows its chart
            # as a picture and says what produced it.
            t0 = time.monotonic()
            try:
                settle(client)
            except Exception:
                if failure is None:
                    raise  # else the cell's failure is the news, not the settle step's
            timings["settle"] = round(time.monotonic() - t0, 2)
            nb.metadata[PROVENANCE_KEY] = provenance(client)
    finally:
        nb.metadata.pop("widgets", None)
        if widget_state:
            client.set_widgets_metadata()
            drop_stale_buffers(nb)
            drop_unshown_widgets(nb)
            dropped = (drop_heavy_widget_state(nb, widget_state_limit_bytes)
                       if widget_state_limit_bytes is not None else [])
            if dropped:
                timings["widget_state_left_out"] = dropped
        merge_streams(nb)
        record_checks(nb, claims)  # last: the digests are of the outputs as saved
        nbformat.write(nb, out_dir / f"{path.stem}.ipynb")
    reported = failed_claims(nb)
    if reported:
        timings["claims_failed"] = reported
    if failure is not None:
        raise failure
    return timings


def resolve(names: list[str]) -> list[Path]:
    sources = {p.stem: p for p in tutorial_sources()}
    if not names:
        return list(sources.values())
    chosen = []
    for name in names:
        stem = Path(name).stem
        if stem not in sources:
            raise SystemExit(f"no tutorial {name!r}; the tutorials are: {', '.join(sources)}")
        chosen.append(sources[stem])
    return chosen


TIMINGS = ROOT / "benchmarks" / "results" / "tutorial_timings_h200.json"


def plan(paths: list[Path], timings: Path = TIMINGS) -> list[dict[str, Any]]:
    """What executing ``paths`` would do, without a kernel: per tutorial its cells, code cells
    (with their runs), claims, cells that fail on purpose, and the seconds its last H200 run
    took (None for one never run there). Each code cell is parsed as IPython would run it, so
    a syntax error shows here rather than on the GPU machine."""
    import ast as ast_
    import shlex

    from IPython.core.inputtransformer2 import TransformerManager

    transform = TransformerManager().transform_cell
    known = json.loads(timings.read_text()) if timings.exists() else {}
    rows = []
    for path in paths:
        nb = load_source(path)
        code = [c for c in nb.cells if c.cell_type == "code"]
        for cell in code:
            text = cell.source
            body = text.split("\n", 1)[1] if text.startswith("%%") else transform(text)
            try:
                ast_.parse(body, f"{path.name} cell {cell.id}")
            except SyntaxError as e:
                raise SyntaxError(f"{path.name} cell {cell.id}: {e}") from None
            if text.startswith("%%"):
                shlex.split(text.split("\n", 1)[0])  # the cell magic's own line parses
        last = known.get(path.stem, {})
        rows.append({
            "name": path.stem, "cells": len(nb.cells), "code_cells": len(code),
            "runs": sum(c.metadata.get("tutorial", {}).get("runs", 1) for c in code),
            "claims": sum(len(re.findall(r"^\s*(?:claim|skipped)\(", c.source, re.M))
                          for c in code),
            "raises": [c.id for c in code if "raises-exception" in c.metadata.get("tags", [])],
            "last_h200_s": last.get("total_s") if isinstance(last, dict) else None,
            "executed": path.with_suffix(".ipynb").exists()})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--dry-run" in args:
        names = [a for a in args if a != "--dry-run" and not a.startswith("-")]
        # OUT_DIR first as for a real run; a dry run writes nothing there.
        rows = plan(resolve(names[1:] if names and not Path(names[0]).stem[:2].isdigit()
                            else names))
        for r in rows:
            took = "never run on the H200" if r["last_h200_s"] is None else \
                f"{r['last_h200_s']:.0f} s on the H200 last time"
            state = "executed" if r["executed"] else "not yet executed"
            print(f"{r['name']:<36} {r['code_cells']:>3} code cells ({r['runs']} runs), "
                  f"{r['claims']:>3} claim calls, fails on purpose: {r['raises'] or 'none'}; "
                  f"{took}; {state}")
        print(f"{len(rows)} tutorials parse; nothing was executed")
        return 0
    widget_state = "--no-widget-state" not in args
    args = [a for a in args if a != "--no-widget-state"]
    budget_s = None
    if "--budget-s" in args:
        i = args.index("--budget-s")
        budget_s = float(args[i + 1])
        del args[i:i + 2]
    if not args:
        raise SystemExit(__doc__)
    out_dir = Path(args[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {}
    problems: list[str] = []
    start = time.monotonic()
    for path in resolve(args[1:]):
        if budget_s is not None and time.monotonic() - start > budget_s:
            summary[path.stem] = {"skipped": f"the budget of {budget_s:.0f} s was spent"}
            problems.append(f"{path.stem}: not run (budget spent)")
            continue
        t0 = time.monotonic()
        try:
            summary[path.stem] = run(path, out_dir, widget_state=widget_state)
            problems += [f"{path.stem} {c}" for c in summary[path.stem].get("claims_failed", [])]
        except ClaimError as e:  # keep going: one call to the GPU machine should show all
            summary[path.stem] = {"claim_failed": str(e)[:4000]}
            problems.append(f"CLAIM FAILED in {e}")
        except Exception as e:
            summary[path.stem] = {"error": f"{type(e).__name__}: {e}"[:4000]}
            problems.append(f"{type(e).__name__}: {str(e)[:300]}")
        summary[path.stem]["total_s"] = round(time.monotonic() - t0, 1)
        (out_dir / "tutorial_timings.json").write_text(json.dumps(summary, indent=2))
    summary["all_s"] = round(time.monotonic() - start, 1)
    (out_dir / "tutorial_timings.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    if problems:
        bar = "!" * 78
        print(f"\n{bar}\nTUTORIALS NOT SAVED AS TRUE ({len(problems)}):", file=sys.stderr)
        for p in problems:
            print("  " + p.replace("\n", "\n    "), file=sys.stderr)
        print(bar, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
