"""A real Jupyter kernel: the extension in a notebook, and chart updates during a long cell."""

from __future__ import annotations

import time
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = [pytest.mark.kernel, pytest.mark.slow]  # a real Jupyter kernel per test


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
        "from gpumem_nb.kernel import current_monitor\n"
        "print([r.source_preview for r in current_monitor().history.records()][-2:])",
    ])
    client = NotebookClient(nb, timeout=30, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    texts = [outputs_text(c) for c in nb.cells]
    assert "still alive" in texts[3]
    assert "['raise Odd()', \"print('still', 'alive')\"]" in texts[4]


def test_cells_sent_back_to_back_never_show_an_nvml_peak_read_before_the_cell(tmp_path):
    # Run All sends every cell at once: each cell ends before the sampler reads again. Before,
    # %gpumem history showed the sampler's last reading from before a cell as that cell's
    # "NVML peak" (1.48 GiB for a cell that grew allocated memory by 13.08 GiB), unmarked.
    import json
    from pathlib import Path

    from jupyter_client.manager import start_new_kernel

    root = Path(__file__).resolve().parents[1]
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(root))
    try:
        setup = ("from benchmarks.kernel_probe import install_fakes, _FAKE_WORLD\n"
                 "install_fakes(1)\n"
                 "%load_ext gpumem_nb\n"
                 "cuda = _FAKE_WORLD['cuda']\n"
                 "base = cuda.tensor(2**30)\n"
                 "import time; time.sleep(1.2)")  # the sampler has read NVML since
        reply = kc.execute_interactive(setup, timeout=60, output_hook=lambda m: None)
        assert reply["content"]["status"] == "ok"
        cells = [f"t{i} = cuda.tensor({i + 1} * 2**30)" for i in range(6)]
        ids = [kc.execute(c) for c in cells]  # all at once, as Run All does
        report = ("from gpumem_nb.kernel import current_monitor\n"
                  "m = current_monitor()\n"
                  "import json\n"
                  "print(json.dumps([[r.source_preview, d.allocated_after_bytes, "
                  "d.nvml_peak_bytes, getattr(d, 'nvml_peak_measured', True)] "
                  "for r in m.history.records() for d in r.devices]))\n"
                  "%gpumem history")
        out: list[str] = []

        def hook(msg: Any) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] in ("execute_result", "display_data"):
                out.append(msg["content"]["data"].get("text/plain", ""))

        reply = kc.execute_interactive(report, timeout=60, output_hook=hook)
        assert reply["content"]["status"] == "ok", reply["content"]
        assert len(ids) == 6
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    text = "".join(out)
    rows = [r for r in json.loads(text.splitlines()[0]) if r[0].startswith("t")]
    assert len(rows) == 6, rows
    assert any(r[2] is not None for r in rows), rows  # NVML peaks were given, to be checked
    marked = 0
    for source, allocated_after, nvml_peak, measured in rows:
        if nvml_peak is None:
            continue
        if measured:
            # A reading of this cell: NVML's "used" includes what PyTorch holds then.
            assert nvml_peak >= allocated_after, (source, nvml_peak, allocated_after)
        else:
            marked += 1
    history = text.split("\n", 1)[1]
    assert history.count("≥") >= marked, history  # each lower bound is marked as one
