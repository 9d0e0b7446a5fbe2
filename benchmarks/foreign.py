"""A process that holds GPU memory and is no descendant of the caller: another user's job on
the same GPU, as the OOM explainer's "other processes" cause means it.

A process the kernel starts with ``subprocess.Popen`` is the kernel's child, and gpumem_nb
rightly names it so (issue 19). To stand for a stranger, the holder is started by a launcher
that exits at once: the holder, in a session of its own, is reparented to init (or the nearest
subreaper, an ancestor of the caller, never the caller), so no walk up its parents meets the
caller. Its stdin and stdout stay pipes to the caller (inherited through the launcher):
"ready" comes on stdout once it holds its memory, and closing stdin ends it, also when the
caller dies.
"""

from __future__ import annotations

import subprocess
import sys
import time

# The holder: ``nbytes`` on the GPU (nothing at all when ``device`` is "cpu", for dry runs),
# then wait for stdin to close.
HOLD = ("import sys; n, dev = int(sys.argv[1]), sys.argv[2]; "
        "t = __import__('torch') if dev != 'cpu' else None; "
        "x = t.empty(n, dtype=t.uint8, device=dev) if t else None; "
        "t and t.cuda.synchronize(); print('ready', flush=True); sys.stdin.read()")
LAUNCH = ("import subprocess, sys\n"
          "p = subprocess.Popen([sys.executable, '-c', sys.argv[1], *sys.argv[2:]], "
          "start_new_session=True)\n"
          "print(p.pid, flush=True)\n")


class ForeignHolder:
    """``with ForeignHolder(60 * 2**30) as pid:`` a stranger process holding 60 GiB."""

    def __init__(self, nbytes: int, device: str = "cuda", timeout_s: float = 60.0) -> None:
        self.nbytes, self.device, self.timeout_s = nbytes, device, timeout_s
        self.pid: int | None = None
        self._launcher: subprocess.Popen[str] | None = None

    def start(self) -> int:
        self._launcher = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, HOLD, str(self.nbytes), self.device],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._launcher.stdout is not None
        self.pid = int(self._launcher.stdout.readline())
        self._launcher.wait(self.timeout_s)  # from here on the holder has another parent
        line = self._launcher.stdout.readline().strip()  # the holder's, through the same pipe
        if line != "ready":
            self.stop()
            raise RuntimeError(f"the foreign holder did not get ready: {line!r}")
        return self.pid

    def stop(self) -> None:
        """Close its stdin and wait until it has exited (gone, or a zombie its new parent has
        not reaped): by then its CUDA context, and every byte it held, is released."""
        launcher, pid = self._launcher, self.pid
        if launcher is None:
            return
        self._launcher = None
        if launcher.stdin is not None:
            launcher.stdin.close()
        deadline = time.monotonic() + self.timeout_s
        while pid is not None and time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        if launcher.stdout is not None:
            launcher.stdout.close()

    def __enter__(self) -> int:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2:][:1] not in (b"Z", b"X")
