"""Byte formatting, size parsing and printable text, shared by every display and by argument
parsing."""

from __future__ import annotations

import math
import re

__all__ = [
    "ECHO_CHARS",
    "MAX_NAME_CHARS",
    "cut",
    "echo_cut",
    "format_bytes",
    "parse_size",
    "printable",
    "quoted",
    "shown_name",
]

_BINARY = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


# Sizes from this far up are shown as a bound: they come from junk (a history entry of
# 10**400 bytes), and printing them exactly would overflow float or Python's int-to-text
# limit (4300 digits).
_HUGE = 1 << 80


def format_bytes(n: int | float | None, *, signed: bool = False) -> str:
    """Human-readable binary size: ``1.49 GiB``; ``—`` for unknown (or not a number). Never
    raises, whatever the size."""
    if n is None or isinstance(n, bool) or not isinstance(n, int | float) or (
            isinstance(n, float) and not math.isfinite(n)):
        return "—"
    sign = ""
    if n < 0:
        sign, n = "-", -n
    elif signed:
        sign = "+"
    if n >= _HUGE:
        return f"{sign}more than 1 YiB"
    for unit, scale in _BINARY:
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{n:g} B" if isinstance(n, float) else f"{sign}{n} B"


# A refused value is echoed this far, then "…": a 100,000-character argument must not come
# back whole in the error (the magic's, the settings' and ipython_config.py's alike).
ECHO_CHARS = 80


def echo_cut(text: str, limit: int = ECHO_CHARS) -> str:
    """An echoed value: ``limit`` characters, then "…"."""
    return text if len(text) <= limit else text[:limit] + "…"


def quoted(text: str) -> str:
    """User text in a message: quoted, control characters (a NUL) escaped, long text cut."""
    return echo_cut(repr(text[: ECHO_CHARS + 1]) if len(text) > ECHO_CHARS else repr(text))


def parse_size(text: str) -> int:
    """Parse ``512MB``, ``2GiB``, ``1e9``, ``64 MiB`` into bytes.

    Decimal units (MB, GB) are powers of 1000 and binary units (MiB, GiB) powers of 1024, as
    their names say. Raises ``ValueError`` with a plain sentence for anything else.
    """
    m = _SIZE_RE.match(text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(
            f"{quoted(text)} is not a size; write it like 512MB, 2GiB or 1e9 (bytes)"
        )
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(value):  # 1e400 reads as inf, and int(inf) raises OverflowError
        raise ValueError(f"{quoted(text)} is too large a size")
    return int(value)


# What must not reach a terminal or a plain-text output raw: C0 and C1 controls (a clear-screen
# escape, a bell, a newline forging a row of its own), DEL, the bidirectional overrides and
# isolates that make text read backwards, the line and paragraph separators (a terminal or a
# notebook breaks the line there, as at a newline), lone surrogates (``print`` itself would
# raise), and the noncharacters U+FFFE and U+FFFF (no XML may hold them: an SVG picture or a
# saved notebook's page with one is broken).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029"
                          "\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]")


def cut(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, a cut one ending in "…"."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


# A GPU's name as shown: NVML's are shorter ("NVIDIA A100-SXM4-80GB MIG 3g.40gb" is 33), but a
# recording's can hold anything, and two names of 1 MiB made a 23 MB picture bundle, sent
# again at each change. 40 is what the cluster table keeps of a name.
MAX_NAME_CHARS = 40


def shown_name(name: str) -> str:
    """A GPU's name cut to ``MAX_NAME_CHARS`` and made printable, as every view shows it."""
    return printable(cut(name, MAX_NAME_CHARS))


def printable(text: str) -> str:
    """Text from outside (a process's command line, a worker's name or error) made safe to
    print: each control character written as its Python escape (``\\x1b``, ``\\n``,
    ``\\u202e``); everything else as is."""
    if not _UNPRINTABLE.search(text):
        return text
    return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], text)
