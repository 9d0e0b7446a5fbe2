"""Where CUDA started: the cell and line named in %gpumem, and pointed at when a forking
launcher refuses to start because CUDA is already up in the kernel."""

from __future__ import annotations

import sys
import traceback
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
from .helpers import run
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
    # cudastart's own hook (the OOM observer's attachment is queued beside it, once too).
    assert len([c for c in cold.cuda.queued_calls if isinstance(c, cudastart._InitHook)]) == 1
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
    assert launcher_refusal(failed.error_in_exec).did == who  # type: ignore[union-attr]


def test_other_errors_print_nothing_about_cuda(cold, capsys):
    run(cold.shell, "w = cuda.tensor(4)")
    capsys.readouterr()
    failed = run(cold.shell, "raise ValueError('nan')")
    assert "gpumem:" not in capsys.readouterr().out
    # The decisions behind the silence: no launcher's refusal, no growth to flag.
    assert launcher_refusal(failed.error_in_exec) is None
    assert list(cold.monitor.verdicts) == []


def test_queueing_never_touches_cuda_and_reports_why_not_when_it_cannot():
    cuda = FakeCuda([FakeCudaDevice("a")], initialized=False)
    src = TorchSource(modules={"torch": fake_torch(cuda)})
    hook, why = src.on_cuda_init(cudastart._InitHook)
    assert hook is not None and why == "" and cuda.calls == [] and not cuda.initialized
    assert src.on_cuda_init(cudastart._InitHook) == (hook, "")  # one per process
    up = FakeCuda([FakeCudaDevice("a")], initialized=True)
    assert TorchSource(modules={"torch": fake_torch(up)}).on_cuda_init(
        cudastart._InitHook)[0] is None


# -- cell magics, the loading cell, threads (the independent tester's findings) ---------------
@pytest.mark.parametrize("magic", ["%%capture cap", "%%gpumem -q", "%%time", "%%timeit -n1 -r1"])
def test_a_cell_magics_body_is_named_by_its_line_in_the_cell_not_by_the_magic_call(
        cold, magic):
    # Was: line 1 `get_ipython().run_cell_magic(...)`, "through cell [4], line 2" (the next
    # cell's number: the body runs as a nested cell).
    result = run(cold.shell, f"{magic}\nb = 2\nx = cuda.tensor(4)\nc = 3")
    start = cold.monitor.cuda_start.started
    assert start.sentence() == (f"CUDA started in cell [{result.execution_count}], line 3: "
                                "`x = cuda.tensor(4)`.")


def test_a_function_called_from_a_cell_magics_body_is_the_way_in(cold):
    first = run(cold.shell, "def load():\n    return cuda.tensor(4)")
    result = run(cold.shell, "%%capture\nm = load()")
    start = cold.monitor.cuda_start.started
    assert (start.execution_count, start.line, start.code) == (result.execution_count, 2,
                                                               "m = load()")
    assert start.via == f"load() in cell [{first.execution_count}], line 2"


def test_a_line_magic_is_quoted_as_typed_not_as_ipython_rewrote_it(cold):
    result = run(cold.shell, "q = 1\n%time x = cuda.tensor(4)")
    start = cold.monitor.cuda_start.started
    assert (start.execution_count, start.line, start.code) == (
        result.execution_count, 2, "%time x = cuda.tensor(4)")


def test_a_cells_leading_blank_lines_count_as_the_editor_shows_them(cold):
    result = run(cold.shell, "\n\nq = 1\nx = cuda.tensor(4)")
    start = cold.monitor.cuda_start.started
    assert (start.execution_count, start.line, start.code) == (
        result.execution_count, 4, "x = cuda.tensor(4)")


def test_cuda_started_in_the_cell_that_loads_the_extension_is_recorded(shell, monkeypatch,
                                                                        capsys):
    # Was never recorded: the loading cell's end was skipped, and a later launcher refusal
    # said "no cell has ended with CUDA up".
    w = make_world(monkeypatch, initialized=False)
    monkeypatch.delitem(sys.modules, "torch")
    shell.user_ns.update(cuda=w.cuda, fake=w.torch, sys=sys, text=ACCELERATE)
    loaded = run(shell, "%load_ext gpumem_nb\nsys.modules['torch'] = fake\nx = cuda.tensor(4)")
    start = shell._gpumem_nb_monitor.cuda_start.started
    assert start is not None and (start.how, start.execution_count) == (
        HOW_CELL, loaded.execution_count)
    capsys.readouterr()
    run(shell, "raise RuntimeError(text)")
    out = capsys.readouterr().out
    assert f"CUDA started in cell [{loaded.execution_count}]" in out
    assert "no cell has ended" not in out


def test_a_blank_cell_after_loading_at_start_up_claims_no_cuda_start(shell, monkeypatch):
    w = make_world(monkeypatch, initialized=False)
    monkeypatch.delitem(sys.modules, "torch")
    shell.run_line_magic("load_ext", "gpumem_nb")  # not from a cell: the kernel's start-up
    sys.modules["torch"] = w.torch
    w.cuda.tensor(4)  # CUDA up outside any cell
    shell.events.trigger("post_run_cell", type("R", (), {"execution_count": 1,
                                                         "error_in_exec": None})())
    assert shell._gpumem_nb_monitor.cuda_start.started is None


@pytest.mark.parametrize("magic", ["%%gpumem -q", "%%capture cap"])
def test_a_launchers_refusal_inside_a_cell_magic_still_gets_its_advice_once(cold, capsys,
                                                                            magic):
    started = run(cold.shell, "w = cuda.tensor(4)")
    cold.shell.user_ns["text"] = ACCELERATE
    capsys.readouterr()
    run(cold.shell, f"{magic}\nraise RuntimeError(text)")
    out = capsys.readouterr().out
    if magic.startswith("%%capture"):
        out = cold.shell.user_ns["cap"].stdout  # the advice goes where the traceback went
    assert out.count("gpumem: accelerate's notebook_launcher forks its workers") == 1, out
    assert f"CUDA started in cell [{started.execution_count}], line 1" in out


def test_cuda_started_on_a_thread_names_the_cell_running_it_not_where_its_function_lives(
        cold):
    defined = run(cold.shell, "import threading\ndef work():\n    global t\n"
                              "    t = cuda.tensor(4)")
    ran = run(cold.shell, "th = threading.Thread(target=work, name='loader')\n"
                          "th.start(); th.join()")
    assert cold.monitor.cuda_start.started.sentence() == (
        f"CUDA started in cell [{ran.execution_count}], line 2: `th.start(); th.join()`, "
        f"through work() in cell [{defined.execution_count}], line 4, on thread loader.")


def test_cuda_started_on_a_thread_running_library_code_keeps_the_cell_and_thread_name(cold):
    ran = run(cold.shell, "import threading, functools\n"
                          "th = threading.Thread(target=functools.partial(cuda.tensor, 4), "
                          "name='bg')\nth.start(); th.join()")
    assert cold.monitor.cuda_start.started.sentence() == (
        f"CUDA started in cell [{ran.execution_count}], line 3: `th.start(); th.join()`, "
        "on thread bg.")


def test_cuda_started_on_a_thread_between_cells_is_outside_any_cell_with_its_thread(cold):
    import threading

    go = threading.Event()
    cold.shell.user_ns["go"] = go
    defined = run(cold.shell, "import threading\ndef work():\n    go.wait(10)\n"
                              "    cuda.tensor(4)\n"
                              "th = threading.Thread(target=work, name='late'); th.start()")
    go.set()  # no cell runs now
    cold.shell.user_ns["th"].join()
    assert cold.monitor.cuda_start.started.sentence() == (
        "CUDA started outside any cell (in code the kernel ran on its own), through work() "
        f"in cell [{defined.execution_count}], line 4, on thread late.")


@pytest.mark.parametrize("source", [
    "raise KeyError('log said: ' + text)",
    "assert 'CUDA has been' not in text, text",
    "raise RuntimeError('the log said: ' + text)",
])
def test_a_users_error_merely_quoting_a_launchers_words_gets_no_launcher_advice(cold, capsys,
                                                                                source):
    run(cold.shell, "w = cuda.tensor(4)")
    cold.shell.user_ns["text"] = ACCELERATE
    capsys.readouterr()
    failed = run(cold.shell, source)
    assert failed.error_in_exec is not None
    assert "forks its workers" not in capsys.readouterr().out
    assert launcher_refusal(failed.error_in_exec) is None


def test_a_failing_cells_message_is_read_once_by_all_of_gpumem_nbs_checks(cold):
    # An exception's __str__ is the user's code (slow, counting, raising): gpumem_nb read it
    # four times per failing cell (its record, the OOM check twice, the refusal check).
    cold.shell.user_ns["ours"] = lambda: any(
        "/gpumem_nb/" in f.filename for f in traceback.extract_stack())
    run(cold.shell, "N = [0]\nclass Counted(Exception):\n    def __str__(self):\n"
                    "        N[0] += ours()\n        return 'counted'")
    run(cold.shell, "raise Counted()")
    assert cold.shell.user_ns["N"][0] == 1


def test_cuda_started_by_a_callback_between_cells_is_outside_any_cell_not_its_functions_cell(
        cold):
    # A widget's click handler runs on the kernel's thread between cells: its function's cell
    # is the way in, not a cell that ran it.
    defined = run(cold.shell, "def on_click(_):\n    return cuda.tensor(4)")
    cold.shell.user_ns["on_click"](None)  # as the kernel calls a handler: no cell running
    assert cold.monitor.cuda_start.started.sentence() == (
        "CUDA started outside any cell (in code the kernel ran on its own), through "
        f"on_click() in cell [{defined.execution_count}], line 2.")
