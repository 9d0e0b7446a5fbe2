"""``%gpumem record on`` in the first cell, before ``import torch``: the recording is armed and
begins inside torch's CUDA start-up, from an empty GPU, without gpumem_nb importing torch or
starting CUDA; ``record status`` says which state it is in; ``%reload_ext`` while armed leaves
nothing waiting; and the OOM line while a session is recorded counts the history before any
snapshot.

torch here is a real package on ``sys.path`` (written to a temporary folder) whose attributes
are the fakes', so the import goes through Python's import system as torch's does; its CUDA
(``CountingLazyCuda``) says "not initialized" while its start-up queue runs, as torch does.
"""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest

from gpumem_nb.importwatch import AfterImport
from gpumem_nb.kernel import current_monitor
from gpumem_nb.kernel import monitor as monitor_mod
from gpumem_nb.kernel.traces import TraceState
from gpumem_nb.session import RECORD_HOOK_ATTR
from gpumem_nb.sources.live import LiveSource
from gpumem_nb.sources.nvml import NvmlSource
from gpumem_nb.whatif.api import SESSION_OOM_LINE_MAX_ENTRIES
from tests import fakes
from tests.fakes import CountingLazyCuda, FakeCudaDevice, FakeGpu, FakePynvml, GiB, fake_torch
from tests.helpers import whatif

PACKAGE = """
from tests.fakes import NEXT_TORCH as _t
cuda = _t.cuda
_C = _t._C
version = _t.version
Tensor = _t.Tensor
OutOfMemoryError = _t.OutOfMemoryError
"""


@pytest.fixture
def importable(monkeypatch: Any, tmp_path: Any) -> Any:
    """torch not imported yet, but importable; one fake H200 with NVML following it."""
    gpu = FakeGpu("GPU-aaaa-1111")
    nvml = FakePynvml([gpu])
    cuda = CountingLazyCuda([FakeCudaDevice("aaaa-1111")], initialized=False)
    cuda.link([gpu])
    torch = fake_torch(cuda)
    monkeypatch.setattr(fakes, "NEXT_TORCH", torch)
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(PACKAGE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("torch", None)
    monkeypatch.setattr(monitor_mod, "make_source",
                        lambda: LiveSource(nvml=NvmlSource(module=nvml)))  # type: ignore[arg-type]
    yield SimpleNamespace(cuda=cuda, torch=torch)
    sys.modules.pop("torch", None)
    assert not any(isinstance(f, AfterImport) for f in sys.meta_path)


def _watches() -> list[Any]:
    return [f for f in sys.meta_path if isinstance(f, AfterImport)]


def record(ip: Any, line: str, capsys: Any) -> str:
    ip.run_line_magic("gpumem", "record " + line)
    return capsys.readouterr().out


def test_record_on_before_torch_arms_it_without_importing_torch(shell, importable, capsys):
    shell.run_cell("%load_ext gpumem_nb")
    capsys.readouterr()
    out = record(shell, "on", capsys)
    assert "armed, waiting for torch's import, then CUDA's start" in out
    assert "torch" not in sys.modules  # armed, not imported
    assert not importable.cuda.initialized and not importable.cuda.calls
    assert len(_watches()) == 1
    assert "waiting for torch to be imported" in record(shell, "status", capsys)
    assert "it was armed" in record(shell, "off", capsys)
    assert not _watches()


def test_the_recording_begins_as_cuda_starts_in_the_cell_that_imports_torch(
        shell, importable, capsys):
    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    shell.run_cell("%gpumem record on", store_history=True)
    capsys.readouterr()
    # One cell imports torch and starts CUDA: a check at the next cell's start would be late.
    cell = shell.execution_count
    shell.run_cell("import torch\nx = torch.cuda.tensor(3 * 2**30)\n"
                   "y = torch.cuda.tensor(2**30)", store_history=True)
    cuda = importable.cuda
    assert cuda.starts == 1
    # Recorded from the first allocation on: the history began inside CUDA's start-up.
    first = cuda.traces[0][0]
    assert first["action"] == "alloc" and first["size"] == 3 * GiB
    status = record(shell, "status", capsys)
    assert f"recording since cell [{cell}]" in status and "about 2 allocator events" in status
    r = whatif(shell, "--session --conf expandable_segments:True -o")
    assert r.baseline.start_reserved_bytes == 0  # an empty GPU
    assert r.baseline.peak_allocated_bytes == 4 * GiB
    record(shell, "off", capsys)
    assert "stopped; a finished session is kept for --session (2 entries)" in \
        record(shell, "status", capsys)
    del shell.user_ns["x"], shell.user_ns["y"]


def test_armed_after_torch_is_imported_waits_for_cuda_without_starting_it(
        shell, importable, capsys):
    shell.run_cell("%load_ext gpumem_nb")
    shell.run_cell("import torch")
    capsys.readouterr()
    out = record(shell, "on", capsys)
    assert "armed, waiting for CUDA's start" in out and "never starts it by itself" in out
    cuda = importable.cuda
    assert not cuda.initialized
    assert not any(c.startswith(("record_memory_history", "init")) for c in cuda.calls)
    assert "waiting for CUDA to start" in record(shell, "status", capsys)
    shell.run_cell("x = torch.cuda.tensor(2**30)", store_history=True)
    assert cuda.history == "all" and cuda.traces[0][0]["size"] == GiB
    assert "recording since cell [" in record(shell, "status", capsys)
    record(shell, "off", capsys)
    del shell.user_ns["x"]


def test_start_cuda_before_torch_imports_torch_as_asked(shell, importable, capsys):
    shell.run_cell("%load_ext gpumem_nb")
    capsys.readouterr()
    out = record(shell, "on --start-cuda", capsys)
    assert "This started CUDA, as you asked" in out and "empty GPU" in out
    assert "torch" in sys.modules and importable.cuda.initialized
    assert importable.cuda.history == "all"
    assert not _watches()
    record(shell, "off", capsys)


def test_off_when_never_switched_on(shell, importable, capsys):
    shell.run_cell("%load_ext gpumem_nb")
    capsys.readouterr()
    assert record(shell, "status", capsys).strip() == "gpumem record: off."


def test_reload_ext_while_armed_leaves_nothing_waiting(shell, importable, capsys):
    shell.run_cell("%load_ext gpumem_nb")
    record(shell, "on", capsys)
    assert len(_watches()) == 1
    shell.run_cell("%reload_ext gpumem_nb")
    assert not _watches()  # no finder of ours left on sys.meta_path
    shell.run_cell("import torch\nx = torch.cuda.tensor(2**30)")
    cuda = importable.cuda
    assert cuda.history is None  # nothing began recording behind the user's back
    assert not any(c.startswith("record_memory_history") for c in cuda.calls)
    assert "gpumem record: off." in record(shell, "status", capsys)
    hook = getattr(cuda, RECORD_HOOK_ATTR, None)
    assert hook is None or hook.handler is None
    del shell.user_ns["x"]


def test_reload_ext_after_torch_import_while_armed_clears_the_queued_start(
        shell, importable, capsys):
    shell.run_cell("%load_ext gpumem_nb")
    shell.run_cell("import torch")
    record(shell, "on", capsys)
    hook = getattr(importable.cuda, RECORD_HOOK_ATTR)
    assert hook.handler is not None
    shell.run_cell("%reload_ext gpumem_nb")
    assert hook.handler is None  # torch keeps the queued call; it forwards to nothing
    shell.run_cell("x = torch.cuda.tensor(2**30)")
    assert importable.cuda.history is None
    del shell.user_ns["x"]


# -- the OOM line while a session is recorded ------------------------------------------------
class CostlyRecorder:
    """A session recorder whose snapshot costs what torch's does at a long history."""

    def __init__(self, entries: int) -> None:
        self.on = True
        self.entries = entries
        self.snapshots = 0

    def entries_estimate(self, device: int) -> int:
        return self.entries

    def snapshot(self) -> Any:
        self.snapshots += 1
        time.sleep(0.7 * self.entries / 100_000)  # 0.7 s per 100,000 entries
        return None


def _facts() -> Any:
    return SimpleNamespace(backend="native", expandable_segments=False, larger_than_gpu=False,
                           device=0, free_bytes=2 * GiB, reserved_bytes=70 * GiB,
                           allowed_bytes=None)


def test_the_oom_line_of_a_long_session_takes_no_snapshot():
    rec = CostlyRecorder(1_000_000)
    state = TraceState(session=rec)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    lines = state.oom_lines(_facts())
    elapsed_s = time.perf_counter() - t0
    assert rec.snapshots == 0
    assert elapsed_s < 0.1
    assert "left out: the session recording holds 1,000,000 allocator events" in lines[0]
    assert "%gpumem whatif --session --conf expandable_segments:True --capacity 73728MiB" \
        in lines[0]


def test_the_oom_line_of_a_short_session_still_reads_its_snapshot():
    rec = CostlyRecorder(SESSION_OOM_LINE_MAX_ENTRIES // 10)
    TraceState(session=rec).oom_lines(_facts())  # type: ignore[arg-type]
    assert rec.snapshots == 1


def test_the_session_counts_its_entries_from_the_allocators_counters(shell, importable, capsys):
    shell.run_cell("%load_ext gpumem_nb")
    shell.run_cell("import torch\na = torch.cuda.tensor(2**20)")
    record(shell, "on", capsys)  # CUDA is up: recording now
    shell.run_cell("b = [torch.cuda.tensor(2**20) for _ in range(5)]\ndel b[:2]")
    rec = current_monitor(shell).session
    importable.cuda.calls.clear()
    # The 5 allocations since (not the one before), and 2 frees of two entries each.
    assert rec.entries_estimate(0) == 9
    assert "snapshot" not in importable.cuda.calls
    record(shell, "off", capsys)
    del shell.user_ns["a"], shell.user_ns["b"]
