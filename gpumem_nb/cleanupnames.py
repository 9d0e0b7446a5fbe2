"""The shell's names as cleanup sees them: which are the user's to delete (and why the others
are the shell's), and the output cache (``Out``, ``_``, ``_N``): cleared as IPython's own flush
would, minus its two faults, keeping what the user assigned.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .holders import (
    INPUT_ALIAS,
    OUTPUT_ALIAS,
    SHELL_NAMES,
    UNDERS,
    alias_order,
    output_cache_names,
)

__all__ = ["check_vars", "shell_owned"]


def _hidden(shell: Any) -> dict[str, Any]:
    hidden = getattr(shell, "user_ns_hidden", None)
    return hidden if isinstance(hidden, dict) else {}


def _out(shell: Any) -> dict[int, Any]:
    oh = shell.user_ns.get("_oh")
    return oh if isinstance(oh, dict) else {}


def shell_owned(name: str, shell: Any) -> str | None:
    """Why ``name`` is the shell's and not the user's, or None when it is the user's."""
    ns = shell.user_ns
    if name in SHELL_NAMES:
        return f"{SHELL_NAMES[name]}; deleting it would break the shell"
    hidden = _hidden(shell)
    hook = getattr(shell, "displayhook", None)
    if OUTPUT_ALIAS.match(name) and name in output_cache_names(
            {name: ns[name]}, _out(shell), hidden, hook):
        return "output cache; --out clears it"
    if name in hidden and hidden[name] is ns[name]:
        if INPUT_ALIAS.match(name):
            return "input history"
        return "own: set by the shell or an extension, not by you"
    return None


def check_vars(names: Sequence[str], shell: Any) -> list[str]:
    """The names to delete, each once, after refusing unknown names and the shell's own.
    Raises ValueError before anything is touched."""
    unique = list(dict.fromkeys(names))
    missing = [n for n in unique if n not in shell.user_ns]
    refused = [f"{n!r} is IPython's {why}" for n in unique if n not in missing
               and (why := shell_owned(n, shell)) is not None]
    problems = []
    if missing:
        problems.append(f"no variable named {', '.join(repr(m) for m in missing)} "
                        "in this session")
    problems += refused
    if problems:
        raise ValueError("; ".join(problems) + "; nothing was cleaned")
    return unique


# -- the output cache --------------------------------------------------------------------------
@dataclass(frozen=True)
class _OutputPlan:
    entries: int
    clear: list[str]  # `_`-names the cache wrote and still owns
    kept: list[str]  # `_`-names the user assigned


def _plan_output(shell: Any) -> _OutputPlan | None:
    hook = getattr(shell, "displayhook", None)
    if not getattr(hook, "do_full_cache", False):
        return None
    ns = shell.user_ns
    owned = output_cache_names(ns, _out(shell), _hidden(shell), hook)
    # Exact strs: a str subclass's `__hash__`/`__eq__` would run below (A4).
    aliases = [k for k in ns if type(k) is str and OUTPUT_ALIAS.match(k)]
    # A blank under is IPython's placeholder, whoever wrote it (``type is str``: a user's
    # object's own ``__eq__`` is never called).
    kept = [k for k in aliases if k not in owned
            and not (k in UNDERS and type(ns[k]) is str and ns[k] == "")]
    return _OutputPlan(entries=len(_out(shell)), clear=sorted(owned, key=alias_order),
                       kept=sorted(kept, key=alias_order))


def _clear_output(shell: Any, plan: _OutputPlan) -> None:
    """What ``displayhook.flush()`` does, minus its two faults: it deletes every ``_N`` and
    blanks ``_``, ``__``, ``___`` even when the user assigned them."""
    ns = shell.user_ns
    hidden = _hidden(shell)
    for name in plan.clear:
        if name in UNDERS:
            ns[name] = ""
        else:
            ns.pop(name, None)
    # The shell's own records of what it wrote: they would keep the old outputs alive.
    for key in [k for k in hidden if type(k) is str and OUTPUT_ALIAS.match(k)]:
        if key in UNDERS:
            hidden[key] = ""
        else:
            del hidden[key]
    hook = shell.displayhook
    for name in UNDERS:
        with contextlib.suppress(Exception):
            setattr(hook, name, "")
    _out(shell).clear()
    result = getattr(shell, "last_execution_result", None)
    if result is not None and getattr(result, "result", None) is not None:
        result.result = None


def _output_text(plan: _OutputPlan, dry_run: bool) -> str:
    verb, keep = ("would clear", "would keep") if dry_run else ("cleared", "kept")
    text = f"{verb} {plan.entries} Out entries"
    if plan.clear:
        text += f" and {', '.join(plan.clear)}"
    if plan.kept:
        text += f"; {keep} {', '.join(plan.kept)} (yours)"
    return text
