"""Shared test helpers."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import IPython
import pytest

# Colab's IPython: the suite runs on it too (tools/version_matrix.sh). A test skipped there
# names what IPython 7 itself cannot do, never what gpumem_nb does not.
IPYTHON_7 = IPython.version_info < (8,)


def ipython_8_for(why: str) -> Any:
    """Skip on IPython 7, for a reason that lies in IPython 7 itself."""
    return pytest.mark.skipif(IPYTHON_7, reason=f"IPython 7 itself {why}")

# Wall-clock checks in tests are hang guards, not benchmarks: the budget each names is what the
# benchmarks measure (benchmarks/), and one slack factor absorbs a loaded 2-core machine. A
# guard against a known blow-up (a quadratic path that took 11 s) keeps its own bound, below
# the blow-up, without the factor.
SLACK = float(os.environ.get("GPUMEM_TEST_SLACK", "5"))


def hang_guard(budget_s: float) -> float:
    """What a test allows for work whose benchmarked budget is ``budget_s``."""
    return budget_s * SLACK


def wait_until(predicate: Callable[[], object], timeout_s: float = 3.0) -> bool:
    """Whether ``predicate`` came true within ``timeout_s``, polled: how a test waits for
    another thread (a sleep of a guessed length races it on a loaded machine). The deadline
    is a hang guard, so it is generous: a true predicate returns at once."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            return bool(predicate())
        time.sleep(0.01)
    return True


def spaced(ip: Any) -> None:
    """What the seconds between two cells bring: the sampler's next reading.

    The hooks never read NVML; a cell's NVML "after" figures, and any verdict that needs
    them, come from the sampler's first reading after the cell. A real session gets it a
    moment after every cell; back-to-back ``run_cell`` calls must take it explicitly.
    """
    monitor = getattr(ip, "_gpumem_nb_monitor", None)
    if monitor is not None and monitor.sampler.running:
        monitor.sampler.tick()


def run(ip: Any, source: str, cell_id: str | None = None) -> Any:
    """One cell, back to back with the next (a Run All): no sampler reading in between."""
    return ip.run_cell(source, store_history=True, cell_id=cell_id)


def run_spaced(ip: Any, source: str, cell_id: str | None = None) -> Any:
    """One cell as people run it: with time after it for the sampler's next reading."""
    result = run(ip, source, cell_id)
    spaced(ip)
    return result


def magic(ip: Any, line: str) -> Any:
    """``%gpumem LINE``, its result returned."""
    return ip.run_line_magic("gpumem", line)


def whatif(ip: Any, line: str) -> Any:
    """``%gpumem whatif LINE``."""
    return ip.run_line_magic("gpumem", "whatif " + line)


def notebook_module(stem: str) -> Any:
    """A module of ``notebooks/`` that the tutorials import (claims.py, fresh_process.py),
    loaded from its file: the folder is no package."""
    from pathlib import Path

    return _module_at(Path(__file__).resolve().parent.parent / "notebooks" / f"{stem}.py")


def tutorial_tool(stem: str) -> Any:
    """A module of ``tools/tutorials/`` (the runner, plotly_pictures.py), loaded from its file:
    the folder is no package, and its tools run as scripts."""
    from pathlib import Path

    return _module_at(Path(__file__).resolve().parent.parent / "tools" / "tutorials"
                      / f"{stem}.py")


def _module_at(path: Any) -> Any:
    import importlib.util

    stem = path.stem
    spec = importlib.util.spec_from_file_location(stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def replay_gpus_named(shell: Any, path: Any, names: list[str], *, samples: int = 10,
                      note: str = "") -> Any:
    """``%gpumem watch --replay`` of the bundled recording's first ``samples`` readings, its
    GPU copied once per name in ``names`` and named so; the monitor, one reading played."""
    import dataclasses

    from gpumem_nb.kernel import current_monitor
    from gpumem_nb.sources.replay import load_trace, write_trace

    def renamed(s: Any) -> Any:
        d = s.devices[0]
        return dataclasses.replace(s, devices=tuple(
            dataclasses.replace(d, index=i, nvml=dataclasses.replace(d.nvml, name=name))
            for i, name in enumerate(names)))

    write_trace(path, [renamed(s) for s in load_trace(None)[0][:samples]], note=note)
    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    shell.run_cell(f"%gpumem watch --replay {path}", store_history=True)
    mon = current_monitor(shell)
    mon.replay.sampler.stop()
    mon.replay.sampler.tick()
    return mon


def in_fresh_interpreter(script: str, payload: Any = None, timeout_s: float = 120.0) -> Any:
    """Run ``script`` in a fresh Python that reads ``payload`` as JSON from ``sys.stdin`` and
    prints its answer as JSON on its last line. For a check that needs nbformat or nbconvert:
    imported here, their 170,000 objects (jsonschema's format grammars) would stay in the
    suite's process, and every later cleanup, OOM explanation and retention search walks them."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", script], input=json.dumps(payload),
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def needs_installed(*names: str) -> None:
    """``pytest.importorskip`` without the import: skip unless every module is installed."""
    import importlib.util

    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")
