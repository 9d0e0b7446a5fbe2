"""The tutorials' prose, checked by the cells that measure it.

A sentence such as "reserved fell to 0 B" is only true on the GPU and torch where the notebook
ran. Each code cell that measures something the text then states ends with the claim it
supports::

    claim(reserved_after == 0, "empty_cache() gave every cached byte back",
          reserved=fmt(reserved_after))

A claim that holds prints one line starting with ``✓``, so a reader sees what was checked. One
that does not raises ``ClaimFailed`` with the sentence and the measured values: executing the
notebook on a GPU or a torch that behaves differently then stops at that cell, instead of saving
a tutorial whose text its own outputs contradict. ``run_tutorials.py`` names the claim and the
cell.

With ``TUTORIAL_CLAIMS=report`` in the environment a failed claim prints a line starting with
``✗ CLAIM FAILED`` and the notebook goes on: a first run on a new machine then lists every
claim to revisit at once. Saved tutorials are executed in the default, strict mode.

This module is deliberately independent of gpumem_nb: the checks must not share the code they
check.
"""

from __future__ import annotations

import os
import sys
from typing import Any

FAILED_MARK = "✗ CLAIM FAILED"
HELD_MARK = "✓"


class ClaimFailed(AssertionError):
    """The run contradicts a sentence of the tutorial."""


def claim(holds: Any, says: str, **measured: Any) -> None:
    """Check one sentence of the prose against this run: ``holds`` must be true.

    ``says`` is the sentence as the text states it; ``measured`` are the values it rests on,
    as the reader would want to see them (formatted sizes, counts), shown when it fails.
    """
    if holds:
        print(f"{HELD_MARK} {says}")
        return
    values = ", ".join(f"{k} = {v}" for k, v in measured.items()) or "(no values given)"
    text = (f"The tutorial says: {says}\nThis run measured: {values}\n"
            "Either the text is wrong, or this GPU / torch behaves differently: find out which "
            "before saving the notebook.")
    if os.environ.get("TUTORIAL_CLAIMS") == "report":
        print(f"{FAILED_MARK}: {says} ({values})")
        print(f"{FAILED_MARK}: {says} ({values})", file=sys.stderr)
        return
    raise ClaimFailed(text)


def near(a: float, b: float, *, within: float = 0.0, rel: float = 0.0) -> bool:
    """``a`` and ``b`` differ by at most ``within`` (absolute) or ``rel`` of the larger one."""
    return abs(a - b) <= max(within, rel * max(abs(a), abs(b)))
