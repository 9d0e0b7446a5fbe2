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
- **Roles, where they can be told.** ``multiprocessing`` keeps the ``Process`` objects it
  started in this kernel (read, never reaped: ``active_children()`` would join them), so its
  children are known as such; but ``start()`` drops each one's target, so what a child runs
  comes from torch's own objects instead: its live DataLoader iterators list their workers,
  and ``start_processes``' contexts (``torch.multiprocessing``, ``ddp_notebook``,
  ``notebook_launcher``'s elastic launch) list theirs with the process index. Finding those
  walks the collector's objects, so ``learn_roles`` runs on demand on the main thread only.
  A child started with its own environment (torchrun, a launcher that execs) carries
  ``RANK``/``LOCAL_RANK`` in ``/proc/<pid>/environ`` when we may read it; variables a forked
  child sets after the fork are not visible there (the file shows the environment the
  process began with). Rank variables the child merely inherited (the kernel's own, from its
  start or set since, say for a one-process ``init_process_group``) say nothing about it: a
  DataLoader worker of such a kernel is no "launched worker rank 0 of 1".
- **psutil** stands in for ``/proc`` only where there is none and only if the user's code has
  already imported it: its import costs more than this whole module does per tick.
- **Other PID namespaces.** In a container NVML reports host PIDs, which may name unrelated
  processes here. The caller classifies only when NVML's PIDs are known to be ours (see
  ``NvmlSource``); this module trusts the PIDs it is given.

Information about a process (role, command line) is cached by PID and start time, so a PID
reused by a new process is read afresh. Nothing here kills, signals or changes any process.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from ..model import (
    ROLE_DATALOADER,
    ROLE_LAUNCHED,
    ROLE_MULTIPROCESSING,
    ROLE_OTHER,
    ChildProcess,
)
from ..units import printable

__all__ = [
    "CMDLINE_CHARS",
    "MAX_DEPTH",
    "ProcessTree",
    "roles_to_learn",
    "shown_cmdline",
    "split_children",
]

# Deeper than any launcher nests (kernel -> agent -> worker -> its own children).
MAX_DEPTH = 32
CMDLINE_CHARS = 160
_RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


def shown_cmdline(text: str) -> str:
    """A process's command line as every view shows it, read live or from a recording: its
    arguments are anyone's text, so terminal escapes, newlines, bidirectional overrides and
    lone surrogates are kept as their escapes, never printed raw, and it is cut to
    ``CMDLINE_CHARS``."""
    text = printable(text)
    return text if len(text) <= CMDLINE_CHARS else text[: CMDLINE_CHARS - 3] + "..."


class ProcessTree:
    """Tells which PIDs descend from ``root_pid`` (this process by default) and what each is.

    ``proc_root`` and ``modules`` are injectable so tests can script a process table.
    """

    def __init__(self, root_pid: int | None = None, proc_root: str = "/proc",
                 modules: Mapping[str, ModuleType] | None = None) -> None:
        self.root_pid = os.getpid() if root_pid is None else root_pid
        self._proc = proc_root
        self._modules = sys.modules if modules is None else modules
        # (pid, start time) -> (role, cmdline, rank, local_rank, world_size)
        self._known: dict[tuple[int, int], tuple[str, str, int | None, int | None, int | None]] = {}
        self._not_ours: set[tuple[int, int]] = set()  # (pid, start time) walked, not ours
        # pid -> (role, process index) learned from torch's own objects (``learn_roles``).
        self._hints: dict[int, tuple[str, int | None]] = {}
        # PIDs ``learn_roles`` has looked for: a process's launcher exists before the process
        # shows on the GPU, so one look per process is enough (a PID reused by a new process
        # is dropped from here when that process is first described).
        self._searched: set[int] = set()
        self._root_env: dict[str, str] | None = None  # the root's starting rank variables

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
        return self._descent(pid) is not None

    def _descent(self, pid: int) -> int | None:
        """``pid``'s start time when it descends from the root, else None: one small read
        per generation."""
        if pid == self.root_pid or pid <= 1:
            return None
        first = self._stat(pid)
        if first is None:
            return None
        start = first[1]
        if (pid, start) in self._not_ours:
            return None  # a process never becomes our descendant later: walked once
        parent = first[0]
        for _ in range(MAX_DEPTH):
            if parent == self.root_pid:
                return start
            if parent <= 1:
                break
            st = self._stat(parent)
            if st is None:
                break
            parent = st[0]
        if len(self._not_ours) > 4096:
            self._not_ours.clear()
        self._not_ours.add((pid, start))
        return None

    # -- who it is ---------------------------------------------------------------------------
    def children_of(self, listing: Iterable[tuple[int, int | None]]) -> tuple[ChildProcess, ...]:
        """The entries of NVML's (pid, bytes) ``listing`` that descend from the root, named."""
        out: list[ChildProcess] = []
        started: set[int] | None = None
        for pid, nbytes in listing:
            start = self._descent(pid)
            if start is None:
                continue
            key = (pid, start)
            info = self._known.get(key)
            if info is None:
                self._searched.discard(pid)
            if info is None or (pid in self._hints and info[0] != self._hints[pid][0]):
                if started is None:
                    started = self._multiprocessing_pids()
                info = self._describe(pid, pid in started)
                if len(self._known) > 1024:
                    self._known.clear()
                self._known[key] = info
            role, cmdline, rank, local_rank, world = info
            out.append(ChildProcess(pid=pid, nbytes=nbytes, role=role, cmdline=cmdline,
                                    rank=rank, local_rank=local_rank, world_size=world))
        return tuple(out)

    def _describe(self, pid: int, by_multiprocessing: bool,
                  ) -> tuple[str, str, int | None, int | None, int | None]:
        cmdline = self._cmdline(pid)
        env = self._environ(pid)
        if env and self._inherited(env):
            env = {}
        rank, local_rank, world = (_int(env.get(v)) for v in _RANK_VARS)
        role = ROLE_MULTIPROCESSING if by_multiprocessing else ROLE_OTHER
        hint = self._hints.get(pid)
        if hint is not None:
            role = hint[0]
            if role == ROLE_LAUNCHED and local_rank is None:
                local_rank = hint[1]
        elif rank is not None or local_rank is not None:
            role = ROLE_LAUNCHED
        elif "multiprocessing" in cmdline and "spawn_main" in cmdline:
            role = ROLE_MULTIPROCESSING
        return role, cmdline, rank, local_rank, world

    def _inherited(self, env: Mapping[str, str]) -> bool:
        """Whether a child's rank variables are the root's own: as it started, or as it has
        them now (``os.environ``, when the root is this process)."""
        if self._root_env is None:
            self._root_env = self._environ(self.root_pid)
        sources: list[Mapping[str, str]] = [self._root_env]
        if self.root_pid == os.getpid():
            sources.append(os.environ)
        return any(all(own.get(k) == v for k, v in env.items()) for own in sources)

    def _multiprocessing_pids(self) -> set[int]:
        """PIDs of the processes ``multiprocessing`` started in this process. Read only:
        never ``active_children()``, which reaps. (``start()`` drops a process's target, so
        what each one runs is not known here; ``learn_roles`` finds that out on demand.)"""
        if self.root_pid != os.getpid():
            return set()
        children = getattr(self._modules.get("multiprocessing.process"), "_children", None)
        if not children:
            return set()
        try:
            procs = list(children)  # a set the main thread mutates: copy, never iterate it
        except RuntimeError:
            return set()
        pids = (getattr(getattr(p, "_popen", None), "pid", None) for p in procs)
        return {pid for pid in pids if isinstance(pid, int)}

    def learn_roles(self, pids: Iterable[int] | None = None) -> int:
        """On demand, on the main thread (``%gpumem``, the OOM explainer): find torch's live
        DataLoader iterators and ``start_processes`` contexts (``torch.multiprocessing``,
        ``ddp_notebook``, ``notebook_launcher``'s elastic launch) and remember their workers'
        PIDs and process indices. The lookup is one pass over the collector's objects (about
        15 ms per 170,000 objects here, more in a big session), so the sampler never calls
        this, and given ``pids`` (the children whose role is not known) it is skipped when
        each was looked for already. Returns how many PIDs it learned."""
        wanted = None if pids is None else set(pids)
        if wanted is not None and wanted <= self._searched:
            return 0
        loader = getattr(self._modules.get("torch.utils.data.dataloader"),
                         "_MultiProcessingDataLoaderIter", None)
        context = getattr(self._modules.get("torch.multiprocessing.spawn"), "ProcessContext",
                          None)
        found: dict[int, tuple[str, int | None]] = {}
        for obj in _instances(loader, context):
            if isinstance(loader, type) and isinstance(obj, loader):
                role, procs = ROLE_DATALOADER, getattr(obj, "_workers", None)
            else:
                role, procs = ROLE_LAUNCHED, getattr(obj, "processes", None)
            for i, p in enumerate(procs or ()):
                pid = getattr(p, "pid", None)
                if isinstance(pid, int):
                    found[pid] = (role, i)
        self._hints.update(found)
        if len(self._hints) > 1024:
            self._hints = dict(found)
        if len(self._searched) > 4096:
            self._searched.clear()
        self._searched |= wanted or set()
        return len(found)

    def _cmdline(self, pid: int) -> str:
        try:
            with open(f"{self._proc}/{pid}/cmdline", "rb") as fh:
                raw = fh.read(4096)
        except OSError:
            return ""
        return shown_cmdline(" ".join(a.decode(errors="replace")
                                      for a in raw.split(b"\0") if a))

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


def roles_to_learn(children: Iterable[ChildProcess]) -> list[int]:
    """The children whose kind ``learn_roles`` may tell: those ``multiprocessing`` started in
    this process (DataLoader, ``torch.multiprocessing`` and elastic workers all are). Any other
    child (``subprocess``, a grandchild) has no launcher object here to find, so naming it
    never walks the collector."""
    return [c.pid for c in children if c.role == ROLE_MULTIPROCESSING]


def _instances(*bases: Any) -> list[Any]:
    """The live instances of ``bases`` and their subclasses, in one pass over the collector's
    objects. Instances of a Python class refer to their type, so the collector's referrers of
    the classes are their instances (and a few dicts); no list of every object is built."""
    classes = [c for b in bases if isinstance(b, type) for c in (b, *b.__subclasses__())]
    if not classes:
        return []
    kinds = set(classes)
    try:
        return [o for o in gc.get_referrers(*classes) if type(o) in kinds]
    except Exception:
        return []


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
