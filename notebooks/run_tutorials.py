"""Execute the tutorials on a GPU machine and keep their outputs.

A code cell whose metadata says ``{"tutorial": {"runs": 3}}`` is executed three times in a
row, as a user re-running it would; the notebook keeps the last run's outputs. (The chart's
updates during a long cell are counted by benchmarks/gpu_widget_check.py, which reads every
IOPub message; nbclient only passes on the ones parented to the running cell.)

What a saved notebook needs to show the chart without a kernel, and to open unmodified:

- a settle step after the last cell: a silent execution (no cell, no history entry, no mark
  on the chart) that lets the sampler take a last reading and asks the chart to refresh its
  display by display_id, so the saved bundle (static SVG picture and numbers) is the chart as
  it was at the end of the run;
- the kernel's full ``language_info`` and ``kernelspec``; JupyterLab fills in what is missing
  on open and then shows the notebook as modified;
- the widgets' state (``application/vnd.jupyter.widget-state+json``), so a trusted notebook
  in JupyterLab renders the widgets without a kernel. It includes plotly's 5 MB script;
  ``--no-widget-state`` leaves it out (the static picture stays).

    python notebooks/run_tutorials.py [--no-widget-state] OUT_DIR [NOTEBOOK ...]
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionComplete
from nbclient.util import ensure_async, run_sync

HERE = Path(__file__).resolve().parent

LANGUAGE_INFO_KEYS = ("name", "version", "mimetype", "file_extension", "codemirror_mode",
                      "nbconvert_exporter", "pygments_lexer")
KERNELSPEC_KEYS = ("name", "display_name", "language")
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

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


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


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


# ------------------------------------------------------------------------------------------
# Provenance: what the outputs were produced with, recorded in the notebook's metadata.
# (Imports are local so that this section stays separate from the rest of the runner.)
# ------------------------------------------------------------------------------------------
PROVENANCE_KEY = "gpumem_nb"
# Evaluated in the kernel after the last cell, so they name what the cells really used.
KERNEL_EXPRESSIONS = {
    "torch": "getattr(__import__('sys').modules.get('torch'), '__version__', None)",
    "gpumem_nb": "__import__('gpumem_nb').__version__",
    "python": "__import__('platform').python_version()",
}


def gpus_and_driver() -> tuple[list[str], str | None]:
    """The GPUs' names and the driver version from NVML; ([], None) without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return [], None
    try:
        names = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        driver = pynvml.nvmlSystemGetDriverVersion()
        return names, driver.decode() if isinstance(driver, bytes) else str(driver)
    finally:
        pynvml.nvmlShutdown()


def git_commit() -> str | None:
    """``GPUMEM_NB_COMMIT`` when set (a GPU host may get a copy without .git), else HEAD;
    ``+dirty`` when tracked files differ from it."""
    import os
    import subprocess

    if os.environ.get("GPUMEM_NB_COMMIT"):
        return os.environ["GPUMEM_NB_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=HERE, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


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
    """GPU, driver, torch, gpumem_nb, Python, commit and date of this execution."""
    import datetime

    gpus, driver = gpus_and_driver()
    return {"gpu": ", ".join(gpus) or "none", "driver": driver or "none",
            **kernel_values(client), "commit": git_commit(),
            "executed": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds")}


CELL_GAP_S = 0.25


def run(path: Path, out_dir: Path, widget_state: bool = True) -> dict[str, float]:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=900, kernel_name="python3", allow_errors=False,
                            store_widget_state=widget_state,
                            resources={"metadata": {"path": str(HERE)}})
    timings: dict[str, float] = {}
    try:
        with client.setup_kernel():
            nb.metadata.update(kernel_metadata(client))
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                runs = cell.metadata.get("tutorial", {}).get("runs", 1)
                t0 = time.monotonic()
                for _ in range(runs):
                    client.execute_cell(cell, index)
                    # People pause between cells; the sampler's reading after each one (at
                    # most 0.1 s later) completes the cell's NVML figures in the history.
                    time.sleep(CELL_GAP_S)
                timings[cell.id] = round(time.monotonic() - t0, 2)
            t0 = time.monotonic()
            settle(client)
            timings["settle"] = round(time.monotonic() - t0, 2)
            nb.metadata[PROVENANCE_KEY] = provenance(client)
    finally:
        nb.metadata.pop("widgets", None)
        if widget_state:
            client.set_widgets_metadata()
            drop_stale_buffers(nb)
            drop_unshown_widgets(nb)
        nbformat.write(nb, out_dir / path.name)
    return timings


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    widget_state = "--no-widget-state" not in args
    args = [a for a in args if a != "--no-widget-state"]
    out_dir = Path(args[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    names = args[1:] or sorted(p.name for p in HERE.glob("0*.ipynb"))
    summary: dict[str, object] = {}
    for name in names:
        try:
            summary[name] = run(HERE / name, out_dir, widget_state=widget_state)
        except Exception as e:  # keep going: one call to the GPU machine should show all
            summary[name] = {"error": f"{type(e).__name__}: {e}"[:4000]}
    (out_dir / "tutorial_timings.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
