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
