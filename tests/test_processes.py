"""The kernel's child processes: found from the process tree, named by role, and shown as this
kernel's children (never as "other processes") in %gpumem, the history and the OOM explainer."""

from __future__ import annotations

import gc
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpumem_nb.kernel import monitor as monitor_mod
from gpumem_nb.model import (
    ROLE_DATALOADER,
    ROLE_LAUNCHED,
    ROLE_MULTIPROCESSING,
    ROLE_OTHER,
    ChildProcess,
)
from gpumem_nb.oom import CAUSE_OTHER_PROCESSES
from gpumem_nb.sources import processes as processes_mod
from gpumem_nb.sources.live import LiveSource
from gpumem_nb.sources.nvml import NvmlSource
from gpumem_nb.sources.processes import ProcessTree, roles_to_learn, split_children

from .fakes import FakeCuda, FakeCudaDevice, FakeGpu, FakePynvml, GiB, MiB, fake_torch


# --------------------------------------------------------------------------------------------
# A scripted /proc
# --------------------------------------------------------------------------------------------
def fake_proc(root: Path, table: dict[int, tuple[int, str, dict[str, str]]]) -> str:
    """pid -> (ppid, cmdline with spaces for NULs, environ) as files under ``root``."""
    for pid, (ppid, cmdline, env) in table.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        comm = cmdline.split(" ")[0][-15:] or "x"
        # Field 22 (start time) is 1000 + pid; the comm may hold spaces and parentheses.
        rest = ["S", str(ppid)] + ["0"] * 17 + [str(1000 + pid)] + ["0"] * 10
        (d / "stat").write_bytes(f"{pid} ({comm} (x) y) ".encode() + " ".join(rest).encode())
        (d / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
        (d / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))
    return str(root)


ME = os.getpid()


@pytest.fixture
def tree(tmp_path: Path) -> ProcessTree:
    proc = fake_proc(tmp_path, {
        ME: (1, "python -m ipykernel_launcher -f kernel-1.json", {}),
        201: (ME, "python -m ipykernel_launcher -f kernel-1.json", {}),  # forked
        202: (ME, "python -c from multiprocessing.spawn import spawn_main; spawn_main(7)"
                  " --multiprocessing-fork", {}),
        203: (ME, "python train.py", {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2",
                                      "PATH": "/bin"}),
        204: (203, "python -m vllm.entrypoints --model m", {}),  # a grandchild
        300: (1, "python other_notebook.py", {}),  # not ours
        301: (300, "python its_child.py", {}),
    })
    return ProcessTree(proc_root=proc, modules={})


def test_descendants_are_told_from_unrelated_processes_through_every_generation(tree):
    assert [tree.is_descendant(p) for p in (201, 202, 203, 204, 300, 301, ME, 999)] == [
        True, True, True, True, False, False, False, False]


def test_roles_come_from_the_environment_and_the_command_line(tree):
    got = {c.pid: c for c in tree.children_of([(201, GiB), (202, None), (203, 2 * GiB),
                                               (204, 3 * GiB), (300, 4 * GiB)])}
    assert sorted(got) == [201, 202, 203, 204]  # 300 is another notebook's: not a child
    assert got[203].role == ROLE_LAUNCHED and (got[203].rank, got[203].local_rank,
                                               got[203].world_size) == (1, 1, 2)
    assert got[203].label == "PID 203, launched worker rank 1 of 2"
    assert got[202].role == ROLE_MULTIPROCESSING and got[202].nbytes is None
    assert got[201].role == ROLE_OTHER and "ipykernel_launcher" in got[201].cmdline
    assert got[204].cmdline == "python -m vllm.entrypoints --model m"


# Stand-ins for torch's own objects that know their workers' PIDs, under torch's class names
# (what ProcessTree looks up in torch's modules).
class _MultiProcessingDataLoaderIter:
    def __init__(self, pids: list[int]) -> None:
        self._workers = [SimpleNamespace(pid=p) for p in pids]


class ProcessContext:
    def __init__(self, pids: list[int]) -> None:
        self.processes = [SimpleNamespace(pid=p) for p in pids]


def test_torchs_own_objects_name_dataloader_and_launched_workers_on_demand(tmp_path):
    proc = fake_proc(tmp_path, {p: (ME, "python -m ipykernel_launcher", {})
                                for p in (201, 202, 203, 204)})
    started = [SimpleNamespace(_popen=SimpleNamespace(pid=p)) for p in (201, 202, 203, 204)]
    modules = {
        "multiprocessing.process": SimpleNamespace(_children=started),
        "torch.utils.data.dataloader": SimpleNamespace(
            _MultiProcessingDataLoaderIter=_MultiProcessingDataLoaderIter),
        "torch.multiprocessing.spawn": SimpleNamespace(ProcessContext=ProcessContext),
    }
    tree = ProcessTree(proc_root=proc, modules=modules)
    listing = [(p, GiB) for p in (201, 202, 203, 204)]
    before = {c.pid: c.role for c in tree.children_of(listing)}
    assert set(before.values()) == {ROLE_MULTIPROCESSING}  # known children, of unknown kind
    alive = [_MultiProcessingDataLoaderIter([201, 202]), ProcessContext([203, 204])]
    assert tree.learn_roles() == 4
    got = {c.pid: c for c in tree.children_of(listing)}
    assert [got[p].role for p in (201, 202, 203, 204)] == [
        ROLE_DATALOADER, ROLE_DATALOADER, ROLE_LAUNCHED, ROLE_LAUNCHED]
    assert got[204].label == "PID 204, launched worker local rank 1"
    del alive


def test_naming_children_walks_the_collector_once_and_not_again_for_the_same_children(
        tmp_path, monkeypatch):
    """The OOM explainer names the children within its budget: the H200 run found 60 ms added
    when the lookup walked the collector's objects once per class, on every explanation."""
    class SpawnContext(ProcessContext):
        pass

    proc = fake_proc(tmp_path, {p: (ME, "python -m ipykernel_launcher", {})
                                for p in (201, 202, 203)})
    modules = {
        "torch.utils.data.dataloader": SimpleNamespace(
            _MultiProcessingDataLoaderIter=_MultiProcessingDataLoaderIter),
        "torch.multiprocessing.spawn": SimpleNamespace(ProcessContext=ProcessContext),
    }
    tree = ProcessTree(proc_root=proc, modules=modules)
    alive = [_MultiProcessingDataLoaderIter([201]), SpawnContext([202])]
    walks: list[int] = []
    real = gc.get_referrers
    monkeypatch.setattr(processes_mod.gc, "get_referrers",
                        lambda *objs: walks.append(len(objs)) or real(*objs))
    tree.children_of([(201, GiB), (202, GiB), (203, GiB)])
    assert tree.learn_roles([201, 202, 203]) == 2 and len(walks) == 1  # one pass, 3 classes
    assert [c.role for c in tree.children_of([(201, GiB), (202, GiB)])] == [
        ROLE_DATALOADER, ROLE_LAUNCHED]
    assert tree.learn_roles([203]) == 0 and len(walks) == 1  # looked for already: no pass
    stat = tmp_path / "203" / "stat"
    stat.write_bytes(stat.read_bytes().replace(b" 1203 ", b" 5203 "))  # a new process, PID 203
    tree.children_of([(203, GiB)])
    tree.learn_roles([203])
    assert len(walks) == 2  # looked for afresh
    del alive


def test_a_reused_pid_is_described_afresh(tmp_path):
    proc = fake_proc(tmp_path, {201: (ME, "python first.py", {})})
    tree = ProcessTree(proc_root=proc, modules={})
    assert tree.children_of([(201, GiB)])[0].cmdline == "python first.py"
    stat = tmp_path / "201" / "stat"
    stat.write_bytes(stat.read_bytes().replace(b" 1201 ", b" 5201 "))  # a new start time
    (tmp_path / "201" / "cmdline").write_bytes(b"python\0second.py\0")
    assert tree.children_of([(201, GiB)])[0].cmdline == "python second.py"


def test_split_children_keeps_unknown_sums_unknown(tree):
    children, kids, rest = split_children(tree, [(203, 2 * GiB), (300, None)])
    assert [c.pid for c in children] == [203] and kids == 2 * GiB and rest is None
    children, kids, rest = split_children(tree, [(202, None), (300, GiB)])
    assert kids is None and rest == GiB


# --------------------------------------------------------------------------------------------
# A real forked child that the fake NVML lists
# --------------------------------------------------------------------------------------------
@pytest.fixture
def forked_child() -> Any:
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=time.sleep, args=(60,), daemon=True)
    child.start()
    yield child
    child.terminate()
    child.join(5)


def child_world(monkeypatch: Any, child_pid: int, child_bytes: int) -> Any:
    gpu = FakeGpu("GPU-aaaa-1111")
    nvml = FakePynvml([gpu])
    cuda = FakeCuda([FakeCudaDevice("aaaa-1111")], initialized=True)
    cuda.others[0] = [(child_pid, child_bytes), (os.getppid(), GiB)]  # a child, and not one
    cuda.link([gpu])
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda))
    monkeypatch.setattr(monitor_mod, "make_source",
                        lambda: LiveSource(nvml=NvmlSource(module=nvml)))  # type: ignore[arg-type]
    return cuda


def test_a_forked_child_on_the_gpu_is_shown_as_this_kernels_child_not_another_process(
        shell, monkeypatch, forked_child, capsys):
    cuda = child_world(monkeypatch, forked_child.pid, 600 * MiB)
    shell.run_cell("%load_ext gpumem_nb")
    shell.user_ns["cuda"] = cuda
    shell.run_cell("x = cuda.tensor(1 << 30)")
    capsys.readouterr()
    m = shell._gpumem_nb_monitor
    sample = m.read()
    nv = sample.devices[0].nvml
    assert [(c.pid, c.nbytes, c.role) for c in nv.children] == [
        (forked_child.pid, 600 * MiB, ROLE_MULTIPROCESSING)]
    assert nv.children_bytes == 600 * MiB and nv.other_processes_bytes == GiB
    shell.run_cell("%gpumem")
    out = capsys.readouterr().out
    assert "this kernel's children" in out
    assert f"PID {forked_child.pid}, multiprocessing child: 600.00 MiB" in out


def test_the_history_shows_what_a_cells_children_came_to_hold(shell, monkeypatch,
                                                               forked_child, capsys):
    cuda = child_world(monkeypatch, forked_child.pid, 0)
    cuda.others[0] = []  # no child on the GPU yet
    cuda._sync()
    shell.run_cell("%load_ext gpumem_nb")
    m = shell._gpumem_nb_monitor
    m.sampler.tick()
    shell.user_ns["start_child"] = lambda: (cuda.others.__setitem__(
        0, [(forked_child.pid, 600 * MiB)]), cuda._sync())
    shell.run_cell("start_child()", store_history=True)
    m.sampler.tick()  # the sampler's reading after the cell completes its NVML figures
    rec = m.history.records()[-1]
    assert rec.devices[0].children_after_bytes == 600 * MiB
    assert rec.devices[0].children_before_bytes == 0
    capsys.readouterr()
    shell.run_cell("%gpumem history")
    out = capsys.readouterr().out
    assert "children (NVML)" in out and "600.00 MiB (+600.00 MiB)" in out


def test_the_oom_explainer_says_the_memory_is_the_kernels_own_child_and_how_to_stop_it(
        shell, monkeypatch, forked_child, capsys):
    cuda = child_world(monkeypatch, forked_child.pid, 60 * GiB)
    cuda.others[0] = [(forked_child.pid, 60 * GiB)]
    cuda._sync()
    shell.run_cell("%load_ext gpumem_nb")
    shell.user_ns.update(cuda=cuda, GiB=GiB)
    shell.run_cell("warm = 1")
    shell.run_cell("y = cuda.tensor(100 * GiB)", store_history=True)
    e = shell.run_line_magic("gpumem", "oom -o")
    assert e.cause == CAUSE_OTHER_PROCESSES, str(e)
    (use,) = e.facts.other_processes
    assert use.child is not None and use.child.pid == forked_child.pid
    assert e.verdict.startswith("This kernel's own child process holds 60.00 GiB")
    text = str(e)
    assert f"PID {forked_child.pid} (this kernel's multiprocessing child)" in text
    assert "del llm" in text and "torch.distributed.destroy_process_group()" in text
    assert "pool.close()" in text
    assert forked_child.is_alive()  # advice only: nothing was stopped


def test_explaining_an_oom_over_a_subprocess_child_never_walks_the_collector(
        shell, monkeypatch, capsys):
    """A ``subprocess`` child (the H200 run's "another process") has no launcher object in
    this kernel to find: naming it costs /proc reads, not a pass over every object."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        cuda = child_world(monkeypatch, child.pid, 60 * GiB)
        cuda.others[0] = [(child.pid, 60 * GiB)]
        cuda._sync()
        shell.run_cell("%load_ext gpumem_nb")
        shell.user_ns.update(cuda=cuda, GiB=GiB)
        shell.run_cell("warm = 1")
        walks: list[int] = []
        real = gc.get_referrers
        monkeypatch.setattr(processes_mod.gc, "get_referrers",
                            lambda *objs: walks.append(len(objs)) or real(*objs))
        shell.run_cell("y = cuda.tensor(100 * GiB)", store_history=True)
        e = shell.run_line_magic("gpumem", "oom -o")
        (use,) = e.facts.other_processes
        assert use.child is not None and use.child.role == ROLE_OTHER
        assert e.verdict.startswith("This kernel's own child process holds 60.00 GiB of this "
                                    "GPU, with a CUDA context of its own")
        assert walks == []
    finally:
        child.kill()
        child.wait(5)


def test_children_are_looked_up_by_the_sampler_never_by_the_cell_hooks(
        shell, monkeypatch, forked_child):
    child_world(monkeypatch, forked_child.pid, 600 * MiB)
    shell.run_cell("%load_ext gpumem_nb")
    m = shell._gpumem_nb_monitor
    m.sampler.stop()
    m.sampler.tick()
    calls: list[Any] = []
    tree = m.source.processes
    real = tree.children_of
    monkeypatch.setattr(tree, "children_of", lambda listing: calls.append(1) or real(listing))
    for _ in range(3):
        shell.run_cell("pass")
    assert calls == []
    m.sampler.tick()
    assert calls == [1]


@pytest.mark.parametrize("role,words", [
    (ROLE_DATALOADER, "del the loader's iterator"),
    (ROLE_LAUNCHED, "torch.distributed.destroy_process_group()"),
    (ROLE_OTHER, "del llm"),
])
def test_the_advice_fits_what_the_child_is(role, words):
    from gpumem_nb.oom import child_advice

    assert words in child_advice(ChildProcess(pid=5, nbytes=GiB, role=role))


def test_the_charts_header_names_the_kernels_children(shell, monkeypatch, forked_child):
    pytest.importorskip("plotly")
    from gpumem_nb.chart.live import show

    cuda = child_world(monkeypatch, forked_child.pid, 600 * MiB)
    shell.run_cell("%load_ext gpumem_nb")
    shell.user_ns["cuda"] = cuda
    shell.run_cell("x = cuda.tensor(1 << 30)")
    m = shell._gpumem_nb_monitor
    m.sampler.stop()
    widget = show(m)
    m.sampler.tick()
    assert "This kernel&#x27;s children on GPU 0 hold 600.00 MiB" in widget.header.value
    assert f"PID {forked_child.pid}, multiprocessing child: 600.00 MiB" in widget.header.value
    m.feeds.drop_chart()


@pytest.mark.parametrize("where", ["at its start", "set since"])
def test_rank_variables_a_child_inherited_from_the_kernel_do_not_make_it_a_launched_worker(
        tmp_path, monkeypatch, where):
    # A kernel with RANK=0, WORLD_SIZE=1 (a one-process init_process_group): its DataLoader
    # workers were named "launched worker rank 0 of 1", with destroy_process_group advice,
    # and never looked up as DataLoader workers.
    ranks = {"RANK": "0", "WORLD_SIZE": "1"}
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    if where == "set since":
        for k, v in ranks.items():
            monkeypatch.setenv(k, v)
    spawn = "python -c from multiprocessing.spawn import spawn_main; spawn_main(7)"
    proc = fake_proc(tmp_path, {
        ME: (1, "python -m ipykernel_launcher", ranks if where == "at its start" else {}),
        201: (ME, spawn, {**ranks, "PATH": "/bin"}),  # inherited
        202: (ME, spawn, {"RANK": "1", "WORLD_SIZE": "2"}),  # its own: a launched worker
    })
    modules = {"torch.utils.data.dataloader": SimpleNamespace(
        _MultiProcessingDataLoaderIter=_MultiProcessingDataLoaderIter)}
    tree = ProcessTree(proc_root=proc, modules=modules)
    got = {c.pid: c for c in tree.children_of([(201, GiB), (202, GiB)])}
    assert (got[201].role, got[201].rank) == (ROLE_MULTIPROCESSING, None)
    assert got[202].label == "PID 202, launched worker rank 1 of 2"
    loader = _MultiProcessingDataLoaderIter([201])
    assert roles_to_learn(got.values()) == [201]
    tree.learn_roles([201])
    assert tree.children_of([(201, GiB)])[0].label == "PID 201, DataLoader worker"
    del loader


HOSTILE_ARGS = ("\x1b[2J\x1b[H\x1b[31mFAKE: GPU memory OK\x1b[0m\x07", "next\nline",
                "\u202eRTL")


def test_a_childs_command_line_reaches_the_terminal_escaped(shell, monkeypatch, capsys):
    # A child's argv went into %gpumem's text raw: a clear-screen escape, colours, a bell,
    # a newline forging a line of its own, a bidirectional override.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                              *HOSTILE_ARGS])
    try:
        cuda = child_world(monkeypatch, child.pid, 2 * GiB)
        shell.run_cell("%load_ext gpumem_nb")
        shell.user_ns["cuda"] = cuda
        shell.run_cell("x = cuda.tensor(1 << 30)")
        shell._gpumem_nb_monitor.sampler.tick()
        capsys.readouterr()
        shell.run_cell("%gpumem")
        out = capsys.readouterr().out
    finally:
        child.kill()
        child.wait()
    assert not any(c in out for c in ("\x1b", "\x07", "\u202e")), repr(out)
    (line,) = [ln for ln in out.splitlines() if f"PID {child.pid}" in ln]
    assert "\\x1b[2J" in line and "next\\nline" in line  # one line, its text still readable
