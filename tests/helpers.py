"""Shared test helpers."""

from __future__ import annotations

from typing import Any


def spaced(ip: Any) -> None:
    """What the seconds between two cells bring: the sampler's next reading.

    The hooks never read NVML; a cell's NVML "after" figures, and any verdict that needs
    them, come from the sampler's first reading after the cell. A real session gets it a
    moment after every cell; back-to-back ``run_cell`` calls must take it explicitly.
    """
    monitor = getattr(ip, "_gpumem_nb_monitor", None)
    if monitor is not None and monitor.sampler.running:
        monitor.sampler.tick()


def whatif(ip: Any, line: str) -> Any:
    """``%gpumem whatif LINE``."""
    return ip.run_line_magic("gpumem", "whatif " + line)


def notebook_module(stem: str) -> Any:
    """A module of ``notebooks/`` (the runner, claims.py, plotly_pictures.py), loaded from its
    file: the folder is no package, and its tools run as scripts."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "notebooks" / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
