"""An exception's text, read once per cell: every part of gpumem_nb that looks at a failing
cell (its record, the OOM explainer, the launcher-refusal check) asks for ``str(exc)``, and an
exception's ``__str__`` is the user's code: it may be slow, count its calls, or raise.

Inside ``one_read_per_error()`` (the cell hooks) each exception's text is computed once and
shared; outside it, every call reads afresh. Nothing here holds an exception past the block.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from . import userexc

__all__ = ["error_str", "one_read_per_error"]

_memo = threading.local()


@contextlib.contextmanager
def one_read_per_error() -> Iterator[None]:
    outer = getattr(_memo, "texts", None)
    if outer is None:
        _memo.texts = {}
    try:
        yield
    finally:
        if outer is None:
            _memo.texts = None  # the exceptions (and their frames) are not kept


def error_str(exc: BaseException) -> str:
    """``str(exc)`` as a plain ``str``, or "" when its ``__str__`` raises anything (a
    ``SystemExit`` from it would end the kernel) or returns no text: an odd exception
    must neither lose its cell's record nor stop its OOM from being explained."""
    texts: dict[int, tuple[BaseException, str]] | None = getattr(_memo, "texts", None)
    if texts is not None:
        hit = texts.get(id(exc))
        if hit is not None and hit[0] is exc:
            return hit[1]
    text = userexc.text(exc)  # any BaseException from __str__ contained; a plain str
    if texts is not None:
        texts[id(exc)] = (exc, text)
    return text
