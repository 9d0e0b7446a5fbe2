"""Tab completion of ``%gpumem`` and ``%%gpumem``: subcommands, then the flags and choices of
the one typed, read from the parsers themselves.

Registered through IPython's ``complete_command`` hook, keyed on the magic's name, as
IPython's own ``%run`` and ``%cd`` completers are; without it ``%gpumem hi<TAB>`` offered
IPython's ``%hist``.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from .commands import build_cell_parser, build_line_parser
from .grammar import subparsers

__all__ = ["KEYS", "complete", "register", "unregister"]

HOOK = "complete_command"
KEYS = ("%gpumem", "%%gpumem")
_MARK = "_gpumem_nb_completer"  # found again at unload, whichever load registered it
_LINE = build_line_parser()
_CELL = build_cell_parser()


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an open quote: the words so far, as typed
        return text.split()


def _options(parser: argparse.ArgumentParser, previous: str | None) -> list[str]:
    """The words ``parser`` takes next: the choices of the flag just typed, else its
    positional choices and its flags."""
    for action in parser._actions:
        if previous in action.option_strings and action.choices is not None:
            return [str(c) for c in action.choices]
    positional = [str(c) for a in parser._actions if not a.option_strings and a.choices
                  for c in a.choices]
    return [*positional, *(f for a in parser._actions for f in a.option_strings), "-h"]


def complete(shell: Any, event: Any) -> list[str]:
    """IPython's custom completer: the words that may come where the cursor is."""
    before = getattr(event, "text_until_cursor", "") or getattr(event, "line", "")
    words = _words(before)
    if not words:
        return []
    typing = not before[-1:].isspace()
    done = words[1:-1] if typing else words[1:]  # the words after the magic's name
    if words[0].startswith("%%"):
        return _options(_CELL, done[-1] if done else None)
    if not done:
        return list(subparsers(_LINE))
    sub = subparsers(_LINE).get(done[0])
    if sub is None:
        return []
    return _options(sub, done[-1] if len(done) > 1 else None)


setattr(complete, _MARK, True)


def register(shell: Any) -> None:
    """Add the completer for both magics; once, however many times the extension loads."""
    unregister(shell)
    set_hook = getattr(shell, "set_hook", None)
    if callable(set_hook):
        for key in KEYS:
            set_hook(HOOK, complete, str_key=key)


def unregister(shell: Any) -> None:
    """Take every completer of ours out of IPython's dispatch (a completer is kept there
    as a method bound to the shell, so it is found by its function's mark)."""
    dispatch = getattr(shell, "strdispatchers", {}).get(HOOK)
    if dispatch is None:
        return
    for key in KEYS:
        chain = getattr(dispatch, "strs", {}).get(key)
        if chain is None:
            continue
        chain.chain = [(p, f) for p, f in chain.chain
                       if not getattr(getattr(f, "__func__", f), _MARK, False)]
        if not chain.chain:
            del dispatch.strs[key]
