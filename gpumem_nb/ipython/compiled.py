"""The text IPython compiles for each cell, seen where IPython's input transforms end: cells'
lines are labelled from it (``celltext``). Installed for the extension's lifetime."""

from __future__ import annotations

import contextlib
from typing import Any

from ..celltext import CellTexts

__all__ = ["CompiledTexts"]


class CompiledTexts:
    """An input transformer of the shell's own kind, run after IPython's, that returns the
    lines unchanged (the same list) and keeps the text in ``texts``: the text each cell is
    compiled from, nested ``run_cell`` calls (a ``%%gpumem`` body) included."""

    def __init__(self, shell: Any, texts: CellTexts) -> None:
        self.shell = shell
        self.texts = texts
        self._posts: list[Any] | None = None  # the list it was put in
        self._hook = self._see  # one bound method, found again by identity

    def _see(self, lines: list[str]) -> list[str]:
        with contextlib.suppress(Exception):  # observing never stops a cell from running
            self.texts.add_lines(lines)
        return lines

    def install(self) -> None:
        posts = getattr(self.shell, "input_transformers_post", None)
        if isinstance(posts, list):  # a shell without the hook: cells are read from linecache
            if not any(t is self._hook for t in posts):
                posts.append(self._hook)
            self._posts = posts

    def remove(self) -> None:
        """Taken out of the list the shell holds now and of the one it was put in: user code
        may have rebound ``input_transformers_post`` (to a copy holding it) since."""
        posts, self._posts = self._posts, None
        current = getattr(self.shell, "input_transformers_post", None)
        for held in (current, posts):
            if isinstance(held, list):
                for i in range(len(held) - 1, -1, -1):
                    if held[i] is self._hook:
                        del held[i]
