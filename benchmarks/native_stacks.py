"""Native stacks of a process that waits in C, where the GPU machine has no gdb: the target
loads ``native/backtrace_on_signal.c`` (``arm_source``), and ``dump`` sends that signal to each
of its threads and reads what they wrote, beside each thread's state, CPU time and wait
channel from /proc (a thread on a lock is asleep with a flat CPU time; a busy loop is not), and
``py-spy dump --native`` where it is installed and allowed to attach.

    from native_stacks import arm_source, dump
"""

from __future__ import annotations

import ctypes
import shutil
import signal
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "benchmarks" / "native" / "backtrace_on_signal.c"
SIGNO = int(signal.SIGUSR2)
SYS_TGKILL = 234  # x86_64


def library() -> Path | None:
    """The handler's shared library: carried in .whl (built on the development machine), or
    built here when a compiler is present."""
    carried = ROOT / ".whl" / "libbacktrace_on_signal.so"
    if carried.exists():
        return carried
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    built = Path("/tmp/libbacktrace_on_signal.so")
    r = subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(built), str(SOURCE)],
                       capture_output=True, text=True)
    return built if r.returncode == 0 else None


def arm_source(stacks_path: Path) -> str:
    """Python source for the target to run first: installs the handler, and lets any process
    of this user trace it (py-spy) where Yama limits tracing to ancestors."""
    lib = library()
    return (
        "import ctypes as _c\n"
        "try:\n"
        "    _c.CDLL(None).prctl(0x59616d61, _c.c_ulong(2**64 - 1), 0, 0, 0)\n"
        "except Exception as _e:\n"
        "    print('prctl failed', _e)\n"
        + (f"_bt = _c.CDLL({str(lib)!r}); _bt.install({str(stacks_path).encode()!r}, {SIGNO})\n"
           if lib is not None else "print('no backtrace library')\n")
    )


def _read(p: Path) -> str:
    try:
        return p.read_text(errors="replace").strip()
    except OSError as e:
        return f"({type(e).__name__})"


def tasks(pid: int) -> list[str]:
    rows = []
    for task in sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda p: int(p.name)):
        stat = _read(task / "stat")
        # comm may hold spaces: the fields after its closing parenthesis are fixed.
        head, _, rest = stat.rpartition(") ")
        fields = rest.split()
        comm = head.partition(" (")[2]
        state = fields[0] if fields else "?"
        utime = fields[11] if len(fields) > 12 else "?"
        stime = fields[12] if len(fields) > 12 else "?"
        rows.append(f"tid {task.name} {comm!r} state {state} utime {utime} stime {stime} "
                    f"wchan {_read(task / 'wchan')!r} syscall {_read(task / 'syscall')[:60]!r}")
    return rows


def dump(pid: int, out: Path, stacks_path: Path | None = None) -> str:
    """Everything that can be read of ``pid``'s threads, written to ``out``; returns its path."""
    lines = [f"=== pid {pid} at {time.strftime('%H:%M:%S')}", *tasks(pid)]
    time.sleep(2.0)
    lines += ["=== 2 s later (CPU ticks move only for a thread that runs)", *tasks(pid)]
    if stacks_path is not None:
        libc = ctypes.CDLL(None, use_errno=True)
        for task in Path(f"/proc/{pid}/task").iterdir():
            libc.syscall(SYS_TGKILL, pid, int(task.name), SIGNO)
            time.sleep(0.1)
        time.sleep(1.0)
        lines += ["=== backtrace_on_signal", _read(stacks_path)]
    spy = shutil.which("py-spy")
    if spy is not None:
        try:
            r = subprocess.run([spy, "dump", "--native", "--pid", str(pid)],
                               capture_output=True, text=True, timeout=90)
            lines += ["=== py-spy dump --native", r.stdout, r.stderr]
        except Exception as e:
            lines += [f"=== py-spy failed: {e}"]
    else:
        lines.append("=== no py-spy")
    out.write_text("\n".join(lines) + "\n")
    return str(out)
