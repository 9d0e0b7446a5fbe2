"""On the real H200, in IPython's real shell: the stories the notebook layer promises."""

from __future__ import annotations

from typing import Any

import pytest

from gpumem_nb.magics import current_monitor

from .helpers import NVML_BEFORE, fresh

pytestmark = pytest.mark.gpu
MiB = 1 << 20
GiB = 1 << 30


@pytest.fixture
def gpu_shell(shell: Any, capsys: Any) -> Any:
    import torch

    shell.run_cell("import torch", store_history=True)
    torch.zeros(1, device="cuda")
    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    capsys.readouterr()
    yield shell
    shell.run_cell("%gpumem cleanup --out", store_history=True)


def test_rerun_of_displayed_matmul_is_flagged_as_out_and_cleanup_out_frees_it(gpu_shell, capsys):
    import torch

    cell = 'y = torch.randn(4096, 4096, device="cuda"); y @ y'
    for _ in range(3):
        gpu_shell.run_cell(cell, store_history=True, cell_id="matmul")
    out = capsys.readouterr().out
    flags = [ln for ln in out.splitlines() if ln.startswith("gpumem: cell")]
    print("\n".join(flags))
    assert len(flags) == 1 and "(live tensors)" in flags[0] and "Held by: Out[" in flags[0]
    held = torch.cuda.memory_allocated(0)
    report = gpu_shell.run_line_magic("gpumem", "cleanup --out -o")
    print(report)
    freed = {s.step: s.freed_allocated_bytes for s in report.steps}
    assert freed["output cache"] >= 3 * 64 * MiB
    assert torch.cuda.memory_allocated(0) <= held - 3 * 64 * MiB


def test_cell_that_raises_after_allocating_is_flagged_and_default_cleanup_frees_it(
        gpu_shell, capsys):
    import torch

    base = torch.cuda.memory_allocated(0)
    gpu_shell.run_cell(
        "def step():\n    acts = torch.empty(2 * 2**30, dtype=torch.uint8, device='cuda')\n"
        "    raise RuntimeError('shape mismatch')\nstep()", store_history=True)
    out = capsys.readouterr().out
    flag = [ln for ln in out.splitlines() if ln.startswith("gpumem: cell")]
    print(flag)
    assert flag and "and raised (live tensors)" in flag[0]
    assert "traceback: step() locals → acts (2.00 GiB)" in flag[0]
    assert torch.cuda.memory_allocated(0) == base + 2 * GiB
    report = gpu_shell.run_line_magic("gpumem", "cleanup -o")
    print(report)
    steps = {s.step: s for s in report.steps}
    assert steps["last exception"].freed_allocated_bytes == 2 * GiB
    assert steps["empty_cache"].freed_nvml_bytes >= 2 * GiB - 2 * MiB
    assert torch.cuda.memory_allocated(0) == base


def test_cell_magic_reports_the_exact_peak_of_a_5ms_8gib_transient(gpu_shell, capsys):
    import torch

    base = torch.cuda.memory_allocated(0)
    gpu_shell.run_cell(
        "%%gpumem -o\nx = torch.empty(8 * 2**30, dtype=torch.uint8, device='cuda')\n"
        "torch.cuda._sleep(10_000_000)\ndel x\ntorch.cuda.synchronize()", store_history=True)
    report = gpu_shell.user_ns["_"]
    line = capsys.readouterr().out
    print(line)
    d = report.record.devices[0]
    assert d.peak_allocated_bytes == base + 8 * GiB and d.peak_exact
    assert d.allocated_delta_bytes == 0


def test_hooks_record_real_cells_without_touching_the_peak_counters(gpu_shell):
    import torch

    gpu_shell.run_cell("big = torch.empty(3 * 2**30, dtype=torch.uint8, device='cuda')",
                       store_history=True)
    peak_before = torch.cuda.max_memory_allocated(0)
    gpu_shell.run_cell("del big", store_history=True)
    gpu_shell.run_cell("small = torch.ones(10, device='cuda')", store_history=True)
    assert torch.cuda.max_memory_allocated(0) == peak_before  # nobody reset it
    rec = current_monitor(gpu_shell).history.records()[-3]
    assert rec.devices[0].allocated_delta_bytes == 3 * GiB


def test_loading_the_extension_creates_no_context_and_imports_no_torch():
    r = fresh(NVML_BEFORE + """
        import json, sys
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_cell("%load_ext gpumem_nb", store_history=True)
        for i in range(5):
            ip.run_cell(f"a{i} = {i}", store_history=True)
        ip.run_cell("%gpumem", store_history=True)
        ip.run_cell("%gpumem cleanup", store_history=True)
        print(json.dumps({"before": before, "after": used(), "torch": "torch" in sys.modules}))
    """)
    assert r["torch"] is False
    assert r["after"] == r["before"], r
