"""Where CUDA started: the cell and line named in %gpumem, and pointed at when a forking
launcher refuses to start because CUDA is already up in the kernel."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from gpumem_nb import cudastart
from gpumem_nb.cudastart import (
    FORKED,
    HOW_BEFORE,
    HOW_CELL,
    HOW_HOOK,
    launcher_refusal,
)
from gpumem_nb.sources.torch import TorchSource

from .fakes import FakeCuda, FakeCudaDevice, fake_torch
from .test_oom import make_world


@pytest.fixture
def cold(shell: Any, monkeypatch: Any, capsys: Any) -> Any:
    """torch imported, CUDA not started yet, the extension loaded."""
    w = make_world(monkeypatch, initialized=False)
    shell.run_cell("%load_ext gpumem_nb")
    shell.user_ns["cuda"] = w.cuda
    capsys.readouterr()
    w.shell = shell
    w.monitor = shell._gpumem_nb_monitor
    return w


def run(shell: Any, source: str) -> Any:
    return shell.run_cell(source, store_history=True)


def test_the_cell_and_line_that_started_cuda_are_named(cold, capsys):
    assert cold.cuda.queued_calls and not cold.cuda.initialized  # queued, nothing started
    run(cold.shell, "a = 1")
    result = run(cold.shell, "b = 2\nx = cuda.tensor(4)\nc = 3")
    start = cold.monitor.cuda_start.started
    assert (start.how, start.execution_count, start.line) == (HOW_HOOK,
                                                              result.execution_count, 2)
    capsys.readouterr()
    run(cold.shell, "%gpumem")
    assert (f"CUDA started in cell [{result.execution_count}], line 2: "
            "`x = cuda.tensor(4)`.") in capsys.readouterr().out


def test_a_function_from_an_earlier_cell_is_named_as_the_way_in(cold):
    first = run(cold.shell, "def load():\n    return cuda.tensor(4)")
    second = run(cold.shell, "m = load()")
    start = cold.monitor.cuda_start.started
    assert start.execution_count == second.execution_count and start.code == "m = load()"
    assert start.via == f"load() in cell [{first.execution_count}], line 2"
    assert f"through load() in cell [{first.execution_count}], line 2" in start.sentence()


def test_torch_imported_and_cuda_started_in_one_cell_is_seen_at_its_end(
        shell, monkeypatch, capsys):
    w = make_world(monkeypatch, initialized=False)
    monkeypatch.delitem(sys.modules, "torch")
    shell.run_cell("%load_ext gpumem_nb")
    shell.user_ns.update(cuda=w.cuda, fake=w.torch, sys=sys)
    result = run(shell, "sys.modules['torch'] = fake\nx = cuda.tensor(4)")
    start = shell._gpumem_nb_monitor.cuda_start.started
    assert (start.how, start.execution_count, start.line) == (HOW_CELL,
                                                              result.execution_count, None)
    assert start.sentence() == (f"CUDA started in cell [{result.execution_count}] (seen at "
                                "the cell's end: torch was imported in that same cell).")


def test_cuda_up_before_loading_is_said_so(shell, fake_gpu):
    shell.run_cell("%load_ext gpumem_nb")
    assert shell._gpumem_nb_monitor.cuda_start.started.how == HOW_BEFORE


def test_loading_without_torch_queues_nothing_and_imports_nothing(shell, no_gpu):
    shell.run_cell("%load_ext gpumem_nb")
    shell.run_cell("pass")
    assert "torch" not in sys.modules
    assert shell._gpumem_nb_monitor.cuda_start.started is None


def test_reload_ext_keeps_one_queued_hook_and_the_new_load_gets_the_call(cold):
    run(cold.shell, "%reload_ext gpumem_nb")
    run(cold.shell, "%reload_ext gpumem_nb")
    assert len(cold.cuda.queued_calls) == 1
    result = run(cold.shell, "x = cuda.tensor(4)")
    assert cold.shell._gpumem_nb_monitor.cuda_start.started.execution_count == \
        result.execution_count


def test_a_failing_hook_never_breaks_the_users_cuda_start(cold, monkeypatch):
    def boom(frame: Any) -> None:
        raise RuntimeError("bug in gpumem_nb")

    cold.cuda.queued_calls[0].handler = boom
    result = run(cold.shell, "x = cuda.tensor(4)")
    assert result.error_in_exec is None and cold.cuda.initialized


ACCELERATE = ("CUDA has been initialized before the `notebook_launcher` could create a forked "
              "subprocess. This likely stems from an outside import causing issues once the "
              "`notebook_launcher()` is called.")
LIGHTNING = ("Lightning can't create new processes if CUDA is already initialized. Did you "
             "manually call `torch.cuda.*` functions, have moved the model to the device, or "
             "allocated memory on the GPU any other way? Please remove any such calls, or "
             "change the selected strategy. You will have to restart the Python kernel.")


@pytest.mark.parametrize("text,who", [(ACCELERATE, "accelerate's notebook_launcher"),
                                      (LIGHTNING, "Lightning's ddp_notebook")])
def test_a_launchers_refusal_points_at_the_cell_that_started_cuda(cold, capsys, text, who):
    started = run(cold.shell, "import math\nw = cuda.tensor(4)")
    cold.shell.user_ns["text"] = text
    capsys.readouterr()
    failed = run(cold.shell, "raise RuntimeError(text)")
    assert failed.error_in_exec is not None
    out = capsys.readouterr().out
    assert f"gpumem: {who} forks its workers" in out
    assert f"CUDA started in cell [{started.execution_count}], line 2: `w = cuda.tensor(4)`" in out


def test_a_refusal_is_found_behind_the_launchers_own_wrapper():
    inner = RuntimeError("Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
                         "multiprocessing, you must use the 'spawn' start method")
    try:
        try:
            raise inner
        except RuntimeError as e:
            raise RuntimeError("An issue was found when launching the training") from e
    except RuntimeError as outer:
        assert launcher_refusal(outer) is FORKED  # raised by no launcher's frames
    assert launcher_refusal(ValueError("nope")) is None


# What PyTorch raises in a forked worker that touches CUDA; the launchers re-raise it in the
# kernel inside their own error (accelerate 1.15: elastic's ChildFailedError, its text longer
# than a screen; Lightning 2.6.4 and later: torch's ProcessRaisedException).
REINIT = ("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
          "you must use the 'spawn' start method")


class ChildFailedError(Exception):
    """Stands in for torch.distributed.elastic's: the worker's traceback in its text."""


def raise_through(modules: list[str], exc: BaseException) -> None:
    """Raise ``exc`` from inside nested calls whose frames carry these module names, outermost
    first, as a launcher's own code would."""
    def innermost() -> None:
        raise exc

    fn = innermost
    for name in reversed(modules):
        ns: dict[str, Any] = {"__name__": name, "inner": fn}
        exec("def call():\n    inner()", ns)
        fn = ns["call"]
    fn()


@pytest.mark.parametrize("modules,who", [
    (["accelerate.launchers", "torch.distributed.launcher.api"],
     "accelerate's notebook_launcher forks its workers"),
    (["lightning.fabric.fabric", "lightning.fabric.strategies.launchers.multiprocessing",
      "torch.multiprocessing.spawn"], "Lightning's ddp_notebook forks its workers"),
    (["pytorch_lightning.trainer.trainer", "torch.multiprocessing.spawn"],
     "Lightning's ddp_notebook forks its workers"),
    (["torch.utils.data.dataloader", "torch._utils"], "the DataLoader forks its workers"),
    (["torch.multiprocessing.spawn"], "torch.multiprocessing forked its workers"),
    (["multiprocessing.pool"], "multiprocessing forked its workers"),
    ([], "a process forked from this kernel used CUDA"),
])
def test_a_workers_failed_cuda_start_names_the_launcher_that_forked_it_not_a_subprocess(
        cold, capsys, modules, who):
    started = run(cold.shell, "w = cuda.tensor(4)")
    text = "train FAILED\n" + "-" * 900 + "\n  RuntimeError: " + REINIT + "\n" + "=" * 60
    cold.shell.user_ns["launch"] = lambda: raise_through(modules, ChildFailedError(text))
    capsys.readouterr()
    failed = run(cold.shell, "launch()")
    assert isinstance(failed.error_in_exec, ChildFailedError)
    out = capsys.readouterr().out
    assert f"gpumem: {who}: a forked process cannot use CUDA" in out
    assert f"CUDA started in cell [{started.execution_count}], line 1: `w = cuda.tensor(4)`" in out
    assert "subprocess forks" not in out


def test_other_errors_print_nothing_about_cuda(cold, capsys):
    run(cold.shell, "w = cuda.tensor(4)")
    capsys.readouterr()
    run(cold.shell, "raise ValueError('nan')")
    assert "gpumem:" not in capsys.readouterr().out


def test_queueing_never_touches_cuda_and_reports_why_not_when_it_cannot():
    cuda = FakeCuda([FakeCudaDevice("a")], initialized=False)
    src = TorchSource(modules={"torch": fake_torch(cuda)})
    hook, why = src.on_cuda_init(cudastart._InitHook)
    assert hook is not None and why == "" and cuda.calls == [] and not cuda.initialized
    assert src.on_cuda_init(cudastart._InitHook) == (hook, "")  # one per process
    up = FakeCuda([FakeCudaDevice("a")], initialized=True)
    assert TorchSource(modules={"torch": fake_torch(up)}).on_cuda_init(
        cudastart._InitHook)[0] is None
