"""The other processes on the failing GPU: NVML's listing (bounded in time), this process
told apart from the others (or not, in another PID namespace), this kernel's children named
as such, and a few words about any other process from /proc."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from ..model import ChildProcess
from ..sources.processes import roles_to_learn
from ..units import printable
from .facts import ProcessUse
from .scans import OomHost

__all__ = [
    "PROCESSES_WAIT_S",
    "describe_pid",
    "listed_processes",
    "process_uses",
    "processes_facts",
    "unknown_note",
]

# How long the explanation waits for NVML's process listing (an H200's first listing takes well
# under 10 ms): past it, the other processes read as unknown rather than the cell hanging.
PROCESSES_WAIT_S = 0.5


def describe_pid(pid: int) -> str:
    """A few words about a process from /proc (same PID namespace only); "" if unknown."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return ""
    if not argv:
        return ""
    joined = " ".join(argv)
    if "ipykernel" in joined:
        conn = next((a for a in argv if a.endswith(".json")), "")
        name = os.path.basename(conn)[: -len(".json")] if conn else ""
        return "a Jupyter kernel" + (f" {name}" if name else "")
    # One line: a ``python -c`` script's newlines would break the explanation's lines; any
    # other control character (a terminal escape) is printed as its escape.
    text = printable(" ".join(" ".join([os.path.basename(argv[0]), *argv[1:3]]).split()))
    return text if len(text) <= 60 else text[:57] + "..."


def listed_processes(host: OomHost, device: int) -> list[tuple[int, int | None]] | None:
    """NVML's processes on ``device`` (pid, bytes), waiting ``PROCESSES_WAIT_S`` at most;
    None where NVML cannot list them."""
    src = host.source
    nvml = getattr(src, "nvml", None)
    ids = src.device_ids() if hasattr(src, "device_ids") else []
    if nvml is None or not hasattr(nvml, "processes") or device >= len(ids):
        return None
    gate = getattr(host, "read_gate", None)
    if gate is None:
        try:
            result: list[tuple[int, int | None]] | None = nvml.processes(ids[device])
            return result
        except Exception:
            return None
    # NVML can hang with nothing else inside the gate yet (the sampler stopped, or just
    # started its reading): the listing runs on a helper thread under the gate, and the
    # cell waits a bounded time for it, as Monitor.read does; a hung one stays the only
    # stuck thread, and the explanation goes on with the processes unknown.
    if not gate.enter(wait_s=PROCESSES_WAIT_S):
        return None
    box: list[list[tuple[int, int | None]] | None] = []

    def work() -> None:
        try:
            box.append(nvml.processes(ids[device]))
        except Exception:
            box.append(None)
        finally:
            gate.leave()

    worker = threading.Thread(target=work, name="gpumem_nb-oom-processes", daemon=True)
    worker.start()
    worker.join(PROCESSES_WAIT_S)
    return box[0] if box else None


def processes_facts(host: OomHost, listed: Sequence[tuple[int, int | None]] | None,
                    from_message: Sequence[tuple[int, int | None]] = (),
                    this_from_message: int | None = None, *, ours_expected: bool,
                    ) -> tuple[int | None, tuple[ProcessUse, ...], bool]:
    """(this process's bytes, the others, whether the others are unknown)."""
    me = os.getpid()
    if listed is None:
        others = process_uses(host, from_message)
        return this_from_message, others, not from_message and this_from_message is None
    mine = [n for p, n in listed if p == me]
    if not mine and (ours_expected or any(
            not os.path.exists(f"/proc/{p}") for p, _ in listed)):
        # PyTorch holds memory here, yet our PID is not listed, or the PIDs do not exist
        # here: NVML shows another PID namespace (a container), so no listed process can
        # be told apart from this one.
        return None, (), True
    this = sum(n or 0 for n in mine) if mine and None not in mine else None
    others = process_uses(host, [(p, n) for p, n in listed if p != me])
    return this, others, False


def process_uses(host: OomHost,
                 listed: Sequence[tuple[int, int | None]]) -> tuple[ProcessUse, ...]:
    """The other processes, this kernel's children named as such. Read on demand (the
    failed cell only): a few small /proc reads per listed process."""
    tree = getattr(host.source, "processes", None)
    children: dict[int, ChildProcess] = {}
    if tree is not None and listed and all(os.path.exists(f"/proc/{p}") for p, _ in listed):
        try:
            children = {c.pid: c for c in tree.children_of(listed)}
            unknown = roles_to_learn(children.values())
            if unknown and tree.learn_roles(unknown):
                children = {c.pid: c for c in tree.children_of(listed)}
        except Exception:
            children = {}
    return tuple(ProcessUse(p, n, describe_pid(p) if p not in children else "",
                            child=children.get(p)) for p, n in listed)


def unknown_note(unknown: bool) -> list[str]:
    """The note where NVML could not tell this process's memory from the others'."""
    if not unknown:
        return []
    return ["NVML could not attribute GPU memory to processes here (another PID "
            "namespace, such as a container, or no NVML), so other processes and memory "
            "outside PyTorch are not shown."]
