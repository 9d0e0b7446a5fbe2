"""A CUDA OOM the user's code catches must release the failed attempt's tensors when the
``except`` block is left, with the extension loaded exactly as without it.

Tutorial 04 on the H200 (Python 3.12): ``del error`` on a caught OutOfMemoryError left 8 GiB
allocated, and a loop of attempts inside a function kept the first failed attempt's tensors
until the next garbage collection. The holder was ours: the OOM observer runs inside the
failing call, and its holder scan left a frame that referred to itself, which (through
``f_back``) kept every frame under it alive, the user's failing function included.

The garbage collector is switched off around each case: what must free the memory is the
user's ``del`` or the end of the ``except`` block, not a collection that may come later.
"""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any

import pytest

from gpumem_nb.holders import running_frame_ids

from .fakes import GiB, OutOfMemoryError
from .test_oom import make_world, run


class Activation:
    """Stands for a tensor: something a frame holds, whose death a weakref shows."""


@pytest.fixture
def no_gc() -> Any:
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    yield
    if was:
        gc.enable()


def test_looking_at_the_running_frames_keeps_none_of_them_alive(no_gc):
    def attempt() -> weakref.ref[Activation]:
        acts = Activation()
        running_frame_ids()  # what the observer's holder scan does, inside the failing call
        return weakref.ref(acts)

    assert attempt()() is None


LOOP = """
def train_step(gib):
    activations = cuda.tensor(8 * GiB)
    alive.append(weakref.ref(activations))
    logits = cuda.tensor(gib * GiB)
    return activations, logits

def first_batch_that_fits(sizes):
    for size in sizes:
        try:
            result = train_step(size)
        except OOM:
            left.append([r() is not None for r in alive])
            continue
        return size, result
"""


@pytest.fixture
def world(shell: Any, monkeypatch: Any, capsys: Any) -> Any:
    w = make_world(monkeypatch)
    run(shell, "%load_ext gpumem_nb")
    shell.user_ns.update(cuda=w.cuda, GiB=GiB, weakref=weakref, OOM=OutOfMemoryError,
                         alive=[], left=[])
    run(shell, "warm = 1")  # the hooks attach the observer once CUDA is up
    run(shell, LOOP)
    capsys.readouterr()
    w.shell = shell
    return w


def test_a_caught_oom_stored_and_deleted_frees_the_failed_calls_tensors(world, no_gc):
    ns = world.shell.user_ns
    result = run(world.shell, "try:\n    train_step(400)\nexcept OOM as e:\n    error = e\n"
                              "kept = alive[-1]() is not None\ndel error\n"
                              "gone = alive[-1]() is None")
    assert result.error_in_exec is None
    assert world.cuda.observers and len(world.cuda.observers) == 1
    assert ns["kept"], "the stored exception keeps the failed call's locals (Python's rule)"
    assert ns["gone"], "after `del error` nothing may keep them: the observer kept its frames"
    assert world.cuda.devices[0].allocated == 0


def test_each_failed_attempt_in_a_loop_is_released_when_its_except_block_ends(world, no_gc):
    ns = world.shell.user_ns
    run(world.shell, "size, result = first_batch_that_fits([400, 200, 1])")
    assert ns["size"] == 1
    # When the second attempt fails, the first attempt's 8 GiB must be gone already.
    assert ns["left"] == [[True], [False, True]]
    assert [r() is not None for r in ns["alive"]] == [False, False, True]
    assert world.cuda.devices[0].allocated == 9 * GiB  # the attempt that fit, nothing more
    run(world.shell, "del result")
    assert world.cuda.devices[0].allocated == 0


def test_an_error_kept_in_a_local_of_the_function_that_caught_it_is_pythons_cycle(no_gc):
    # What the tutorial teaches, checked in plain Python: an exception kept in a local of the
    # function that caught it refers to that function's frame through its traceback, and the
    # frame refers back to it: a cycle only the garbage collector frees. Keep ``str(e)``.
    def step() -> None:
        acts = Activation()
        alive.append(weakref.ref(acts))
        raise MemoryError("out of memory")

    def kept_error() -> None:
        try:
            step()
        except MemoryError as e:
            saved = e  # noqa: F841

    def kept_text() -> None:
        try:
            step()
        except MemoryError as e:
            saved = str(e)  # noqa: F841

    alive: list[weakref.ref[Activation]] = []
    kept_error()
    kept_text()
    assert [r() is not None for r in alive] == [True, False]
    gc.collect()
    assert alive[0]() is None


def test_an_unloaded_monitor_that_is_still_referenced_keeps_no_failed_cells_frames(world):
    # The harness of benchmarks/gpu_diagnosis.py met this on the H200: after %unload_ext and
    # every record the shell keeps was dropped, 137 GiB of a failed step stayed allocated
    # while the old monitor (still reachable) held the cell's exception it had noted.
    from gpumem_nb.kernel import current_monitor

    run(world.shell, "def step():\n    acts = cuda.tensor(8 * GiB)\n"
                     "    alive.append(weakref.ref(acts))\n    raise ValueError('nan')\nstep()")
    old = current_monitor(world.shell)
    assert old.last_cell_exception.error is not None
    run(world.shell, "%unload_ext gpumem_nb")
    for name in ("last_exc", "last_type", "last_value", "last_traceback"):
        if hasattr(sys, name):
            delattr(sys, name)
    world.shell.InteractiveTB.tb = None
    world.shell.last_execution_result = None
    gc.collect()
    assert world.shell.user_ns["alive"][-1]() is None, "the unloaded monitor kept the frames"
    assert world.cuda.devices[0].allocated == 0
    del old
