"""Find where a tutorial stops making progress on the GPU machine: each code cell is run with
its own timeout, its start and end are logged as they happen, and the kernel dumps every
thread's stack every few seconds (``faulthandler``) into OUT, so a cell that never returns
shows where it waits.

    python3 benchmarks/tutorial_hang_probe.py OUT --cell-timeout-s 90 --budget-s 300 NAME ...
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "tutorials"))

import run_tutorials  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from native_stacks import arm_source, dump  # noqa: E402


def probe(name: str, out: Path, cell_timeout_s: float, deadline: float) -> None:
    import nbformat
    from nbclient import NotebookClient

    nb = run_tutorials.load_source(ROOT / "notebooks" / f"{name}.py")
    stacks = out / f"stacks_{name}.txt"
    signalled = out / f"signalled_{name}.txt"
    nb.cells.insert(0, nbformat.v4.new_code_cell(
        arm_source(signalled) +
        "import faulthandler\n"
        f"_probe_stacks = open({str(stacks)!r}, 'w')\n"
        "faulthandler.dump_traceback_later(20, repeat=True, file=_probe_stacks)"))
    client = NotebookClient(nb, timeout=int(cell_timeout_s), kernel_name="python3",
                            allow_errors=True,
                            resources={"metadata": {"path": str(ROOT / "notebooks")}})
    t_start = time.monotonic()
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            if time.monotonic() > deadline:
                print(f"{name}: budget spent before {cell.get('id')}", flush=True)
                break
            t0 = time.monotonic()
            print(f"{name} {cell.get('id')} start at {t0 - t_start:.1f} s", flush=True)
            try:
                client.execute_cell(cell, index)
                status = "ok"
            except Exception as e:  # a timeout above all
                status = f"{type(e).__name__}: {str(e)[:300]}"
                pid = getattr(getattr(client.km.provisioner, "process", None), "pid", None)
                if pid is not None:
                    print("native stacks:", dump(pid, out / f"native_{name}.txt", signalled),
                          flush=True)
            print(f"{name} {cell.get('id')} {status} in {time.monotonic() - t0:.1f} s",
                  flush=True)
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            for o in errors:
                print(f"  error {o.get('ename')}: {str(o.get('evalue'))[:200]}", flush=True)
            if status != "ok":
                break
    nbformat.write(nb, out / f"probe_{name}.ipynb")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("names", nargs="+")
    ap.add_argument("--cell-timeout-s", type=float, default=90)
    ap.add_argument("--budget-s", type=float, default=300)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TUTORIAL_CLAIMS", "report")
    deadline = time.monotonic() + a.budget_s
    for name in a.names:
        if time.monotonic() > deadline:
            break
        try:
            probe(name, a.out, a.cell_timeout_s, deadline)
        except Exception as e:
            print(f"{name}: {type(e).__name__}: {e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
