"""Which NVML device is CUDA device ``i``.

CUDA numbers only the devices ``CUDA_VISIBLE_DEVICES`` lets through, in its own order, while
NVML numbers every device on the machine by PCI bus. A monitor that assumes the two agree shows
the wrong GPU (ipyexperiments#2, pynvml#28). Pure functions here; ``nvml.py`` feeds them.

Rules follow CUDA's documented behaviour, as nvitop's ``parse_cuda_visible_devices`` and torch's
``_parse_visible_devices`` implement it:

- entries are integers (NVML/PCI order when ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), ``GPU-<uuid>``
  (a unique prefix is enough) or ``MIG-<uuid>``;
- parsing stops at the first entry that is invalid or names no device; a repeated device also
  ends the list, as CUDA does;
- unset means every device; set but empty means none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "DeviceId",
    "match_by_identity",
    "normalize_bus_id",
    "normalize_uuid",
    "torch_only_device",
    "visible_devices",
]


@dataclass(frozen=True)
class DeviceId:
    """Identity of one NVML device or MIG instance."""

    nvml_index: int
    uuid: str  # "GPU-..." or "MIG-..."
    pci_bus_id: str = ""
    is_mig: bool = False
    # A device torch's CUDA knows and NVML cannot read (no NVML on this machine): its
    # ``nvml_index`` is negative, unique per device, and names no NVML device.
    torch_only: bool = False


def torch_only_device(index: int, uuid: str | None, bus_id: str | None) -> DeviceId:
    """CUDA device ``index`` as torch reports it, where NVML is unavailable."""
    return DeviceId(nvml_index=-1 - index, uuid=uuid or "", pci_bus_id=bus_id or "",
                    torch_only=True)


def normalize_uuid(uuid: str) -> str:
    """Compare UUIDs without their ``GPU-``/``MIG-`` prefix and case."""
    u = uuid.strip().lower()
    for prefix in ("gpu-", "mig-"):
        if u.startswith(prefix):
            return u[len(prefix) :]
    return u


def normalize_bus_id(bus_id: str) -> str:
    """NVML writes ``00000000:3B:00.0``, torch ``0000:3b:00.0``: compare the last 3 fields."""
    parts = bus_id.strip().lower().split(":")
    return ":".join(parts[-2:]) if len(parts) >= 2 else bus_id.strip().lower()


def _match_uuid(entry: str, devices: Sequence[DeviceId]) -> DeviceId | None:
    want = entry.strip().lower()
    is_mig = want.startswith("mig-")
    key = normalize_uuid(want)
    if not key:
        return None
    hits = [
        d
        for d in devices
        if d.is_mig == is_mig and normalize_uuid(d.uuid).startswith(key)
    ]
    # An ambiguous prefix names no device, as in CUDA.
    return hits[0] if len(hits) == 1 else None


def visible_devices(env_value: str | None, devices: Sequence[DeviceId]) -> list[DeviceId]:
    """The devices CUDA will number 0, 1, ... given ``CUDA_VISIBLE_DEVICES``.

    ``devices`` are the physical GPUs in NVML order, followed by any MIG instances. Integer
    entries index the physical GPUs only.
    """
    physical = [d for d in devices if not d.is_mig]
    if env_value is None:
        return physical
    out: list[DeviceId] = []
    for raw in env_value.split(","):
        entry = raw.strip()
        if not entry:
            break
        found: DeviceId | None
        if entry.lstrip("-").isdigit():
            i = int(entry)
            found = physical[i] if 0 <= i < len(physical) else None
        elif entry.lower().startswith(("gpu-", "mig-")):
            found = _match_uuid(entry, devices)
        else:
            found = None
        if found is None or found in out:
            break
        out.append(found)
    return out


def match_by_identity(
    torch_uuid: str | None, torch_bus_id: str | None, devices: Sequence[DeviceId]
) -> DeviceId | None:
    """After torch has initialized CUDA: find its device by UUID, else by PCI bus id."""
    if torch_uuid:
        key = normalize_uuid(torch_uuid)
        for d in devices:
            if normalize_uuid(d.uuid) == key:
                return d
    if torch_bus_id:
        key = normalize_bus_id(torch_bus_id)
        for d in devices:
            if d.pci_bus_id and not d.is_mig and normalize_bus_id(d.pci_bus_id) == key:
                return d
    return None
