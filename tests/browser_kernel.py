"""Runs inside the Jupyter kernel that the browser tests drive, from an IPython startup file.

Two jobs, both switched on by files in the kernel's working directory (the test's notebook
folder), so each test's kernel is set up independently while one JupyterLab serves them all:

- error capture (always): every way an exception can happen out of the user's sight is written,
  one JSON object per line, to ``kernel-errors-<pid>.jsonl`` in that folder:
  * any log record at ERROR or above from any logger (the ``Comm`` manager logs exceptions raised
    in ipywidgets message handlers this way; ipykernel and traitlets log through ``logging``
    too), and any WARNING from ``gpumem_nb`` (its contained failures);
  * ``InteractiveShell.showtraceback`` (ipywidgets' callback dispatcher reports a failing
    ``on_click`` through it; it also stores the exception in ``sys.last_value``), tagged with
    whether a cell was running on this thread, so a test can tell a cell's own error apart;
  * ``sys.excepthook`` and ``threading.excepthook`` (a dying sampler thread);
  * a new ``sys.last_value`` that no cell raised, seen by a poller, so it is caught even when
    whatever set it bypassed every hook above.
  Nothing is swallowed: each hook records, then calls what it replaced, so the user-visible
  behaviour (JupyterLab's log console included) is exactly what it would be without it.
- fakes (when ``gpumem-fakes.json`` is there): torch and pynvml replaced by the test fakes of
  two H200s with clearly different allocations, before the notebook loads the extension.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ERRORS_GLOB = "kernel-errors-*.jsonl"
FAKES_FILE = "gpumem-fakes.json"


class _Recorder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.cell_thread: int | None = None  # the thread running a top-level cell, if any
        self.cell_errors: set[int] = set()  # id() of exceptions raised by cells

    def write(self, channel: str, text: str, **extra: Any) -> None:
        entry = {"channel": channel, "text": text, "t_s": time.time(),
                 "thread": threading.current_thread().name, **extra}
        with self._lock, open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")


def _format(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _install_logging(rec: _Recorder) -> None:
    original = logging.Logger.handle

    def handle(self: logging.Logger, record: logging.LogRecord) -> None:
        ours = record.name.split(".")[0] == "gpumem_nb"
        if record.levelno >= logging.ERROR or (ours and record.levelno >= logging.WARNING):
            try:
                text = record.getMessage()
            except Exception:
                text = str(record.msg)
            # gpumem_nb logs a contained failure without exc_info, from inside the except
            # block: the exception being handled is then the one to show.
            exc = record.exc_info[1] if record.exc_info else sys.exc_info()[1]
            if exc is not None:
                text += "\n" + _format(exc)
            rec.write("log", text, logger=record.name, level=record.levelname)
        original(self, record)

    logging.Logger.handle = handle  # type: ignore[method-assign]


def _install_hooks(rec: _Recorder) -> None:
    previous_excepthook = sys.excepthook

    def excepthook(tp: Any, value: BaseException, tb: Any) -> None:
        rec.write("sys.excepthook", _format(value))
        previous_excepthook(tp, value, tb)

    sys.excepthook = excepthook
    previous_thread_hook = threading.excepthook

    def thread_hook(args: Any) -> None:
        name = args.thread.name if args.thread is not None else "?"
        rec.write("threading.excepthook", f"thread {name}:\n" + _format(args.exc_value))
        previous_thread_hook(args)

    threading.excepthook = thread_hook


def _install_shell_hooks(rec: _Recorder, shell: Any) -> None:
    def pre_run_cell(info: Any) -> None:
        rec.cell_thread = threading.get_ident()

    def post_run_cell(result: Any) -> None:
        err = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        if err is not None:
            rec.cell_errors.add(id(err))
        rec.cell_thread = None

    shell.events.register("pre_run_cell", pre_run_cell)
    shell.events.register("post_run_cell", post_run_cell)
    original = shell.showtraceback

    def showtraceback(*args: Any, **kwargs: Any) -> Any:
        exc = sys.exc_info()[1]
        in_cell = rec.cell_thread == threading.get_ident()
        if in_cell and exc is not None:
            rec.cell_errors.add(id(exc))
        rec.write("showtraceback", _format(exc) or "showtraceback() without an exception",
                  in_cell=in_cell)
        return original(*args, **kwargs)

    shell.showtraceback = showtraceback


def _poll_last_value(rec: _Recorder) -> None:
    seen = getattr(sys, "last_value", None)
    while True:
        time.sleep(0.2)
        value = getattr(sys, "last_value", None)
        if value is not None and value is not seen:
            seen = value
            # A cell's own error is the user's; only report what no cell raised. The cell's
            # post_run_cell hook may lag the assignment a little, so look again shortly.
            time.sleep(0.3)
            if id(value) not in rec.cell_errors:
                rec.write("sys.last_value", _format(value))


def install_error_capture(folder: Path, shell: Any) -> None:
    rec = _Recorder(folder / f"kernel-errors-{os.getpid()}.jsonl")
    rec.path.touch()
    _install_logging(rec)
    _install_hooks(rec)
    _install_shell_hooks(rec, shell)
    threading.Thread(target=_poll_last_value, args=(rec,), name="last-value-poller",
                     daemon=True).start()


def install_two_fake_gpus() -> Any:
    """Two H200s; torch is up. Cells allocate on them through ``torch.cuda.tensor``."""
    from gpumem_nb.kernel import monitor as monitor_mod
    from gpumem_nb.sources.live import LiveSource
    from gpumem_nb.sources.nvml import NvmlSource

    from .fakes import FakeCuda, FakeCudaDevice, FakeGpu, FakePynvml, fake_torch

    gpus = [FakeGpu("GPU-a"), FakeGpu("GPU-b", bus_id="00000000:3B:00.0")]
    cuda = FakeCuda([FakeCudaDevice("a"), FakeCudaDevice("b", bus=0x3B)], initialized=True)
    cuda.link(gpus)
    sys.modules["torch"] = fake_torch(cuda)
    nvml = FakePynvml(gpus)
    monitor_mod.make_source = lambda: LiveSource(nvml=NvmlSource(module=nvml))  # type: ignore
    return cuda


def install(folder: str | Path | None = None) -> None:
    """Called by the startup file with the kernel's working directory."""
    from IPython import get_ipython

    here = Path(folder) if folder is not None else Path.cwd()
    shell = get_ipython()
    install_error_capture(here, shell)
    if (here / FAKES_FILE).exists():
        world = json.loads((here / FAKES_FILE).read_text())
        if world.get("gpus") == 2:
            install_two_fake_gpus()
