"""Run a function once a module has finished importing, without importing it.

``%gpumem record on`` before ``import torch`` must begin recording as CUDA starts, and the
cell that imports torch is often the cell that starts CUDA: a check at the next cell's start
would come too late. A finder at the front of ``sys.meta_path`` sees torch's import begin,
lets the rest of the import system find it, and runs the function right after torch's own
``__init__`` has run, before the importing statement returns.

Only the spec's loader instance is touched (its ``exec_module``, for that one call); the
finder leaves ``sys.meta_path`` when it has fired or is closed. Nothing here raises into the
user's import: the function's errors are swallowed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import threading
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["AfterImport"]


class AfterImport:
    """Calls ``fn()`` once, right after the top-level module ``name`` has executed."""

    def __init__(self, name: str, fn: Callable[[], Any]) -> None:
        self.name = name
        self.fn: Callable[[], Any] | None = fn
        self._finding = threading.local()

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def close(self) -> None:
        self.fn = None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)

    @property
    def installed(self) -> bool:
        return self in sys.meta_path

    # importlib's finder protocol
    def find_spec(self, fullname: str, path: Any = None, target: Any = None
                  ) -> ModuleSpec | None:
        if fullname != self.name or self.fn is None or getattr(self._finding, "on", False):
            return None
        self._finding.on = True
        try:
            spec = importlib.util.find_spec(fullname)  # the other finders (this one declines)
        except Exception:
            return None
        finally:
            self._finding.on = False
        loader: Any = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if spec is None or exec_module is None:
            return None

        def exec_then_fire(module: ModuleType) -> None:
            with contextlib.suppress(AttributeError):
                del loader.exec_module  # the loader's own method again
            exec_module(module)  # the import's errors are the user's: not caught
            self._fire()

        try:
            loader.exec_module = exec_then_fire
        except (AttributeError, TypeError):
            return None  # a loader that takes no attribute: left to the next cell's check
        return spec

    def _fire(self) -> None:
        fn = self.fn
        self.close()
        if fn is not None:
            with contextlib.suppress(BaseException):
                fn()
