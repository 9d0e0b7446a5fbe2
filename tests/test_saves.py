"""The files a user asks gpumem_nb to write: ``--trace --save``, ``config --save``,
``history --csv``. Found by the closing attack on issue 16, each through IPython's real shell:

- a write-protected file was replaced (``os.replace`` needs only the directory's permission);
- a directory this process may not write into passed the check, so the cell ran and the
  save failed after it;
- a legal name of 242-255 bytes could never be saved (the temporary name added 14 bytes);
- ``-q`` hid a failed save;
- a ``kill -9`` during a save left its temporary file for good;
- a bare ``config --save`` after ``%reload_ext`` saved nothing while a changed value was in
  force;
- a file system without ``flock`` (ENOSYS, ENOLCK) refused every settings save.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError

from gpumem_nb import safeio
from gpumem_nb.kernel import current_monitor

from .helpers import run

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def loaded(loaded: Any) -> Any:
    """The conftest's, with ``os`` for the cells that change a file's permissions."""
    loaded.user_ns["os"] = os
    return loaded


def trace_save(ip: Any, path: Any, body: str = "ran = 1\nx = cuda.tensor(MiB)",
               flags: str = "") -> Any:
    return ip.run_cell_magic("gpumem", f"--trace {flags} --save {path}".replace("  ", " "),
                             body)


# ------------------------------------------------------------------------------------------
# D5: a write-protected file
# ------------------------------------------------------------------------------------------
def test_trace_save_refuses_a_write_protected_file_before_the_cell_runs(loaded, tmp_path):
    target = tmp_path / "protected.pickle"
    target.write_text("keep me")
    target.chmod(0o444)
    with pytest.raises(UsageError, match="write-protected"):
        trace_save(loaded, target)
    assert "ran" not in loaded.user_ns  # refused before the cell ran
    assert target.read_text() == "keep me" and (target.stat().st_mode & 0o777) == 0o444


def test_settings_and_csv_saves_refuse_a_write_protected_file(loaded, private_settings,
                                                             tmp_path):
    private_settings.write_text('{"peak": "reset"}')
    private_settings.chmod(0o444)
    with pytest.raises(UsageError, match=r"write-protected.*nothing was changed"):
        loaded.run_line_magic("gpumem", "config --threshold 1GB --save")
    assert private_settings.read_text() == '{"peak": "reset"}'
    csv = tmp_path / "h.csv"
    csv.write_text("mine")
    csv.chmod(0o444)
    with pytest.raises(UsageError, match="write-protected"):
        loaded.run_line_magic("gpumem", f"history --csv {csv}")
    assert csv.read_text() == "mine"


# ------------------------------------------------------------------------------------------
# D5 and D8 for an unprivileged user: a file it may not write, a directory it may not write
# into (root may write both, so these run as "nobody" when the suite runs as root)
# ------------------------------------------------------------------------------------------
UNPRIVILEGED = textwrap.dedent("""\
    import json, os, sys
    sys.path.insert(0, ROOT)
    from tests.fakes import FakeCuda, FakeCudaDevice, FakeGpu, FakePynvml, fake_torch, MiB
    gpu = FakeGpu("GPU-0")
    cuda = FakeCuda([FakeCudaDevice("0")], initialized=True)
    cuda.link([gpu])
    sys.modules["torch"] = fake_torch(cuda)
    from gpumem_nb.kernel import monitor as monitor_mod
    from gpumem_nb.sources.live import LiveSource
    from gpumem_nb.sources.nvml import NvmlSource
    monitor_mod.make_source = lambda: LiveSource(nvml=NvmlSource(module=FakePynvml([gpu])))
    from IPython.testing.globalipapp import start_ipython
    shell = start_ipython()
    shell.user_ns.update(cuda=cuda, MiB=MiB)
    shell.run_cell("%load_ext gpumem_nb")
    out = {}
    for name, target in (("ro_dir", os.path.join(BASE, "ro", "x.pickle")),
                         ("not_mine", os.path.join(BASE, "roots.pickle"))):
        shell.user_ns["ran"] = 0
        r = shell.run_cell(f"%%gpumem --trace --save {target}\\nran = 1\\nx = cuda.tensor(MiB)")
        out[name] = {"error": str(r.error_in_exec), "type": type(r.error_in_exec).__name__,
                     "ran": shell.user_ns["ran"]}
    out["roots_file"] = open(os.path.join(BASE, "roots.pickle"), "rb").read()[:20].decode("latin-1")
    print("RESULT" + json.dumps(out))
    """)


def _unprivileged() -> list[str] | None:
    if os.getuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"] if setpriv else None


def test_trace_save_refuses_a_file_or_directory_this_user_may_not_write_before_the_cell_runs():
    prefix = _unprivileged()
    if prefix is None:
        pytest.skip("running as root without setpriv: cannot act as an unprivileged user")
    base = tempfile.mkdtemp(prefix="gpumem-saves-")
    try:
        os.chmod(base, 0o777)
        os.mkdir(os.path.join(base, "ro"), 0o555)
        os.chmod(os.path.join(base, "ro"), 0o555)
        roots = os.path.join(base, "roots.pickle")
        with open(roots, "w") as f:
            f.write("root's")
        os.chmod(roots, 0o644)  # root's file in a directory everyone may write into
        script = os.path.join(base, "attempt.py")
        with open(script, "w") as f:
            f.write(f"ROOT = {str(ROOT)!r}\nBASE = {base!r}\n" + UNPRIVILEGED)
        env = {**os.environ, "GPUMEM_NB_CONFIG": os.path.join(base, "cfg.json"),
               "HOME": base, "IPYTHONDIR": os.path.join(base, ".ipython")}
        proc = subprocess.run([*prefix, sys.executable, script], env=env, cwd=base,
                              capture_output=True, text=True, timeout=120)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")]
        assert line, proc.stdout[-2000:] + proc.stderr[-2000:]
        out = json.loads(line[0][len("RESULT"):])
    finally:
        shutil.rmtree(base, ignore_errors=True)
    # Before: the read-only directory passed the check, the cell ran and the save failed
    # after it; root's file was replaced by the unprivileged user's.
    assert out["ro_dir"]["type"] == "UsageError" and out["ro_dir"]["ran"] == 0, out
    assert "may not write into" in out["ro_dir"]["error"]
    assert out["not_mine"]["type"] == "UsageError" and out["not_mine"]["ran"] == 0, out
    assert "write-protected" in out["not_mine"]["error"]
    assert out["roots_file"] == "root's"


# ------------------------------------------------------------------------------------------
# D6: names of 242-255 bytes
# ------------------------------------------------------------------------------------------
def test_a_254_byte_name_can_be_saved_by_every_save(loaded, tmp_path, private_settings):
    name = "n" * 250 + ".pkl"  # 254 bytes: legal (NAME_MAX is 255)
    trace_save(loaded, tmp_path / name)
    assert (tmp_path / name).read_bytes()[:2] == b"\x80\x04"
    csv = tmp_path / ("c" * 250 + ".csv")
    loaded.run_line_magic("gpumem", f"history --csv {csv}")
    assert csv.read_text().startswith("execution_count") or csv.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, csv.name])


def test_a_settings_file_with_a_long_name_can_still_be_locked_and_saved(loaded, tmp_path,
                                                                       monkeypatch):
    path = tmp_path / ("s" * 252 + ".js")  # 255 bytes; its name + ".lock" would not fit
    monkeypatch.setenv("GPUMEM_NB_CONFIG", str(path))
    loaded.run_line_magic("gpumem", "config --interval 2 --save")
    assert json.loads(path.read_text()) == {"interval_s": 2.0}


# ------------------------------------------------------------------------------------------
# D7: -q hides a failed save
# ------------------------------------------------------------------------------------------
def test_quiet_still_says_that_a_save_failed(loaded, tmp_path, capsys):
    target = tmp_path / "out.pickle"
    # The cell itself puts a directory where the (checked) file was to go: the save fails.
    trace_save(loaded, target, body=f"x = cuda.tensor(MiB)\nos.mkdir({str(target)!r})",
               flags="-q")
    out = capsys.readouterr()
    assert "Could not write" in out.err and "is a directory" in out.err, out
    assert out.out == ""  # -q: nothing else


# ------------------------------------------------------------------------------------------
# D12: a kill -9 during a save
# ------------------------------------------------------------------------------------------
KILLED_SAVE = textwrap.dedent("""\
    import os, sys, time
    sys.path.insert(0, ROOT)
    real = os.fsync
    def slow(fd):
        print("in fsync", flush=True)
        time.sleep(60)
        real(fd)
    os.fsync = slow
    from gpumem_nb.kernel import Monitor
    Monitor(shell=None).configure(threshold_bytes=7 * 2**20, save=True)
    """)


def test_a_save_killed_midway_leaves_a_temporary_file_the_next_save_removes(
        loaded, private_settings, tmp_path):
    private_settings.write_text('{"peak": "reset"}')
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "killed.py"
    script.write_text(f"ROOT = {str(ROOT)!r}\n" + KILLED_SAVE)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "GPUMEM_NB_CONFIG": str(private_settings)})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "in fsync"
    finally:
        proc.kill()
        proc.wait(10)
    folder = private_settings.parent
    left = [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert len(left) == 1  # what the killed save left
    legacy = folder / f".{private_settings.name}.ab_12xyz.tmp"  # an earlier version's name
    legacy.write_text("{")
    recent = folder / ".gpumem_nb-recent_1.tmp"  # a save going on now: kept
    recent.write_text("{")
    other = folder / ".notes.tmp"  # not ours: kept
    other.write_text("mine")
    old = time.time() - safeio.STALE_TEMP_S - 60
    for p in (*left, legacy, other):
        os.utime(p, (old, old))
    loaded.run_line_magic("gpumem", "config --interval 2 --save")
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted([private_settings.name, private_settings.name + ".lock",
                            recent.name, other.name, "bin"]), names
    assert json.loads(private_settings.read_text()) == {"peak": "reset", "interval_s": 2.0}


# ------------------------------------------------------------------------------------------
# D11: a bare save after %reload_ext
# ------------------------------------------------------------------------------------------
def test_a_bare_save_after_reload_ext_writes_the_value_this_session_set(shell, no_gpu,
                                                                       private_settings,
                                                                       capsys):
    run(shell, "%load_ext gpumem_nb")
    run(shell, "%gpumem config --threshold 1GB")
    run(shell, "%reload_ext gpumem_nb")
    capsys.readouterr()
    shell.run_line_magic("gpumem", "config --save")
    # Before: "saved nothing (no setting was changed in this session ...)" with 1 GB in force.
    assert json.loads(private_settings.read_text()) == {"threshold_bytes": 10**9}
    assert "saved threshold_bytes to" in capsys.readouterr().out
    m = current_monitor(shell)
    assert m is not None and m.session_keys == {"threshold_bytes"}


# ------------------------------------------------------------------------------------------
# D15: a file system without locks
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("code", [errno.ENOSYS, errno.ENOLCK])
def test_a_file_system_without_locks_saves_unlocked_with_a_note(shell, no_gpu, private_settings,
                                                               monkeypatch, capsys, code):
    run(shell, "%load_ext gpumem_nb")

    def no_flock(fd: int, op: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    capsys.readouterr()
    shell.run_line_magic("gpumem", "config --interval 2 --save")  # a UsageError before
    assert json.loads(private_settings.read_text()) == {"interval_s": 2.0}
    out = capsys.readouterr().out
    assert "saved interval_s to" in out
    assert "saved without a lock: this file system cannot lock files" in out
