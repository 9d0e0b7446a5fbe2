"""What a test may not leave behind in the process: the suite runs in one interpreter, so a gc
callback, a thread, a hook or an IPython callback one test leaves is found by a later one (a
gc window left open was counted by test_retention's window checks, but only in an order that
ran the leaking test first).

``snapshot()`` before a test and ``leaks(before)`` after it name what is new; ``clean_up``
takes it back, so that one leak fails one test and not every test after it. Cheap: it runs
around every test (``tests/conftest.py``), so it reads a few lists and no more unless
something changed.
"""

from __future__ import annotations

import gc
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

# The product names every thread it starts with this prefix (sampler, reads, start-up).
PRODUCT_THREAD_PREFIX = "gpumem_nb"
# A thread a test stopped may take a moment to end (a sampler's last tick, a read's join):
# waited for, polled, before it counts as left running.
THREAD_END_WAIT_S = 2.0
# Libraries that install a gc callback once for the life of the process, on first use:
# hypothesis times collections to leave them out of its deadline. Not a test's leak.
PROCESS_WIDE_GC_CALLBACKS = ("hypothesis.",)
# Import finders are watched only where ours: a library adds its own on first import, for the
# life of the process (importlib_metadata's, toolz's tlz), and taking one back broke every
# later test that reads entry points (jupyter_client's kernel provisioners).
OWN_FINDERS = ("gpumem_nb", "tests")
EVENTS = ("pre_execute", "pre_run_cell", "post_execute", "post_run_cell", "shell_initialized")

_FREEZE_BASELINE = gc.get_freeze_count()
_HOOKS: dict[str, Any] = {
    "sys.excepthook": lambda: sys.excepthook,
    "sys.displayhook": lambda: sys.displayhook,
    "sys.breakpointhook": lambda: sys.breakpointhook,
    "sys.settrace": sys.gettrace,
    "sys.setprofile": sys.getprofile,
    "threading.settrace": threading.gettrace,
    "threading.setprofile": threading.getprofile,
    # A test that disables the collector and fails before it enables it again leaves every
    # later test without automatic collections: gc windows stay open, cycles pile up.
    "gc.isenabled": gc.isenabled,
    "gc.get_threshold": gc.get_threshold,
    # Frozen objects are outside the generations gc.get_referrers reads: a freeze left on
    # hides referrers from the retention search ("unseen").
    # (Beyond the interpreter's own count: Python 3.12 reports a few hundred objects there with
    # no freeze, back after every collection.)
    "gc.freeze": lambda: gc.get_freeze_count() > _FREEZE_BASELINE,
    # A stand-in torch left in sys.modules (a test's fake, not the installed package) is what
    # a later test's `pytest.importorskip("torch")` returns: the DLPack capsule test failed in
    # a random order on one.
    "sys.modules['torch']": lambda: _stand_in(sys.modules.get("torch")),
}
# (sys.unraisablehook and threading.excepthook are pytest's own, swapped around each phase.)
_SETTERS: dict[str, Any] = {
    "sys.settrace": sys.settrace,
    "sys.setprofile": sys.setprofile,
    "threading.settrace": threading.settrace,
    "threading.setprofile": threading.setprofile,
    "gc.isenabled": lambda on: gc.enable() if on else gc.disable(),
    "gc.get_threshold": lambda t: gc.set_threshold(*t),
    "gc.freeze": lambda frozen: None if frozen else gc.unfreeze(),
    "sys.modules['torch']": lambda was: _put_torch_back(was),
}


def _stand_in(module: Any) -> Any:
    """The module under ``torch`` where it is not the installed package (no file of its own,
    or a file outside any install); None for the real one, or for none."""
    path = getattr(module, "__file__", None) if module is not None else None
    if module is None or (type(path) is str and ("site-packages" in path
                                                 or "dist-packages" in path)):
        return None
    return module


def _put_torch_back(was: Any) -> None:
    if was is None:
        if _stand_in(sys.modules.get("torch")) is not None:
            del sys.modules["torch"]
    else:
        sys.modules["torch"] = was


@dataclass
class State:
    gc_callbacks: list[Any]
    threads: set[threading.Thread]
    hooks: dict[str, Any]
    meta_path: list[Any]
    shell: Any = None  # the one InteractiveShell, where one was started
    events: dict[str, list[Any]] = field(default_factory=dict)


@dataclass
class Leak:
    what: str
    undo: Any  # a callable that takes it back


def _shell() -> Any:
    # Only where IPython is imported and a shell started: importing it here would cost.
    mod = sys.modules.get("IPython.core.interactiveshell")
    if mod is None or not mod.InteractiveShell.initialized():
        return None
    return mod.InteractiveShell.instance()


def _events(shell: Any) -> dict[str, list[Any]]:
    callbacks = getattr(getattr(shell, "events", None), "callbacks", {})
    return {e: list(callbacks.get(e, ())) for e in EVENTS}


def snapshot() -> State:
    shell = _shell()
    return State(gc_callbacks=list(gc.callbacks), threads=set(threading.enumerate()),
                 hooks={name: get() for name, get in _HOOKS.items()},
                 meta_path=list(sys.meta_path), shell=shell,
                 events=_events(shell) if shell is not None else {})


def _new(after: list[Any], before: list[Any]) -> list[Any]:
    return [x for x in after if not any(x is y for y in before)]


# An event loop's default executor names its workers "asyncio_N": idle pool threads the loop
# (a library's: the browser tests' server and kernel clients) owns until it is closed, made
# once per process, not a test's leftover.
_LOOP_WORKER = re.compile(r"asyncio_\d+")


def _watched(t: threading.Thread) -> bool:
    if t.name.startswith(PRODUCT_THREAD_PREFIX):
        return True
    return not t.daemon and not _LOOP_WORKER.fullmatch(t.name)


def leaks(before: State) -> list[Leak]:
    """What the test left that was not there before it, each with how to take it back."""
    found: list[Leak] = []
    for cb in _new(gc.callbacks, before.gc_callbacks):
        if getattr(cb, "__module__", "").startswith(PROCESS_WIDE_GC_CALLBACKS):
            continue
        found.append(Leak(f"gc.callbacks entry {cb!r}",
                          lambda cb=cb: _remove_all(gc.callbacks, cb)))
    for finder in _new(sys.meta_path, before.meta_path):
        if not type(finder).__module__.startswith(OWN_FINDERS):
            continue
        found.append(Leak(f"sys.meta_path entry {finder!r}",
                          lambda f=finder: _remove_all(sys.meta_path, f)))
    for name, get in _HOOKS.items():
        was, now = before.hooks[name], get()
        if now is not was and now != was and not _process_wide(now):
            found.append(Leak(f"{name} is {now!r}, was {was!r}",
                              lambda name=name, was=was: _restore(name, was)))
    found.extend(_ipython_leaks(before))
    found.extend(_thread_leaks(before))
    return found


# A debugger's hooks, set once per process when ipykernel 6 imports debugpy in a test's
# kernel machinery: a library's, as hypothesis's gc callback is, not a test's leftover.
_PROCESS_WIDE_HOOKS = ("debugpy", "_pydevd", "pydevd")


def _process_wide(hook: Any) -> bool:
    module = getattr(hook, "__module__", None)
    return type(module) is str and module.startswith(_PROCESS_WIDE_HOOKS)


def _ipython_leaks(before: State) -> list[Leak]:
    shell = before.shell
    if shell is None or _shell() is not shell:
        return []
    found: list[Leak] = []
    if getattr(shell, "_gpumem_nb_monitor", None) is not None:
        found.append(Leak("the extension still loaded in the shell", lambda: _unload(shell)))
    for event, callbacks in _events(shell).items():
        for cb in _new(callbacks, before.events.get(event, [])):
            found.append(Leak(f"IPython {event} callback {cb!r}",
                              lambda e=event, cb=cb: _unregister(shell, e, cb)))
    return found


def _thread_leaks(before: State) -> list[Leak]:
    new = [t for t in threading.enumerate() if t not in before.threads and _watched(t)]
    if not new:
        return []
    deadline = time.monotonic() + THREAD_END_WAIT_S
    for t in new:
        t.join(max(0.0, deadline - time.monotonic()))
    return [Leak(f"thread {t.name!r} (daemon={t.daemon}) still running", lambda: None)
            for t in new if t.is_alive()]


def _unregister(shell: Any, event: str, callback: Any) -> None:
    # Unloading the extension (taken back first) may have unregistered it already.
    if any(cb is callback for cb in shell.events.callbacks.get(event, ())):
        shell.events.unregister(event, callback)


def _remove_all(items: list[Any], x: Any) -> None:
    while any(y is x for y in items):
        items.remove(x)


def _restore(name: str, was: Any) -> None:
    setter = _SETTERS.get(name)
    if setter is not None:
        setter(was)
    else:
        setattr(sys, name.split(".", 1)[1], was)


def _unload(shell: Any) -> None:
    from gpumem_nb.ipython import extension

    if "gpumem_nb" in shell.extension_manager.loaded:
        shell.extension_manager.unload_extension("gpumem_nb")
    extension.unload(shell)


def clean_up(found: list[Leak]) -> list[str]:
    """Take back each leak; the ones that could not be, named."""
    failed = []
    for leak in found:
        try:
            leak.undo()
        except Exception as e:  # the next test's check says what is still there
            failed.append(f"{leak.what}: {type(e).__name__}: {e}")
    return failed
