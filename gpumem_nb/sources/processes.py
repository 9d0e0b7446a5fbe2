"""The kernel's descendants among the processes NVML lists: who they are, from ``/proc``.

A notebook outgrows its one process through children: DataLoader workers,
``torch.multiprocessing`` and ``notebook_launcher``/``ddp_notebook`` DDP workers, an inference
engine's processes (vLLM). NVML lists each one with its own CUDA context (about 518 MiB on an
H200) by PID; this module tells which of those PIDs descend from this kernel and what each is.

How, and why this way:

- **Ancestry, not a full process scan.** Only PIDs NVML lists are looked at, each walked up
  its parents through ``/proc/<pid>/stat`` (one small read per generation). Scanning every
  process in ``/proc`` would cost milliseconds on a busy host, every tick, to learn about
  processes that hold no GPU memory. The sampler does this on its thread, at its pace, and only
  when NVML lists a PID other than ours; a cell hook never does.
- **Roles, where they can be told.** In the kernel itself, ``multiprocessing`` keeps the
  ``Process`` objects it started (read, never reaped: ``active_children()`` would join them),
  and their targets say what they are: torch's DataLoader ``_worker_loop``, or
  ``torch.multiprocessing``'s ``_wrap`` (which ``start_processes``, ``ddp_notebook`` and
  ``notebook_launcher``'s elastic launch all use) with the process index. A child started with
  its own environment (torchrun, a launcher that execs) carries ``RANK``/``LOCAL_RANK`` in
  ``/proc/<pid>/environ`` when we may read it. A forked child's variables set after the fork
  are not visible there (the file shows the environment the process began with).
- **psutil** stands in for ``/proc`` only where there is none and only if the user's code has
  already imported it: its import costs more than this whole module does per tick.
- **Other PID namespaces.** In a container NVML reports host PIDs, which may name unrelated
  processes here. The caller classifies only when NVML's PIDs are known to be ours (see
  ``NvmlSource``); this module trusts the PIDs it is given.

Information about a process (role, command line) is cached by PID and start time, so a PID
reused by a new process is read afresh. Nothing here kills, signals or changes any process.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from ..model import (
    ROLE_DATALOADER,
    ROLE_LAUNCHED,
    ROLE_MULTIPROCESSING,
    ROLE_OTHER,
    ChildProcess,
)

# Deeper than any launcher nests (kernel -> agent -> worker -> its own children).
MAX_DEPTH = 32
CMDLINE_CHARS = 160
_RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


class ProcessTree:
    """Tells which PIDs descend from ``root_pid`` (this process by default) and what each is.

    ``proc_root`` and ``modules`` are injectable so tests can script a process table.
    """

    def __init__(self, root_pid: int | None = None, proc_root: str = "/proc",
                 modules: Mapping[str, Any] | None = None) -> None:
        self.root_pid = os.getpid() if root_pid is None else root_pid
        self._proc = proc_root
        self._modules = sys.modules if modules is None else modules
        # (pid, start time) -> (role, cmdline, rank, local_rank, world_size)
        self._known: dict[tuple[int, int], tuple[str, str, int | None, int | None, int | None]] = {}

    # -- ancestry ----------------------------------------------------------------------------
    def _stat(self, pid: int) -> tuple[int, int] | None:
        """(parent PID, start time in clock ticks) of ``pid``; None if it is gone."""
        try:
            with open(f"{self._proc}/{pid}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:
            return self._psutil_stat(pid)
        # The command name sits in parentheses and may itself hold spaces or ')'.
        fields = raw[raw.rfind(b")") + 2:].split()
        try:
            return int(fields[1]), int(fields[19])
        except (IndexError, ValueError):
            return None

    def _psutil_stat(self, pid: int) -> tuple[int, int] | None:
        if os.path.isdir(self._proc):
            return None  # /proc exists: the process is gone, not unreadable
        psutil = self._modules.get("psutil")
        if psutil is None:
            return None
        try:
            p = psutil.Process(pid)
            return int(p.ppid()), int(p.create_time() * 100)
        except Exception:
            return None

    def is_descendant(self, pid: int) -> bool:
        if pid == self.root_pid or pid <= 1:
            return False
        current = pid
        for _ in range(MAX_DEPTH):
            st = self._stat(current)
            if st is None:
                return False
            parent = st[0]
            if parent == self.root_pid:
                return True
            if parent <= 1:
                return False
            current = parent
        return False

    # -- who it is ---------------------------------------------------------------------------
    def children_of(self, listing: Iterable[tuple[int, int | None]]) -> tuple[ChildProcess, ...]:
        """The entries of NVML's (pid, bytes) ``listing`` that descend from the root, named."""
        out: list[ChildProcess] = []
        targets: dict[int, tuple[str, tuple[Any, ...]]] | None = None
        for pid, nbytes in listing:
            if not self.is_descendant(pid):
                continue
            st = self._stat(pid)
            key = (pid, st[1] if st else -1)
            info = self._known.get(key)
            if info is None:
                if targets is None:
                    targets = self._multiprocessing_targets()
                info = self._describe(pid, targets.get(pid))
                if len(self._known) > 1024:
                    self._known.clear()
                self._known[key] = info
            role, cmdline, rank, local_rank, world = info
            out.append(ChildProcess(pid=pid, nbytes=nbytes, role=role, cmdline=cmdline,
                                    rank=rank, local_rank=local_rank, world_size=world))
        return tuple(out)

    def _describe(self, pid: int, target: tuple[str, tuple[Any, ...]] | None,
                  ) -> tuple[str, str, int | None, int | None, int | None]:
        cmdline = self._cmdline(pid)
        env = self._environ(pid)
        rank, local_rank, world = (_int(env.get(v)) for v in _RANK_VARS)
        role = ROLE_OTHER
        if target is not None:
            name, args = target
            if name.startswith("torch.utils.data."):
                role = ROLE_DATALOADER
            elif name == "torch.multiprocessing.spawn._wrap":
                role = ROLE_LAUNCHED
                # _wrap(fn, i, args, error_file): i is the process index, the local rank.
                if local_rank is None and len(args) > 1 and isinstance(args[1], int):
                    local_rank = args[1]
            else:
                role = ROLE_MULTIPROCESSING
        if role in (ROLE_OTHER, ROLE_MULTIPROCESSING) and (rank is not None
                                                           or local_rank is not None):
            role = ROLE_LAUNCHED
        if role == ROLE_OTHER and "multiprocessing" in cmdline and "spawn_main" in cmdline:
            role = ROLE_MULTIPROCESSING
        return role, cmdline, rank, local_rank, world

    def _multiprocessing_targets(self) -> dict[int, tuple[str, tuple[Any, ...]]]:
        """PID -> (target's module.qualname, args) for the processes ``multiprocessing``
        started in this process. Read only: never ``active_children()``, which reaps."""
        if self.root_pid != os.getpid():
            return {}
        mp = self._modules.get("multiprocessing.process")
        children = getattr(mp, "_children", None)
        if not children:
            return {}
        out: dict[int, tuple[str, tuple[Any, ...]]] = {}
        try:
            procs = list(children)  # a set the main thread mutates: copy, never iterate it
        except RuntimeError:
            return {}
        for p in procs:
            popen = getattr(p, "_popen", None)
            pid = getattr(popen, "pid", None)
            target = getattr(p, "_target", None)
            if not isinstance(pid, int) or target is None:
                continue
            name = f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', '')}"
            args = getattr(p, "_args", ())
            out[pid] = (name, tuple(args) if isinstance(args, (tuple, list)) else ())
        return out

    def _cmdline(self, pid: int) -> str:
        try:
            with open(f"{self._proc}/{pid}/cmdline", "rb") as fh:
                raw = fh.read(4096)
        except OSError:
            return ""
        text = " ".join(a.decode(errors="replace") for a in raw.split(b"\0") if a)
        return text if len(text) <= CMDLINE_CHARS else text[: CMDLINE_CHARS - 3] + "..."

    def _environ(self, pid: int) -> dict[str, str]:
        """The rank variables of ``pid``'s starting environment; {} when not readable (another
        user's process, or a hardened /proc)."""
        try:
            with open(f"{self._proc}/{pid}/environ", "rb") as fh:
                raw = fh.read(1 << 20)
        except OSError:
            return {}
        out: dict[str, str] = {}
        for item in raw.split(b"\0"):
            key, _, value = item.partition(b"=")
            name = key.decode(errors="replace")
            if name in _RANK_VARS:
                out[name] = value.decode(errors="replace")
        return out


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def split_children(tree: ProcessTree | None, others: Iterable[tuple[int, int | None]],
                   ) -> tuple[tuple[ChildProcess, ...], int | None, int | None]:
    """(children, their bytes, the remaining others' bytes) of NVML's other processes on a
    device. A byte sum is None when NVML gave no figure for one of its processes."""
    listing = list(others)
    children = tree.children_of(listing) if tree is not None else ()
    child_pids = {c.pid for c in children}
    rest = [n for p, n in listing if p not in child_pids]
    return (children, _sum(c.nbytes for c in children),
            _sum(rest))


def _sum(values: Iterable[int | None]) -> int | None:
    total = 0
    for v in values:
        if v is None:
            return None
        total += int(v)
    return total
