"""A snapshot file's bytes before they are parsed, each bound counted in bytes first.

A 0.99 MB gzip file that unpacked to a 970 MiB JSON string took 2.9 GiB and 31 s, and was
accepted: the unpacked chunks were kept and then joined (two copies), ``json.loads`` made a
third, and the only bound on JSON counted its brackets. So:

- a gzip file is unpacked as a stream into one buffer, refused the moment it passes
  ``MAX_UNPACKED_BYTES``: no byte past the bound is ever held;
- a JSON text's memory once parsed is estimated from the text itself (its length and its
  brackets, commas and colons) and refused past ``MAX_JSON_MEMORY_BYTES`` before it is
  decoded or parsed;
- the bytes are let go before the parse, so the text is held once at a time.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from dataclasses import dataclass

from ..units import format_bytes
from .fields import plain

__all__ = [
    "MAX_JSON_MEMORY_BYTES",
    "MAX_UNPACKED_BYTES",
    "JsonCost",
    "Refused",
    "gunzip",
    "json_cost",
    "json_text",
]

# What any file may unpack to. The largest real inputs: 1,000,000 history entries (the
# entry bound) are 52 MiB as a compact JSON trace, and 178 MB as a pickle with 29 frames an
# entry (a pickle shares repeated frames).
MAX_UNPACKED_BYTES = 256 << 20
# What parsing one JSON text may take, by ``JsonCost``'s estimate, which is at least what 13
# shapes of JSON took (tests/test_whatif_unpack.py). 1,000,000 compact entries are
# estimated at 485 MiB (229 MiB measured). JSON shares nothing: a snapshot written as JSON
# with 29 frames an entry is estimated at 2.2 GiB per 100,000 entries (1.25 GiB measured,
# 17 s to parse), so past about 45,000 such entries it is refused; its pickle is read.
# Accepted JSON then peaks at about 5 times MAX_UNPACKED_BYTES: this, and the bytes.
MAX_JSON_MEMORY_BYTES = 4 * MAX_UNPACKED_BYTES
# CPython's sizes, rounded up: an empty dict is 64 bytes, a list 56 and up to 4 slots more
# once appended to, plus the slot holding it. A member (after each comma or colon) is a slot
# in its list (8 bytes, 1/8 more as it grows) or an entry in its dict and the decoder's memo
# of keys, and a small object: an int 28-32 bytes, a float 24, a string 49 plus its
# characters (counted in the text's term).
_CONTAINER_BYTES = 96
_MEMBER_BYTES = 80
_PARSER_BYTES = 64 << 10  # the decoder's own: its memo, the objects' headers at the top
_CHUNK_BYTES = 1 << 20


class Refused(Exception):
    """A file refused before it is held whole: past a bound, or damaged. The message is one
    sentence that names the file."""


@dataclass(frozen=True)
class JsonCost:
    """A JSON text's memory once parsed, estimated before parsing it."""

    text_bytes: int
    containers: int  # objects and lists (brackets inside strings counted too: an upper bound)
    members: int  # commas and colons: every value but the first of each container
    char_bytes: int  # 1 for ASCII; 4 for any other text, or text escaping characters

    @property
    def estimate_bytes(self) -> int:
        # The text twice: decoded into one str, and again in the strings parsed out of it.
        return (2 * self.char_bytes * self.text_bytes + _CONTAINER_BYTES * self.containers
                + _MEMBER_BYTES * self.members + _PARSER_BYTES)


def gunzip(data: bytes | bytearray, name: str) -> bytearray:
    """The gzip file ``data`` unpacked into one buffer, ``Refused`` the moment it would pass
    ``MAX_UNPACKED_BYTES`` (or damaged)."""
    out = bytearray()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            while chunk := f.read(_CHUNK_BYTES):
                if len(out) + len(chunk) > MAX_UNPACKED_BYTES:
                    raise Refused(f"{name} unpacks to more than "
                                  f"{format_bytes(MAX_UNPACKED_BYTES)}, more than any "
                                  "snapshot a what-if replays")
                out += chunk  # grown in place: one copy of the unpacked bytes, never two
    except (OSError, EOFError, zlib.error) as e:
        raise Refused(f"{name} is a damaged gzip file: {plain(str(e))}") from None
    return out


def json_cost(data: bytes | bytearray) -> JsonCost:
    """What parsing the JSON text ``data`` would take, counted in one pass per byte kind."""
    ascii_only = data.isascii() and data.find(b"\\u") < 0
    return JsonCost(text_bytes=len(data),
                    containers=data.count(b"{") + data.count(b"["),
                    members=data.count(b",") + data.count(b":"),
                    char_bytes=1 if ascii_only else 4)


def json_text(data: bytes | bytearray, name: str) -> str:
    """``data`` decoded as JSON text (UTF-8, -16 or -32, a BOM allowed, as ``json.loads``
    reads bytes), ``Refused`` first when parsing it would take more memory than
    ``MAX_JSON_MEMORY_BYTES``. The caller lets go of ``data`` before it parses the text."""
    cost = json_cost(data)
    if cost.estimate_bytes > MAX_JSON_MEMORY_BYTES:
        raise Refused(f"{name} is refused: parsing its {format_bytes(cost.text_bytes)} of "
                      f"JSON would take about {format_bytes(cost.estimate_bytes)} of memory, "
                      "more than the "
                      f"{format_bytes(MAX_JSON_MEMORY_BYTES)} a what-if allows")
    return data.decode(json.detect_encoding(data), "surrogatepass")
