"""The failure log: each kind of failure in the engine logged once, never raised.

Hooks never raise: IPython prints a traceback for every cell whose callback fails, so each
hook body is contained and its error logged here, once per kind.
"""

from __future__ import annotations

import logging

from .. import userexc

__all__ = ["FailureLog", "log"]

log = logging.getLogger("gpumem_nb")


class FailureLog:
    """What failed, by kind: ``contain`` logs a kind the first time it is seen."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def contain(self, where: str, e: BaseException) -> None:
        # Keyed by the kind of failure, not its text: a message carrying a timestamp would
        # otherwise print a new "reported once" line in every cell.
        # The error may be a user's (a listener's, a hostile object's): its text is read
        # through userexc, never by logging (which would run its __str__ unguarded).
        key = f"{where}: {userexc.type_name(e)}"
        if key not in self.seen:
            self.seen.add(key)
            log.warning("gpumem_nb %s failed (reported once): %s", where, userexc.text(e))
