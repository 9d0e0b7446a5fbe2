"""The suite's check that each test leaves the process as it found it (``tests/leaks.py``):
each kind of leftover is named, and taken back so that the next test starts clean. Each test
here leaves something on purpose and takes it back itself, before the autouse check runs."""

from __future__ import annotations

import gc
import sys
import threading
from typing import Any

from . import leaks


def _left(before: leaks.State) -> list[str]:
    found = leaks.leaks(before)
    assert leaks.clean_up(found) == []
    return [leak.what for leak in found]


def test_a_gc_callback_left_by_a_test_is_named_and_removed():
    before = leaks.snapshot()

    def callback(phase: str, info: dict[str, Any]) -> None:
        pass

    gc.callbacks.append(callback)
    (what,) = _left(before)
    assert what.startswith("gc.callbacks entry") and "callback" in what
    assert callback not in gc.callbacks
    assert _left(before) == []


def test_a_gc_window_of_the_product_left_open_is_named():
    from gpumem_nb.oom.gcwindow import Collections

    before = leaks.snapshot()
    Collections(lambda: 0, generation=1).start()
    (what,) = _left(before)
    assert "Collections" in what
    assert not [c for c in gc.callbacks if isinstance(c, Collections)]


def test_the_collector_left_disabled_or_frozen_is_named_and_restored():
    before = leaks.snapshot()
    gc.disable()
    gc.freeze()
    assert sorted(_left(before)) == ["gc.freeze is True, was False",
                                     "gc.isenabled is False, was True"]
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_trace_function_or_excepthook_left_installed_is_named_and_restored():
    was_hook = sys.excepthook
    before = leaks.snapshot()

    def tracer(*args: Any) -> None:
        return None

    def hook(*args: Any) -> None:
        pass

    threading.settrace(tracer)
    sys.excepthook = hook
    try:
        left = _left(before)
    finally:
        sys.excepthook = was_hook
        threading.settrace(None)  # type: ignore[arg-type]
    assert len(left) == 2 and any(w.startswith("threading.settrace is") for w in left) and \
        any(w.startswith("sys.excepthook is") for w in left), left
    assert sys.excepthook is was_hook and threading.gettrace() is None


def test_a_thread_the_product_left_running_is_named_and_one_that_ends_is_not(monkeypatch):
    monkeypatch.setattr(leaks, "THREAD_END_WAIT_S", 0.05)
    release = threading.Event()
    before = leaks.snapshot()
    stuck = threading.Thread(target=release.wait, name="gpumem_nb-sampler", daemon=True)
    ending = threading.Thread(target=lambda: None, name="gpumem_nb-read", daemon=True)
    other = threading.Thread(target=release.wait, name="a library's daemon", daemon=True)
    for t in (stuck, ending, other):
        t.start()
    try:
        assert _left(before) == ["thread 'gpumem_nb-sampler' (daemon=True) still running"]
    finally:
        release.set()
        stuck.join()
        other.join()
    assert _left(before) == []


def test_an_ipython_callback_or_a_loaded_extension_left_in_the_shell_is_named_and_undone(
        shell, no_gpu):
    before = leaks.snapshot()
    shell.run_cell("%load_ext gpumem_nb")

    def after(result: Any) -> None:
        pass

    shell.events.register("post_run_cell", after)
    left = _left(before)
    assert "the extension still loaded in the shell" in left, left
    assert any("post_run_cell callback" in w and "after" in w for w in left), left
    assert getattr(shell, "_gpumem_nb_monitor", None) is None
    assert after not in shell.events.callbacks["post_run_cell"]
    assert _left(before) == []


def test_a_stand_in_torch_left_in_sys_modules_is_named_and_taken_out():
    """A later `pytest.importorskip("torch")` returned another test's stand-in (random order,
    seed 20261207): the DLPack capsule test then failed on a fake."""
    import types

    was = sys.modules.get("torch")
    before = leaks.snapshot()
    sys.modules["torch"] = types.ModuleType("torch")
    try:
        (what,) = _left(before)
        assert what.startswith("sys.modules['torch'] is <module 'torch'")
        assert sys.modules.get("torch") is was
        assert _left(before) == []
    finally:
        if was is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = was
