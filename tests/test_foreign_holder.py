"""The stand-in for another user's job (benchmarks/foreign.py) is what the GPU tests need it
to be: a process that is no descendant of the kernel, unlike one the kernel starts itself."""

from __future__ import annotations

import os
import subprocess
import sys

from benchmarks.foreign import ForeignHolder, _alive
from gpumem_nb.sources.processes import ProcessTree


def test_a_process_the_kernel_starts_is_its_child_and_the_foreign_holder_is_not():
    tree = ProcessTree()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        assert tree.is_descendant(child.pid)  # what issue 19 names "this kernel's child"
        with ForeignHolder(0, device="cpu", timeout_s=20) as pid:
            assert _alive(pid) and pid != child.pid
            assert not ProcessTree().is_descendant(pid)
            assert os.getsid(pid) == pid  # a session of its own
        assert not _alive(pid)  # stopped: gone or a zombie
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(20)
