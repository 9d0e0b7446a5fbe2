"""The messages between the chart's page (``livechart.js``) and the kernel, typed.

The page asks; the kernel answers once the draw that shows the effect is sent:

- ``{"kind": "cleanup", "id": ID}``: the Clean up button;
- ``{"kind": "device", "id": ID, "value": N}``: the device selector;
- ``{"kind": "done", "id": ID}``: the kernel's answer to either.

A message is the page's data, so a message that does not read as one of these is dropped, never
an error in the kernel (an old page, a forged comm message).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CleanupAsked", "DeviceAsked", "Request", "done", "read_request"]

MAX_ID_CHARS = 64  # the page's ids are short; a longer one is no id of ours


@dataclass(frozen=True)
class CleanupAsked:
    id: str | None


@dataclass(frozen=True)
class DeviceAsked:
    id: str | None
    value: Any  # the selector's value, checked by the chart against the devices it shows


Request = CleanupAsked | DeviceAsked


def read_request(content: object) -> Request | None:
    """The page's request, or None for anything else."""
    if type(content) is not dict:
        return None
    rid = content.get("id")
    rid = rid if type(rid) is str and 0 < len(rid) <= MAX_ID_CHARS else None
    kind = content.get("kind")
    if kind == "cleanup":
        return CleanupAsked(rid)
    if kind == "device":
        return DeviceAsked(rid, content.get("value"))
    return None


def done(rid: str) -> dict[str, str]:
    """The answer the page waits for: the request ``rid`` is handled and drawn."""
    return {"kind": "done", "id": rid}
