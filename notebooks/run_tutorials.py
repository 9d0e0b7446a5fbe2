"""Execute the tutorials on a GPU machine and keep their outputs.

A code cell whose metadata says ``{"tutorial": {"runs": 3}}`` is executed three times in a
row, as a user re-running it would; the notebook keeps the last run's outputs. (The chart's
updates during a long cell are counted by benchmarks/gpu_widget_check.py, which reads every
IOPub message; nbclient only passes on the ones parented to the running cell.)

    python notebooks/run_tutorials.py OUT_DIR [NOTEBOOK ...]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


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


def run(path: Path, out_dir: Path) -> dict[str, float]:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=900, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(HERE)}})
    timings: dict[str, float] = {}
    try:
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                runs = cell.metadata.get("tutorial", {}).get("runs", 1)
                t0 = time.monotonic()
                for _ in range(runs):
                    client.execute_cell(cell, index)
                timings[cell.id] = round(time.monotonic() - t0, 2)
            nb.metadata[PROVENANCE_KEY] = provenance(client)
    finally:
        nb.metadata.pop("widgets", None)  # the plotly bundle is 5 MB; the fallback text stays
        nbformat.write(nb, out_dir / path.name)
    return timings


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    names = sys.argv[2:] or sorted(p.name for p in HERE.glob("0*.ipynb"))
    summary: dict[str, object] = {}
    for name in names:
        try:
            summary[name] = run(HERE / name, out_dir)
        except Exception as e:  # keep going: one call to the GPU machine should show all
            summary[name] = {"error": f"{type(e).__name__}: {e}"[:4000]}
    (out_dir / "tutorial_timings.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
