"""The text IPython compiles for a cell run from code (``%%gpumem``'s body), seen where
IPython's input transforms end: a traced cell's lines are labelled from it (``celltext``)."""

from __future__ import annotations

from types import TracebackType
from typing import Any

__all__ = ["CompiledText"]


class CompiledText:
    """While entered, an input transformer of the shell's own kind, run after IPython's and
    returning the lines unchanged, keeps the first cell's text it is given: the text that
    cell is compiled from (a cell run inside it is not the one traced)."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.text: str | None = None
        self._posts: list[Any] | None = None
        self._hook = self._see  # one bound method, found again by identity

    def _see(self, lines: list[str]) -> list[str]:
        if self.text is None:
            self.text = "".join(lines)
        return lines

    def seen(self) -> str | None:
        return self.text

    def __enter__(self) -> CompiledText:
        posts = getattr(self.shell, "input_transformers_post", None)
        if isinstance(posts, list):  # a shell without the hook: labels come from linecache
            posts.append(self._hook)
            self._posts = posts
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        posts, self._posts = self._posts, None
        if posts is not None:
            for i in range(len(posts) - 1, -1, -1):
                if posts[i] is self._hook:
                    del posts[i]
                    break
