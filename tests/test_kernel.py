"""A real Jupyter kernel: the extension in a notebook, and chart updates during a long cell."""

from __future__ import annotations

import time
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.kernel


def make_notebook(cells: list[str]) -> Any:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    return nb


def outputs_text(cell: Any) -> str:
    parts = []
    for o in cell.get("outputs", []):
        if "text" in o:
            parts.append(o["text"])
        data = o.get("data", {})
        parts.append(data.get("text/plain", ""))
    return "\n".join(parts)


def test_a_notebook_runs_with_the_extension_loaded_through_nbclient(tmp_path):
    nb = make_notebook([
        "%load_ext gpumem_nb",
        "data = list(range(10**6))",
        "%gpumem history",
        "%gpumem who",
        "1/0",
        "%gpumem cleanup",
        "import gpumem_nb; df = gpumem_nb.history(); len(df)",
    ])
    client = NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    texts = [outputs_text(c) for c in nb.cells]
    assert "no GPU visible" in texts[0]
    assert "data = list(range(10**6))" in texts[2]
    assert "No tensors or arrays" in texts[3] or "holders" in texts[3]
    assert "dropped the stored ZeroDivisionError" in texts[5]
    assert int(texts[6].strip().splitlines()[-1]) >= 5
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert [e["ename"] for e in errors] == ["ZeroDivisionError"]  # only the cell that raised


def test_chart_updates_keep_arriving_while_a_cell_sleeps(tmp_path):
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        for code in ("%load_ext gpumem_nb", "%gpumem watch --replay bundled"):
            reply = kc.execute_interactive(code, timeout=60, output_hook=lambda m: None)
            assert reply["content"]["status"] == "ok"
        msg_id = kc.execute("import time; time.sleep(5)")
        updates: list[float] = []
        t_start = time.monotonic()
        while True:
            msg = kc.get_iopub_msg(timeout=30)
            # Updates come from the sampler thread, whatever cell they are parented to.
            if msg["msg_type"] == "comm_msg" and msg["content"]["data"].get("method") == "update":
                updates.append(time.monotonic() - t_start)
            elif (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                  and msg["content"]["execution_state"] == "idle"):
                break
        during = [t for t in updates if t < 5.0]
        # The sampler draws every 0.5 s; each draw sends a few widget updates.
        assert len(during) >= 8, updates
        assert max(during) - min(during) >= 3.0  # spread over the sleep, not a burst
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


@pytest.mark.parametrize("raised", ["SystemExit", "GeneratorExit"])
def test_an_exception_whose_str_raises_system_exit_neither_ends_nor_stalls_the_kernel(
        tmp_path, raised):
    # Before: our post_run_cell let the SystemExit out of run_cell and the kernel exited;
    # with GeneratorExit the cell never replied.
    nb = make_notebook([
        "%load_ext gpumem_nb",
        f"class Odd(Exception):\n    def __str__(self):\n        raise {raised}('from __str__')",
        "raise Odd()",
        "print('still', 'alive')",
        "from gpumem_nb.magics import current_monitor\n"
        "print([r.source_preview for r in current_monitor().history.records()][-2:])",
    ])
    client = NotebookClient(nb, timeout=30, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    texts = [outputs_text(c) for c in nb.cells]
    assert "still alive" in texts[3]
    assert "['raise Odd()', \"print('still', 'alive')\"]" in texts[4]
